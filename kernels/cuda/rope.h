#pragma once
// RoPE on the GPU: the per-head q/k norm and rotation of the forward (kernels/cuda/rope.cu), with the
// angles of the CPU's rope_theta (kernels/cpu/ops.h): the angle in double, its cos/sin rounded to float.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// One layer's rotation (engine/cpu/layer_rope.h has the same fields for the CPU).
struct RopeParams {
    bool neox = false;                    // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    int32_t n_rot = 0;                    // rotated dims per head; dims n_rot.. pass through
    float base = 10000.0f;
    float freq_scale = 1.0f;
    const float* freq_factors = nullptr;  // device (n_rot/2) or null: angle i divided by factor i
    // YaRN (the CPU's RopeYarn, kernels/cpu/ops.h): ext_factor 0 is off; pair i's angle multiplier mixes
    // freq_scale with 1 by a ramp over the pairs [yarn_corr_low, yarn_corr_high]; cos/sin times mscale.
    float yarn_ext_factor = 0.0f;
    float yarn_corr_low = 0.0f, yarn_corr_high = 0.0f;
    float mscale = 1.0f;
    // The attention temperature of q (ModelConfig::attn_temperature, mistral3): after the rotation every q
    // value at position p is multiplied by 1 + q_temp_scale * ln(floor(p / q_temp_floor) + 1). 0: off.
    float q_temp_scale = 0.0f;
    int32_t q_temp_floor = 0;
};

// For token i at position pos0 + i: each of q's n_heads heads (rows of n_heads * head_dim) and k's
// n_kv_heads heads (rows of n_kv_heads * head_dim) gets an RMSNorm by q_norm / k_norm (head_dim each)
// when those are not null, then RoPE. In place. With pos0_device set, the kernel reads the position of
// token 0 from there instead of pos0 (device memory: a decode step captured once as a CUDA graph and
// replayed at later positions).
void qk_norm_rope(float* q, float* k, int64_t n, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                  const float* q_norm, const float* k_norm, float eps, const RopeParams& rope, int32_t pos0,
                  cudaStream_t stream, const int32_t* pos0_device = nullptr);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
