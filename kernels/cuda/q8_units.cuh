#pragma once
// One 32-element block of an activation column written in the q8 unit layout (kernels/cuda/matmul_q8.h) by
// the 8 lanes that hold it, 4 consecutive elements each: shared by quantize_activations (matmul_q8.cu) and
// the rmsnorm that quantizes its own output (elementwise.cu), so both give the same bytes.
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/unroll.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace q8_units {

inline constexpr int kLanesPerBlock = 8;   // lanes that hold one 32-element block

// Lane t (0..7, the lane's index within its aligned group of 8 in the warp) holds elements 4t .. 4t + 3 of
// block b of the column that starts at `col` (n_in elements: codes, then the units' scales and sums); piece
// p = t / 2 (elements 8p .. 8p + 7) is the first (p < 2) or last half of unit p % 2. All 8 lanes of the
// group call it together.
__device__ __forceinline__ void write_block(float4 v, int t, int b, int n_in, uint8_t* col) {
    const unsigned group = 0xFFu << (threadIdx.x % 32 & 24u);
    // amax = max |x| of the block, in any order (max is exact); fmaxf ignores NaN as the CPU's fmax does.
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    TERN_UNROLL
    for (int offset = 1; offset < kLanesPerBlock; offset *= 2)
        amax = fmaxf(amax, __shfl_xor_sync(group, amax, offset));
    // As quantize_act_q8_0_scalar: d = amax / 127 kept as an f16, codes from id = 127 / amax (not 1 / d),
    // rounded half to even, clamped as the CPU's packs would (never reached: |x * id| <= 127 + 2 ulp).
    const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    const float xs[4] = {v.x, v.y, v.z, v.w};
    uint32_t word = 0;
    int sum = 0;
    TERN_UNROLL
    for (int i = 0; i < 4; ++i) {
        const int q = min(127, max(-128, __float2int_rn(__fmul_rn(xs[i], id))));
        word |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * i);
        sum += q;
    }
    sum += __shfl_xor_sync(group, sum, 1);                       // piece t / 2
    const int last_half_sum = __shfl_xor_sync(group, sum, 4);    // piece t / 2 + 2, the same unit's last half
    const int p = t / 2;
    *reinterpret_cast<uint32_t*>(col + 32 * b + 16 * (p % 2) + 8 * (p / 2) + 4 * (t % 2)) = word;
    if (t == 0 || t == 2) {   // the first half of unit t / 2: write the unit's scale and sums
        const uint32_t sums = (static_cast<uint32_t>(sum) & 0xFFFFu) | (static_cast<uint32_t>(last_half_sum) << 16);
        *reinterpret_cast<uint2*>(col + n_in + 8 * (2 * b + t / 2)) = make_uint2(__float_as_uint(d), sums);
    }
}

} // namespace q8_units
} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
