#pragma once
// The gated FFN activations and the soft cap on the GPU, operation for operation the CPU's
// (kernels/cpu/silu.h, kernels/cpu/ops.cpp). Every step is an explicitly rounded intrinsic (__fmul_rn, ...)
// so nvcc cannot fuse a multiply and an add into one FMA where the CPU rounds twice.
//   silu: tern's exp_f32 (kernels/cpu/silu.h: clamp, Cody-Waite reduction, degree-7 Taylor polynomial by
//         FMAs, 2^n through the exponent bits), so SwiGLU gives the CPU's bits on the device too.
//   gelu_tanh / softcap: tanhf, the one step that differs: the device's tanhf is within 2 ulp of tanh and
//         the CPU's libm is correctly rounded or nearly, so these agree to a few ulp, not bit for bit.
//   swiglu_oai (gpt-oss's clamped SwiGLU): the CPU's swiglu_oai_f32 (kernels/cpu/ops.cpp) calls std::exp, so the
//         device's expf is that step's difference: a few ulp, not bit for bit.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace activation_detail {
// kernels/cpu/silu.h silu_detail, which kernels/cuda may not include; tests/cuda/test_cuda_elementwise.cpp holds
// the two to the same bits.
inline constexpr float kExpHi = 88.0f, kExpLo = -87.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kSqrt2OverPi = 0.79788456080286535588f, kGeluCoef = 0.044715f;
// gpt-oss's clamped SwiGLU: the engine's constants (engine/cpu/backend_cpu.cpp passes the same to the CPU's).
inline constexpr float kOaiAlpha = 1.702f, kOaiLimit = 7.0f;
} // namespace activation_detail

// kernels/cpu/silu.cpp exp_f32, step for step.
__device__ __forceinline__ float exp_f32(float x) {
    using namespace activation_detail;
    x = x < kExpHi ? x : kExpHi; // a NaN takes the bound, as in the CPU's operand order
    x = x > kExpLo ? x : kExpLo;
    const float n = rintf(__fmul_rn(x, kLog2e)); // round half to even, as nearbyint in the default mode
    float r = fmaf(n, -kLn2Hi, x);
    r = fmaf(n, -kLn2Lo, r);
    constexpr float c[8] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    float p = c[0];
    for (int i = 1; i < 8; ++i) p = fmaf(p, r, c[i]);
    return __fmul_rn(p, __int_as_float((static_cast<int32_t>(n) + 127) << 23));
}

__device__ __forceinline__ float silu_f32(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, exp_f32(-x)));
}

// 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), grouped as the CPU's expression is.
__device__ __forceinline__ float gelu_tanh_f32(float x) {
    using namespace activation_detail;
    const float inner = __fadd_rn(1.0f, __fmul_rn(__fmul_rn(kGeluCoef, x), x));
    const float t = tanhf(__fmul_rn(__fmul_rn(kSqrt2OverPi, x), inner));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, t));
}

// The gated FFN products act(gate) * up, one rounding after the activation: elementwise.cu's swiglu /
// geglu_tanh and the matmuls' GLU epilogue (matmul_epilogue.cuh) both call these, so the fused and the
// separate forms give the same bits.
__device__ __forceinline__ float swiglu_f32(float gate, float up) {
    return __fmul_rn(silu_f32(gate), up);
}
__device__ __forceinline__ float geglu_tanh_f32(float gate, float up) {
    return __fmul_rn(gelu_tanh_f32(gate), up);
}

// min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1), grouped as the CPU's expression is; the clamps
// are the CPU's comparisons (std::min / std::clamp), which keep a NaN where fminf would drop it.
__device__ __forceinline__ float swiglu_oai_f32(float gate, float up) {
    using namespace activation_detail;
    const float g = kOaiLimit < gate ? kOaiLimit : gate;
    const float u = up < -kOaiLimit ? -kOaiLimit : (kOaiLimit < up ? kOaiLimit : up);
    const float sig = __fdiv_rn(g, __fadd_rn(1.0f, expf(__fmul_rn(-kOaiAlpha, g))));
    return __fmul_rn(sig, __fadd_rn(u, 1.0f));
}

__device__ __forceinline__ float softcap_f32(float x, float cap) {
    return __fmul_rn(cap, tanhf(__fdiv_rn(x, cap)));
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
