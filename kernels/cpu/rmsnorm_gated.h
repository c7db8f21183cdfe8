#pragma once
// The gated RMSNorm at the end of a Gated DeltaNet layer (gated_delta.h, step 6): each head of the rule's output
// normalised by RMSNorm with one weight shared by the heads, then multiplied by silu of the gate z:
//   y[h][i] = rmsnorm_f32(o_h; w)[i] * silu_f32(z[h][i])   for h < n_heads, i < d
// w: GGUF blk.N.ssm_norm.weight (ne {d_v}). o, z, y: n_heads heads of d floats contiguous (y may equal o).
// The same IEEE steps as rmsnorm_f32 then swiglu's twin (kernels/cpu/ops.h, silu.h), so the CUDA composition
// rmsnorm_rows + swiglu (kernels/cuda/elementwise.h) computes the same floats.
#include <cstdint>

namespace tern {

void rmsnorm_gated_f32(const float* o, const float* z, const float* w, float* y, int64_t n_heads, int64_t d,
                       float eps);

} // namespace tern
