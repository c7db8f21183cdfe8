#pragma once
// SiLU for the gated FFN (SwiGLU), with tern's own exp so that a SIMD kernel and its scalar twin give
// the same bits: std::exp is a library call per element (decode spent ~44 us per 8192-wide layer in it
// on the 2-core Xeon) and no vector exp is bit-identical to it.
//
// exp_f32(x): x clamped to [-87, 88] (so 2^n stays a normal float; NaN becomes 88, and the caller's
// x keeps the NaN), n = nearbyint(x * log2 e), r = x - n ln2 in two fused steps (Cody-Waite), exp(r)
// by its degree-7 Taylor polynomial in Horner form with fused multiply-adds (|r| <= 0.35: truncation
// error under 1e-8 relative), times 2^n built in the exponent bits. Within 2 ulp of exp over the range.
// silu_f32(x) = x / (1 + exp_f32(-x)). Every step is one IEEE operation, in this order, in the twins.
#include <cstdint>

#include "kernels/cpu/dispatch.h"

namespace tern {

float exp_f32(float x);

// y[i] = silu(gate[i]) * up[i] for i < n: the scalar twin. A set's kernel is CpuKernels::swiglu (SwigluFn,
// dispatch.h): the AVX2 one of silu_avx2.cpp in the x86 SIMD sets, this twin in the others. Both give the same
// bits for every element, whatever n.
void swiglu_rows_scalar(const float* gate, const float* up, float* y, int64_t n);

namespace silu_detail {
inline constexpr float kHi = 88.0f, kLo = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;   // ln 2 = hi + lo, hi exact in 9 bits
inline constexpr float kC[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
} // namespace silu_detail

} // namespace tern
