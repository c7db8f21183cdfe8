#pragma once
// The end of a warp-per-row matmul (kernels/cuda/matmul.cu, matmul_q8.cu): every lane holds partial sums of
// up to 8 columns for the warp's output row; they are summed over the warp and each column's total handed to
// one lane (reduce_columns), which adds the row's bias and stores it, adds it to the residual stream or
// combines it with the up projection's (matmul_epilogue.cuh finish_columns).
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/unroll.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// One lane's share of a warp's column sums (reduce_columns): column `col`'s total over the warp, and whether
// this lane is the one that writes it (one lane per column; lanes of padding columns past NC write nothing).
struct ColumnSum {
    float sum;
    int col;
    bool writer;
};

// Sums acc[c] over the warp and hands each column's total to its lanes. The columns are padded to P (a power
// of two); at each of the log2(P) first steps a lane keeps half of its columns (the upper half when its bit
// `offset` is set), adds its partner's partial sums of that half and sends the other half, so after them
// lane l holds one column, l >> (5 - log2 P), summed over 2^log2(P) lanes; the remaining 5 - log2(P) steps
// are a plain butterfly (9 shuffles for 8 columns instead of 40). Every lane of the warp must call it.
template <int NC> __device__ __forceinline__ ColumnSum reduce_columns(const float (&acc)[NC], int lane) {
    constexpr unsigned kFullMask = 0xFFFFFFFFu;
    constexpr int kLog2P = NC == 1 ? 0 : NC == 2 ? 1 : NC <= 4 ? 2 : 3;
    constexpr int P = 1 << kLog2P;
    static_assert(NC >= 1 && NC <= 8, "one to eight columns");
    float v[P];
    TERN_UNROLL
    for (int i = 0; i < P; ++i) v[i] = i < NC ? acc[i] : 0.0f;
    TERN_UNROLL
    for (int s = 0; s < kLog2P; ++s) {
        const int half = P >> (s + 1), offset = 16 >> s;
        const bool upper = (lane & offset) != 0;
        TERN_UNROLL
        for (int i = 0; i < half; ++i) {
            const float send = upper ? v[i] : v[i + half];
            const float keep = upper ? v[i + half] : v[i];
            v[i] = keep + __shfl_xor_sync(kFullMask, send, offset);
        }
    }
    TERN_UNROLL
    for (int offset = 16 >> kLog2P; offset > 0; offset /= 2) v[0] += __shfl_xor_sync(kFullMask, v[0], offset);
    const int col = lane >> (5 - kLog2P);
    return {v[0], col, (lane & ((32 >> kLog2P) - 1)) == 0 && col < NC};
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
