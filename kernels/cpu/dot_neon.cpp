// NEON + dotprod kernel set, built only for aarch64 (-march=armv8.2-a+dotprod, kernels/CMakeLists.txt).
// Covers Q4_0, Q8_0, IQ4_NL (x Q8_0), Q4_K, Q6_K (x Q8_K), F16 and F32; the rest of the table keeps the
// scalar twins (dispatch.cpp fills those first). Tested under qemu-aarch64 (see the report of issue #5).
#include <cstring>
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

inline int sdot32(int8x16_t q0, int8x16_t q1, const int8_t* a) {
    return vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(a)), q1, vld1q_s8(a + 16)));
}

float vec_dot_q4_k_q8_k_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ4_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; ++j) q4_k_scale_min(B.scales, j, sc[j], mn[j]);
        int mins = 0, isum = 0;
        for (int j = 0; j < 8; ++j) mins += mn[j] * (A.bsums[2 * j] + A.bsums[2 * j + 1]);
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t q0 = vld1q_u8(B.qs + 32 * c), q1 = vld1q_u8(B.qs + 32 * c + 16);
            const uint8x16_t m4 = vdupq_n_u8(0x0F);
            isum += sc[2 * c] * sdot32(vreinterpretq_s8_u8(vandq_u8(q0, m4)), vreinterpretq_s8_u8(vandq_u8(q1, m4)),
                                       A.qs + 64 * c);
            isum += sc[2 * c + 1] *
                    sdot32(vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)), vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), A.qs + 64 * c + 32);
        }
        sum += (A.d * f16n(B.d)) * static_cast<float>(isum) - (A.d * f16n(B.dmin)) * static_cast<float>(mins);
    }
    return sum;
}

float vec_dot_q6_k_q8_k_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ6_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ6_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        int isum = 0;
        for (int c = 0; c < 2; ++c) {
            // 16-byte halves h = 0, 1 of: ql A (elements l), ql B (l + 32), qh (all four groups).
            for (int h = 0; h < 2; ++h) {
                const uint8x16_t la = vld1q_u8(B.ql + 64 * c + 16 * h), lb = vld1q_u8(B.ql + 64 * c + 32 + 16 * h);
                const uint8x16_t hq = vld1q_u8(B.qh + 32 * c + 16 * h);
                const uint8x16_t m4 = vdupq_n_u8(0x0F), m3 = vdupq_n_u8(3);
                const uint8x16_t low[4] = {vandq_u8(la, m4), vandq_u8(lb, m4), vshrq_n_u8(la, 4), vshrq_n_u8(lb, 4)};
                const uint8x16_t high[4] = {vandq_u8(hq, m3), vandq_u8(vshrq_n_u8(hq, 2), m3),
                                            vandq_u8(vshrq_n_u8(hq, 4), m3), vshrq_n_u8(hq, 6)};
                for (int g = 0; g < 4; ++g) {
                    const int8x16_t q = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low[g], vshlq_n_u8(high[g], 4))), vdupq_n_s8(32));
                    // Elements 128c + 32g + 16h .. +15 form sub-block 8c + 2g + h.
                    const int s = vaddvq_s32(vdotq_s32(vdupq_n_s32(0), q, vld1q_s8(A.qs + 128 * c + 32 * g + 16 * h)));
                    isum += B.scales[8 * c + 2 * g + h] * s;
                }
            }
        }
        sum += (A.d * f16n(B.d)) * static_cast<float>(isum);
    }
    return sum;
}

float vec_dot_f16_f16_neon(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 2; ++k) {
            const float16x8_t wa = vreinterpretq_f16_u16(vld1q_u16(a + i + 8 * k));
            const float16x8_t xb = vreinterpretq_f16_u16(vld1q_u16(b + i + 8 * k));
            acc[2 * k] = vfmaq_f32(acc[2 * k], vcvt_f32_f16(vget_low_f16(wa)), vcvt_f32_f16(vget_low_f16(xb)));
            acc[2 * k + 1] = vfmaq_f32(acc[2 * k + 1], vcvt_high_f32_f16(wa), vcvt_high_f32_f16(xb));
        }
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; ++i) s += f16_to_f32(a[i]) * f16_to_f32(b[i]);
    return s;
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
    k.q4_k = vec_dot_q4_k_q8_k_neon;
    k.q6_k = vec_dot_q6_k_q8_k_neon;
    k.f16 = vec_dot_f16_f16_neon;
    k.f32 = vec_dot_f32_f32_neon;
}

} // namespace tern
#endif
