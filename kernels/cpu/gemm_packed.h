#pragma once
// y = W x for weights in a row-interleaved packed layout (quant/repack.h: Q4_0x16, Q8_0x16, Q4_Kx16) and
// Q8_0 / Q8_K activations: the CPU's decode matvec and prefill GEMM in one kernel family.
//
// One microkernel computes a tile of 16 rows (one packed group) x C columns, C = 1..kTileCols. Output
// (row r, column c) is, for any C, any tiling and any thread count, exactly
//     acc = 0;  for each block b in order:  isum = sum_i u_i * a_i - off * sum_i a_i      (exact integers)
//                                           acc  = fma(f32(d_w) * f32(d_x), float(isum), acc)
// with u the unsigned packed code (Q4_0: the nibble, off 8; Q8_0: code + 128, off 128). Q4_K (Q8_K
// activations) is the same idea per super-block: integer sub-block sums times the 6-bit scales, the mins
// times the activation sub-block sums, then two fused multiply-adds (see packed_tile_q4_k_scalar). Each column's
// arithmetic in the tile is the same instruction sequence whatever the other columns are, so decode
// (1 column) and draft verification / prefill (many) give bit-identical results per token: speculative
// decoding relies on that. The scalar twin (packed_tile_scalar) computes the same formula with std::fma
// and is bit-identical to the SIMD kernel, which the tests check.
//
// Loop nest (matmul_packed): column chunks sized so their activations stay in L2; inside a chunk the
// threads split the groups, and each group (16 rows, e.g. 18 KiB of Q4_0 at n_in = 2048) stays in L1
// while the chunk's columns pass over it kTileCols at a time. Decode is the same nest with one column:
// the weights stream through once, 16 rows per step, with no horizontal sums; where the ISA has a decode
// kernel (PackedDecodeFn) a thread takes kDecodeGroups groups at a time and reads them side by side.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/matmul_quant.h"
#include "quant/types.h"

namespace tern {

inline constexpr int kTileCols = 4;

// A packed matrix: packed_bytes(type, n_out, n_in) bytes at data (quant/repack.h).
struct PackedMatrixView {
    GgmlType type = GgmlType::Q4_0;
    const void* data = nullptr;
    int64_t n_in = 0;
    int64_t n_out = 0;
};

// One tile: nb blocks (Q4_K: super-blocks) of one group at `group`; column c's activation blocks at
// x + c * x_stride and its per-block activation words (Q4_0/Q8_0: 2, -off * sum of the block's codes and
// the block's scale as f32 bits; Q4_K: 4 of sub-block sums; Q6_K: 16, -32 * each sub-block's sum; see
// gemm_packed.cpp) at corr + c * corr_stride; out[c * 16 + r] for c < n_cols. The signature is PackedTileFn
// (dispatch.h); the set's tiles are CpuKernels::packed(t).tile.

// A PackedTileFn over a tile template: Tile<C>::run(nb, group, x, x_stride, corr, corr_stride, out) for
// C = n_cols = 1..kTileCols. One instantiation per count keeps each column's instruction sequence the same at
// every count. For the per-ISA files: static, so that each file's copy (built with that file's ISA flags) keeps
// internal linkage; gcc emits an instantiation over a file's anonymous-namespace Tile as a weak symbol of the same
// name in every file, and the linker would keep one file's code for all.
template <template <int> class Tile>
static void packed_tile_any_cols(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
                          size_t corr_stride, int n_cols, float* out) {
    static_assert(kTileCols == 4, "handles 1..4 columns");
    switch (n_cols) {
    case 1: Tile<1>::run(nb, group, x, x_stride, corr, corr_stride, out); break;
    case 2: Tile<2>::run(nb, group, x, x_stride, corr, corr_stride, out); break;
    case 3: Tile<3>::run(nb, group, x, x_stride, corr, corr_stride, out); break;
    default: Tile<4>::run(nb, group, x, x_stride, corr, corr_stride, out); break;
    }
}

// Decode (one column) of n_groups consecutive groups, 1 <= n_groups <= kDecodeGroups, the first at `first`, each
// group_bytes long: out[16 g + r] is exactly what the tile gives for group g (same x and corr as a 1-column
// tile). A thread that reads several groups side by side keeps several memory streams going at once. The
// signature is PackedDecodeFn (dispatch.h); the set's decode kernel is CpuKernels::packed(t).decode (nullptr where
// it has none: then decode takes the tile one group at a time).
inline constexpr int kDecodeGroups = 4;

// The scalar twin of the tiles (any CPU): what matmul_packed runs for a set without a tile of its own (tests).
void packed_tile_scalar(GgmlType t, int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride,
                        const int32_t* corr, size_t corr_stride, int n_cols, float* out);

// The per-block activation words of x's columns that the tiles and decode kernels take as corr (see
// PackedTileFn), x.n_cols * corr_stride of them: column c's at c * corr_stride.
void packed_act_words(GgmlType t, const QuantizedActs& x, std::vector<int32_t>& words);

// Whether weights of format t (rows of n_in) are worth packing for the set k: k has a tile for t.
bool packing_pays(GgmlType t, int64_t n_in, const CpuKernels& k);

// y (n_cols, n_out) = W x with x in act_format_for(w.type). kernels: nullptr = cpu_kernels();
// a set without a packed kernel runs the scalar twin (tests). Throws std::invalid_argument on shape errors.
void matmul_packed(const PackedMatrixView& w, const QuantizedActs& x, float* y, int n_threads,
                   const CpuKernels* kernels = nullptr);

} // namespace tern
