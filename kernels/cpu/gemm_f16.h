#pragma once
// y = W x for F16 / BF16 weights in the panel layout (quant/repack_f16.h) and activations rounded to the
// weight's 16-bit type (kernels/cpu/quantize_act.h: ggml pairs F16 x f16 and BF16 x bf16): the CPU's decode
// matvec and prefill GEMM for 16-bit weights in one kernel family.
//
// Arithmetic contract. Output (row r, column c) is, for any number of columns, any tiling and any thread
// count, exactly
//     acc = +0.0f;  for k = 0 .. n_in - 1:  acc = fma(f32(w[r][k]), f32(x[c][k]), acc)
// one f32 chain in k order. The product of two f16 (11 + 11 significant bits) or two bf16 (8 + 8) values is
// exact in f32, so each step is the correctly rounded acc + w * x and the scalar twin (std::fma) is
// bit-identical to the SIMD kernel. Decode (1 column), draft verification and prefill (many) therefore give
// bit-identical rows per token: speculative decoding and the prompt cache rely on that (the tests check it).
// One chain per output instead of the dot kernels' 32 partial sums: the tile's parallelism comes from its
// 16-row lanes and its columns instead, and the rounding error (~sqrt(n_in) ulp) stays far below the f16
// rounding of the activations.
//
// Loop nest (matmul_f16_panels): column chunks (4 MiB of f32 activations); inside a chunk the threads take
// tiles of kF16TileRows rows, one contiguous slice each (stealing_split.h). Few columns (decode): the tile's panels stream from memory
// once, converted on the fly. Many (prefill): a block of k of the panels is converted to f32 once into an L1
// buffer and reused by every column of the chunk: AVX-512 (gemm_f16_avx512.cpp) 32 rows x 8 columns of
// accumulators at a time, AVX2 + F16C (gemm_f16_avx2.cpp) 16 rows x 6 columns.
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/matmul_quant.h"
#include "quant/repack_f16.h"
#include "quant/types.h"

namespace tern {

// Rows per tile handed to a thread: 4 panels.
inline constexpr int kF16TileRows = 4 * kF16PanelRows;
// Columns per activation group: the f32 activations are interleaved 8 columns wide, element (c, k) of a
// group at 8 * k + c, so a register tile's broadcasts for one k read one 32-byte run instead of 8 lines
// n_in * 4 bytes apart (which would all fall in the same L1 set for n_in a multiple of 1024).
inline constexpr int kF16ColGroup = 8;

// A panel copy: panel16_bytes(n_out, n_in) bytes at data, in format type (F16 or BF16).
struct Panel16MatrixView {
    GgmlType type = GgmlType::F16;
    const void* data = nullptr;
    int64_t n_in = 0;
    int64_t n_out = 0;
};

// One tile: n_panels (1..4) consecutive panels at `panels` (16 * n_in words each) against n_cols f32
// columns (each value exactly a 16-bit activation) in groups of 8: column c, element k at
// x[(c / 8) * 8 * n_in + 8 * k + c % 8]; out[c * kF16TileRows + r] for r < 16 * n_panels, c < n_cols.
// The signature is F16TileFn (dispatch.h); the set's tile is CpuKernels::panel_tile(t) (nullptr when its ISA has
// none: then the caller keeps the plain layout and matmul_q).

// The scalar twin of the tile (any CPU): what matmul_f16_panels runs for a set without a tile of its own (tests).
void f16_tile_scalar(GgmlType t, int64_t n_in, const uint16_t* panels, int n_panels, const float* x, int64_t n_cols,
                     float* out);
// dst[i] = the f32 value of the 16-bit value src[i] of format t (exact), i < n: the scalar twin of the set's
// CpuKernels::widen16.
void widen16_scalar(GgmlType t, const uint16_t* src, float* dst, int64_t n);

// Whether weights of format t (rows of n_in) are worth a panel copy for the set k: k has a tile for t.
bool panel16_pays(GgmlType t, int64_t n_in, const CpuKernels& k);

// y (n_cols, n_out) = W x with x in act_format_for(w.type) (f16 or bf16). kernels: nullptr = cpu_kernels();
// a set without a SIMD tile runs the scalar twin (tests). Throws std::invalid_argument on shape errors.
void matmul_f16_panels(const Panel16MatrixView& w, const QuantizedActs& x, float* y, int n_threads,
                       const CpuKernels* kernels = nullptr);

} // namespace tern
