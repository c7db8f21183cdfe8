// NEON + dotprod kernel set, built only for aarch64 (-march=armv8.2-a+dotprod, kernels/CMakeLists.txt).
// Covers the formats whose blocks map straight onto sdot: Q4_0, Q8_0, IQ4_NL (x Q8_0) and F32; the rest of
// the table keeps the scalar twins (dispatch.cpp fills those first).
#include "kernels/cpu/dispatch.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include "quant/blocks.h"

namespace tern {
namespace {

inline float f16n(uint16_t h) { return f16_to_f32(h); }

// 32 nibbles of a Q4_0-style block as two int8x16: elements 0-15 (low nibbles) and 16-31 (high ones).
inline void nibbles32(const uint8_t* qs, uint8x16_t& lo, uint8x16_t& hi) {
    const uint8x16_t v = vld1q_u8(qs);
    lo = vandq_u8(v, vdupq_n_u8(0x0F));
    hi = vshrq_n_u8(v, 4);
}

float vec_dot_q4_0_q8_0_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK4_0; ++b) {
        uint8x16_t lo, hi;
        nibbles32(wb[b].qs, lo, hi);
        const int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(lo), vdupq_n_s8(8));
        const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(hi), vdupq_n_s8(8));
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(xb[b].qs));
        s = vdotq_s32(s, q1, vld1q_s8(xb[b].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(s), f16n(wb[b].d) * f16n(xb[b].d));
    }
    return vaddvq_f32(acc);
}

float vec_dot_q8_0_q8_0_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ8_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), vld1q_s8(wb[b].qs), vld1q_s8(xb[b].qs));
        s = vdotq_s32(s, vld1q_s8(wb[b].qs + 16), vld1q_s8(xb[b].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(s), f16n(wb[b].d) * f16n(xb[b].d));
    }
    return vaddvq_f32(acc);
}

float vec_dot_iq4_nl_q8_0_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockIQ4_NL*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const int8x16_t table = vld1q_s8(kIq4Values);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK4_NL; ++b) {
        uint8x16_t lo, hi;
        nibbles32(wb[b].qs, lo, hi);
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), vqtbl1q_s8(table, lo), vld1q_s8(xb[b].qs));
        s = vdotq_s32(s, vqtbl1q_s8(table, hi), vld1q_s8(xb[b].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(s), f16n(wb[b].d) * f16n(xb[b].d));
    }
    return vaddvq_f32(acc);
}

float vec_dot_f32_f32_neon(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const float*>(w);
    const auto* b = static_cast<const float*>(x);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; ++k) acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + i + 4 * k), vld1q_f32(b + i + 4 * k));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; ++i) s += a[i] * b[i];
    return s;
}

} // namespace

void fill_cpu_kernels_neon(CpuKernels& k) {
    k.q4_0 = vec_dot_q4_0_q8_0_neon;
    k.q8_0 = vec_dot_q8_0_q8_0_neon;
    k.iq4_nl = vec_dot_iq4_nl_q8_0_neon;
    k.f32 = vec_dot_f32_f32_neon;
}

} // namespace tern
#endif
