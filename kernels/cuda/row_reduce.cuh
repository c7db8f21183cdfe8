#pragma once
// Warp and block reductions for kernels that reduce a row with one warp or one block (norms, argmax).
// Every lane of a warp / every thread of a block gets the same result, combined in the same order, so
// the result does not depend on which thread asks.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

struct SumOp {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a > b ? a : b; }
};

// The op over the 32 lanes of a full warp (butterfly: every lane ends with the same value).
template <typename T, typename Op> __device__ __forceinline__ T warp_reduce(T v, Op op) {
    for (int offset = 16; offset > 0; offset /= 2) v = op(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}

// The op over every thread of the block (blockDim.x a multiple of 32, all threads calling). `scratch` is
// 32 T of shared memory; the call ends with one __syncthreads and then reads it, so a second reduction
// on the same scratch needs a __syncthreads before it.
template <typename T, typename Op> __device__ __forceinline__ T block_reduce(T v, Op op, T* scratch) {
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    v = warp_reduce(v, op);
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    // Every thread folds the warps' partials itself (broadcast reads): no second barrier to hand out a result.
    T r = scratch[0];
    for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r = op(r, scratch[w]);
    return r;
}

// Argmax as a max over 64-bit keys: the value's bits made monotonic in the high half, the complemented
// index in the low half, so the largest key is the largest value at its lowest index. -0.0 becomes +0.0
// first (they compare equal, so the lower index must win between them too). No key is 0: the lowest
// value key is that of -inf, 0x007FFFFF in the high half (NaN-free input).
__device__ __forceinline__ uint64_t argmax_key(float v, uint32_t index) {
    const uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
    const uint32_t ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return (static_cast<uint64_t>(ordered) << 32) | static_cast<uint64_t>(~index);
}
__device__ __forceinline__ int32_t argmax_key_index(uint64_t key) {
    return static_cast<int32_t>(~static_cast<uint32_t>(key));
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
