// NEON + dotprod kernel set, built only for aarch64 (-march=armv8.2-a+dotprod, kernels/CMakeLists.txt).
// Covers every weight format of the dispatch table (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K..Q6_K IQ4_NL IQ4_XS MXFP4
// F8_E4M3 F16 BF16 F32) and the Q8_0, Q8_1, Q8_K, F16 and BF16 activation quantizers (the f32 copy is shared;
// dispatch.cpp fills the scalar twins first, so an entry missing here falls back to them).
// The integer sums are exact, as in the scalar twins; only the float accumulation order differs.
// Tested on x86-64 hosts under qemu-aarch64: scripts/test_neon.sh builds tests/neon/ with
// cmake/toolchain-aarch64-linux-gnu.cmake and runs tests/kernels/test_kernels_*.cpp there.
#include <cmath>
#include <cstring>
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/dot_unaligned.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include "quant/blocks.h"
#include "quant/half.h"

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

// IQ4_NL's loop with MXFP4's doubled E2M1 code book and power-of-two scale.
float vec_dot_mxfp4_q8_0_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockMXFP4*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const int8x16_t table = vld1q_s8(kMxfp4Values);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK_MXFP4; ++b) {
        uint8x16_t lo, hi;
        nibbles32(wb[b].qs, lo, hi);
        int32x4_t s = vdotq_s32(vdupq_n_s32(0), vqtbl1q_s8(table, lo), vld1q_s8(xb[b].qs));
        s = vdotq_s32(s, vqtbl1q_s8(table, hi), vld1q_s8(xb[b].qs + 16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(s), f16n(xb[b].d) * mxfp4_scale_half(wb[b].e));
    }
    return vaddvq_f32(acc);
}

// sum(q * a) over 32 elements, q given as two int8x16 (elements 0-15, 16-31).
inline int32x4_t sdot32v(int8x16_t q0, int8x16_t q1, const int8_t* a) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), q0, vld1q_s8(a)), q1, vld1q_s8(a + 16));
}

inline int sdot32(int8x16_t q0, int8x16_t q1, const int8_t* a) { return vaddvq_s32(sdot32v(q0, q1, a)); }

// The fifth bits of a Q5_0/Q5_1 block (qh, bit j for element j) as two byte vectors holding 0 or 16:
// elements 0-15 and 16-31, in the order nibbles32() returns the low four bits.
inline void fifth_bits32(const uint8_t* qh, uint8x16_t& lo, uint8x16_t& hi) {
    uint32_t bits;
    std::memcpy(&bits, qh, 4);
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(bits)); // qh[0..3], four times
    static const uint8_t kLo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t kHi[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bit = vld1q_u8(kBit), sixteen = vdupq_n_u8(16);
    lo = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(kLo)), bit), sixteen);
    hi = vandq_u8(vtstq_u8(vqtbl1q_u8(bytes, vld1q_u8(kHi)), bit), sixteen);
}

float vec_dot_q4_1_q8_1_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_1*>(w);
    const auto* xb = static_cast<const BlockQ8_1*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK4_1; ++b) {
        uint8x16_t lo, hi;
        nibbles32(wb[b].qs, lo, hi); // codes 0..15 fit int8: no offset needed
        const int s = vaddvq_s32(sdot32v(vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi), xb[b].qs));
        // y = q * d + m: the m term is m * (da * sum(a)), which Q8_1 stores as s.
        sum += static_cast<float>(s) * (f16n(wb[b].d) * f16n(xb[b].d)) + f16n(wb[b].m) * f16n(xb[b].s);
    }
    return sum;
}

float vec_dot_q5_0_q8_0_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float32x4_t acc = vdupq_n_f32(0.0f);
    for (int64_t b = 0; b < n / QK5_0; ++b) {
        uint8x16_t lo, hi, h0, h1;
        nibbles32(wb[b].qs, lo, hi);
        fifth_bits32(wb[b].qh, h0, h1);
        const int8x16_t q0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, h0)), vdupq_n_s8(16));
        const int8x16_t q1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, h1)), vdupq_n_s8(16));
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(sdot32v(q0, q1, xb[b].qs)), f16n(wb[b].d) * f16n(xb[b].d));
    }
    return vaddvq_f32(acc);
}

float vec_dot_q5_1_q8_1_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_1*>(w);
    const auto* xb = static_cast<const BlockQ8_1*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK5_1; ++b) {
        uint8x16_t lo, hi, h0, h1;
        nibbles32(wb[b].qs, lo, hi);
        fifth_bits32(wb[b].qh, h0, h1); // codes 0..31 fit int8
        const int s =
            vaddvq_s32(sdot32v(vreinterpretq_s8_u8(vorrq_u8(lo, h0)), vreinterpretq_s8_u8(vorrq_u8(hi, h1)), xb[b].qs));
        sum += static_cast<float>(s) * (f16n(wb[b].d) * f16n(xb[b].d)) + f16n(wb[b].m) * f16n(xb[b].s);
    }
    return sum;
}

// e4m3 weights times Q8_0 activations in exact integers, as the scalar twin: a finite e4m3 value times 2^9
// is (8 + m) << (e - 1) for a normal (e > 0) and m for a subnormal, so each product is the 16-bit
// (+-mantissa * a) shifted left by at most 14, and 32 of them stay below 2^30. The NaN codes count as 0.
inline int32x4_t e4m3_dot16(int32x4_t acc, uint8x16_t w, int8x16_t a) {
    const uint8x16_t e = vandq_u8(vshrq_n_u8(w, 3), vdupq_n_u8(15));
    uint8x16_t mant = vorrq_u8(vandq_u8(w, vdupq_n_u8(7)), vandq_u8(vcgtq_u8(e, vdupq_n_u8(0)), vdupq_n_u8(8)));
    mant = vbicq_u8(mant, vceqq_u8(vandq_u8(w, vdupq_n_u8(0x7F)), vdupq_n_u8(0x7F)));
    const uint8x16_t shift = vqsubq_u8(e, vdupq_n_u8(1)); // e - 1, and 0 for subnormals
    const int8x16_t sm =
        vbslq_s8(vtstq_u8(w, vdupq_n_u8(0x80)), vnegq_s8(vreinterpretq_s8_u8(mant)), vreinterpretq_s8_u8(mant));
    const int16x8_t p[2] = {vmull_s8(vget_low_s8(sm), vget_low_s8(a)), vmull_high_s8(sm, a)};
    const uint16x8_t sh[2] = {vmovl_u8(vget_low_u8(shift)), vmovl_high_u8(shift)};
    for (int h = 0; h < 2; ++h) {
        acc = vaddq_s32(
            acc, vshlq_s32(vmovl_s16(vget_low_s16(p[h])), vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(sh[h])))));
        acc = vaddq_s32(acc, vshlq_s32(vmovl_high_s16(p[h]), vreinterpretq_s32_u32(vmovl_high_u16(sh[h]))));
    }
    return acc;
}

float vec_dot_f8_e4m3_q8_0_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockF8_E4M3*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_F8; ++b) {
        int32x4_t s = e4m3_dot16(vdupq_n_s32(0), vld1q_u8(wb[b].qs), vld1q_s8(xb[b].qs));
        s = e4m3_dot16(s, vld1q_u8(wb[b].qs + 16), vld1q_s8(xb[b].qs + 16));
        sum += static_cast<float>(vaddvq_s32(s)) * (f16n(wb[b].d) * f16n(xb[b].d)) * (1.0f / 512.0f);
    }
    return sum;
}

// sum over the 16 sub-blocks of a k-quant of (scale_j * bsums_j), the min/offset term.
inline int scaled_bsums16(const int16_t* bsums, const int16_t* scale) {
    const int16x8_t b0 = vld1q_s16(bsums), b1 = vld1q_s16(bsums + 8);
    const int16x8_t s0 = vld1q_s16(scale), s1 = vld1q_s16(scale + 8);
    int32x4_t p = vmull_s16(vget_low_s16(b0), vget_low_s16(s0));
    p = vmlal_high_s16(p, b0, s0);
    p = vmlal_s16(p, vget_low_s16(b1), vget_low_s16(s1));
    p = vmlal_high_s16(p, b1, s1);
    return vaddvq_s32(p);
}

float vec_dot_q2_k_q8_k_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ2_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ2_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        int16_t mins[16];
        for (int j = 0; j < 16; ++j)
            mins[j] = static_cast<int16_t>(B.scales[j] >> 4);
        const int summs = scaled_bsums16(A.bsums, mins);
        int isum = 0;
        // Element 128c + 32g + l is bits 2g..2g+1 of qs[32c + l]; sub-block (16 elements) 8c + 2g + l / 16.
        for (int c = 0; c < 2; ++c) {
            const uint8x16_t q[2] = {vld1q_u8(B.qs + 32 * c), vld1q_u8(B.qs + 32 * c + 16)};
            for (int g = 0; g < 4; ++g)
                for (int h = 0; h < 2; ++h) {
                    const uint8x16_t v =
                        vandq_u8(vshlq_u8(q[h], vdupq_n_s8(static_cast<int8_t>(-2 * g))), vdupq_n_u8(3));
                    const int s = vaddvq_s32(
                        vdotq_s32(vdupq_n_s32(0), vreinterpretq_s8_u8(v), vld1q_s8(A.qs + 128 * c + 32 * g + 16 * h)));
                    isum += (B.scales[8 * c + 2 * g + h] & 15) * s;
                }
        }
        sum += (A.d * f16n(B.d)) * static_cast<float>(isum) - (A.d * f16n(B.dmin)) * static_cast<float>(summs);
    }
    return sum;
}

float vec_dot_q3_k_q8_k_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ3_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ3_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        const uint8x16_t hm[2] = {vld1q_u8(B.hmask), vld1q_u8(B.hmask + 16)};
        int isum = 0;
        // Low two bits as in Q2_K; the high bit of element 128c + 32g + l is bit 4c + g of hmask[l], and a
        // clear bit subtracts 4.
        for (int c = 0; c < 2; ++c) {
            const uint8x16_t q[2] = {vld1q_u8(B.qs + 32 * c), vld1q_u8(B.qs + 32 * c + 16)};
            for (int g = 0; g < 4; ++g)
                for (int h = 0; h < 2; ++h) {
                    const uint8x16_t v =
                        vandq_u8(vshlq_u8(q[h], vdupq_n_s8(static_cast<int8_t>(-2 * g))), vdupq_n_u8(3));
                    const uint8x16_t set = vtstq_u8(hm[h], vdupq_n_u8(static_cast<uint8_t>(1u << (4 * c + g))));
                    const int8x16_t qv =
                        vsubq_s8(vreinterpretq_s8_u8(v), vreinterpretq_s8_u8(vbicq_u8(vdupq_n_u8(4), set)));
                    const int s = vaddvq_s32(vdotq_s32(vdupq_n_s32(0), qv, vld1q_s8(A.qs + 128 * c + 32 * g + 16 * h)));
                    isum += (q3_k_scale(B.scales, 8 * c + 2 * g + h) - 32) * s;
                }
        }
        sum += (A.d * f16n(B.d)) * static_cast<float>(isum);
    }
    return sum;
}

float vec_dot_q5_k_q8_k_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ5_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; ++j)
            q4_k_scale_min(B.scales, j, sc[j], mn[j]);
        int mins = 0, isum = 0;
        for (int j = 0; j < 8; ++j)
            mins += mn[j] * (A.bsums[2 * j] + A.bsums[2 * j + 1]);
        const uint8x16_t qh[2] = {vld1q_u8(B.qh), vld1q_u8(B.qh + 16)};
        const uint8x16_t m4 = vdupq_n_u8(0x0F), sixteen = vdupq_n_u8(16);
        // As Q4_K, plus bit j of qh[t] as the 16s of element 32j + t (sub-block j).
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t q0 = vld1q_u8(B.qs + 32 * c), q1 = vld1q_u8(B.qs + 32 * c + 16);
            const uint8x16_t blo = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * c)));
            const uint8x16_t bhi = vdupq_n_u8(static_cast<uint8_t>(1u << (2 * c + 1)));
            const uint8x16_t l0 = vorrq_u8(vandq_u8(q0, m4), vandq_u8(vtstq_u8(qh[0], blo), sixteen));
            const uint8x16_t l1 = vorrq_u8(vandq_u8(q1, m4), vandq_u8(vtstq_u8(qh[1], blo), sixteen));
            const uint8x16_t u0 = vorrq_u8(vshrq_n_u8(q0, 4), vandq_u8(vtstq_u8(qh[0], bhi), sixteen));
            const uint8x16_t u1 = vorrq_u8(vshrq_n_u8(q1, 4), vandq_u8(vtstq_u8(qh[1], bhi), sixteen));
            isum += sc[2 * c] * sdot32(vreinterpretq_s8_u8(l0), vreinterpretq_s8_u8(l1), A.qs + 64 * c);
            isum += sc[2 * c + 1] * sdot32(vreinterpretq_s8_u8(u0), vreinterpretq_s8_u8(u1), A.qs + 64 * c + 32);
        }
        sum += (A.d * f16n(B.d)) * static_cast<float>(isum) - (A.d * f16n(B.dmin)) * static_cast<float>(mins);
    }
    return sum;
}

float vec_dot_q4_k_q8_k_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ4_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        uint8_t sc[8], mn[8];
        for (int j = 0; j < 8; ++j)
            q4_k_scale_min(B.scales, j, sc[j], mn[j]);
        int mins = 0, isum = 0;
        for (int j = 0; j < 8; ++j)
            mins += mn[j] * (A.bsums[2 * j] + A.bsums[2 * j + 1]);
        for (int c = 0; c < 4; ++c) {
            const uint8x16_t q0 = vld1q_u8(B.qs + 32 * c), q1 = vld1q_u8(B.qs + 32 * c + 16);
            const uint8x16_t m4 = vdupq_n_u8(0x0F);
            isum += sc[2 * c] *
                    sdot32(vreinterpretq_s8_u8(vandq_u8(q0, m4)), vreinterpretq_s8_u8(vandq_u8(q1, m4)), A.qs + 64 * c);
            isum += sc[2 * c + 1] * sdot32(vreinterpretq_s8_u8(vshrq_n_u8(q0, 4)),
                                           vreinterpretq_s8_u8(vshrq_n_u8(q1, 4)), A.qs + 64 * c + 32);
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
                    const int8x16_t q =
                        vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(low[g], vshlq_n_u8(high[g], 4))), vdupq_n_s8(32));
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

float vec_dot_iq4_xs_q8_k_neon(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockIQ4_XS*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    const int8x16_t table = vld1q_s8(kIq4Values);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockIQ4_XS& B = wb[b];
        const BlockQ8_K& A = xb[b];
        int isum = 0;
        for (int ib = 0; ib < 8; ++ib) { // sub-block ib: 32 codes in IQ4_NL's layout
            uint8x16_t lo, hi;
            nibbles32(B.qs + 16 * ib, lo, hi);
            isum += (iq4_xs_scale(B, ib) - 32) * sdot32(vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi), A.qs + 32 * ib);
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
    for (; i < n; ++i)
        s += f16_to_f32(load_u16_at(a, i)) * f16_to_f32(load_u16_at(b, i));
    return s;
}

// bf16 -> f32 is a 16-bit shift; a product of two bf16 is exact in f32 (8 + 8 significant bits).
float vec_dot_bf16_bf16_neon(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 2; ++k) {
            const uint16x8_t wa = vld1q_u16(a + i + 8 * k), xb = vld1q_u16(b + i + 8 * k);
            const float32x4_t w0 = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(wa), 16));
            const float32x4_t w1 = vreinterpretq_f32_u32(vshll_high_n_u16(wa, 16));
            const float32x4_t x0 = vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(xb), 16));
            const float32x4_t x1 = vreinterpretq_f32_u32(vshll_high_n_u16(xb, 16));
            acc[2 * k] = vfmaq_f32(acc[2 * k], w0, x0);
            acc[2 * k + 1] = vfmaq_f32(acc[2 * k + 1], w1, x1);
        }
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; ++i)
        s += bf16_to_f32(load_u16_at(a, i)) * bf16_to_f32(load_u16_at(b, i));
    return s;
}

float vec_dot_f32_f32_neon(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const float*>(w);
    const auto* b = static_cast<const float*>(x);
    float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; ++k)
            acc[k] = vfmaq_f32(acc[k], vld1q_f32(a + i + 4 * k), vld1q_f32(b + i + 4 * k));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3])));
    for (; i < n; ++i)
        s += load_f32_at(a, i) * load_f32_at(b, i);
    return s;
}

// Activation quantizers: the scalar ones' bytes (kernels/cpu/quantize_act.h). vcvtnq rounds to nearest even
// like std::nearbyint, x * id is one multiply as in the scalar code, and amax/127, 127/amax are the same
// f32 divisions.
inline void quantize_q8_block_neon(const float* x, int8_t* qs, float& d, int& sum) {
    float32x4_t v[8];
    float32x4_t amax4 = vdupq_n_f32(0.0f);
    for (int k = 0; k < 8; ++k) {
        v[k] = vld1q_f32(x + 4 * k);
        amax4 = vmaxnmq_f32(amax4, vabsq_f32(v[k])); // maxNum ignores NaN, like std::fmax
    }
    const float amax = vmaxnmvq_f32(amax4);
    d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int16x8_t q16[4];
    for (int k = 0; k < 4; ++k)
        q16[k] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * k], id))),
                              vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(v[2 * k + 1], id))));
    const int8x16_t q0 = vcombine_s8(vqmovn_s16(q16[0]), vqmovn_s16(q16[1]));
    const int8x16_t q1 = vcombine_s8(vqmovn_s16(q16[2]), vqmovn_s16(q16[3]));
    vst1q_s8(qs, q0);
    vst1q_s8(qs + 16, q1);
    sum = vaddlvq_s8(q0) + vaddlvq_s8(q1);
}

void quantize_act_q8_0_neon(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_0*>(dst);
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        float d;
        int sum;
        quantize_q8_block_neon(x + b * QK8_0, y[b].qs, d, sum);
        y[b].d = f32_to_f16(d);
    }
}

void quantize_act_q8_1_neon(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_1*>(dst);
    for (int64_t b = 0; b < n / QK8_1; ++b) {
        float d;
        int sum;
        quantize_q8_block_neon(x + b * QK8_1, y[b].qs, d, sum);
        y[b].d = f32_to_f16(d);
        y[b].s = f32_to_f16(d * static_cast<float>(sum));
    }
}

// Q8_K as ggml's reference quantizer (quantize_act_q8_k_scalar): the first element with the largest |x|
// sets the sign of the scale, iscale = -127 / max, codes round half to even and clamp at 127 (-128 is
// out of reach: no |iscale * x| exceeds 127 by half a unit), d = 1 / iscale, bsums per 16.
void quantize_act_q8_k_neon(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_K*>(dst);
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        BlockQ8_K& blk = y[b];
        float32x4_t amax4 = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) amax4 = vmaxnmq_f32(amax4, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxnmvq_f32(amax4);
        if (amax == 0.0f) {
            std::memset(&blk, 0, sizeof blk);
            continue;
        }
        float max = 0.0f;
        for (int j = 0; j < QK_K; ++j)
            if (std::fabs(x[j]) == amax) {
                max = x[j];
                break;
            }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; j += 16) {
            int16x8_t q16[2];
            for (int h = 0; h < 2; ++h)
                q16[h] = vcombine_s16(vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 8 * h), iscale))),
                                      vqmovn_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 8 * h + 4), iscale))));
            const int8x16_t q = vcombine_s8(vqmovn_s16(q16[0]), vqmovn_s16(q16[1]));
            vst1q_s8(blk.qs + j, q);
            blk.bsums[j / 16] = static_cast<int16_t>(vaddlvq_s8(q));
        }
        blk.d = 1.0f / iscale;
    }
}

// FCVTN rounds to nearest even with the default FPCR (no flush-to-zero on Linux), as f32_to_f16 does; only
// NaNs differ (the hardware keeps the payload), so they are replaced by f32_to_f16's sign | 0x7E00.
void quantize_act_f16_neon(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t v = vld1q_f32(x + i);
        const uint16x4_t h = vreinterpret_u16_f16(vcvt_f16_f32(v));
        const uint16x4_t nan = vmovn_u32(vmvnq_u32(vceqq_f32(v, v)));
        const uint16x4_t quiet = vorr_u16(vand_u16(h, vdup_n_u16(0x8000)), vdup_n_u16(0x7E00));
        vst1_u16(y + i, vbsl_u16(nan, quiet, h));
    }
    for (; i < n; ++i)
        y[i] = f32_to_f16(x[i]);
}

// Round to nearest even on the bits, as f32_to_bf16: (bits + 0x7FFF + lsb) >> 16; NaNs become quiet.
void quantize_act_bf16_neon(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t bits = vreinterpretq_u32_f32(vld1q_f32(x + i));
        const uint32x4_t lsb = vandq_u32(vshrq_n_u32(bits, 16), vdupq_n_u32(1));
        const uint16x4_t rounded = vshrn_n_u32(vaddq_u32(bits, vaddq_u32(lsb, vdupq_n_u32(0x7FFF))), 16);
        const uint16x4_t quiet = vorr_u16(vshrn_n_u32(bits, 16), vdup_n_u16(0x40));
        const uint16x4_t nan = vmovn_u32(vcgtq_u32(vandq_u32(bits, vdupq_n_u32(0x7FFFFFFF)), vdupq_n_u32(0x7F800000)));
        vst1_u16(y + i, vbsl_u16(nan, quiet, rounded));
    }
    for (; i < n; ++i)
        y[i] = f32_to_bf16(x[i]);
}

} // namespace

void fill_cpu_kernels_neon(CpuKernels& k) {
    k.q4_0 = vec_dot_q4_0_q8_0_neon;
    k.q4_1 = vec_dot_q4_1_q8_1_neon;
    k.q5_0 = vec_dot_q5_0_q8_0_neon;
    k.q5_1 = vec_dot_q5_1_q8_1_neon;
    k.q8_0 = vec_dot_q8_0_q8_0_neon;
    k.q2_k = vec_dot_q2_k_q8_k_neon;
    k.q3_k = vec_dot_q3_k_q8_k_neon;
    k.q4_k = vec_dot_q4_k_q8_k_neon;
    k.q5_k = vec_dot_q5_k_q8_k_neon;
    k.q6_k = vec_dot_q6_k_q8_k_neon;
    k.iq4_nl = vec_dot_iq4_nl_q8_0_neon;
    k.iq4_xs = vec_dot_iq4_xs_q8_k_neon;
    k.f8_e4m3 = vec_dot_f8_e4m3_q8_0_neon;
    k.mxfp4 = vec_dot_mxfp4_q8_0_neon;
    k.f16 = vec_dot_f16_f16_neon;
    k.bf16 = vec_dot_bf16_bf16_neon;
    k.f32 = vec_dot_f32_f32_neon;
    k.quantize[static_cast<int>(ActFormat::f16)] = quantize_act_f16_neon;
    k.quantize[static_cast<int>(ActFormat::bf16)] = quantize_act_bf16_neon;
    k.quantize[static_cast<int>(ActFormat::q8_0)] = quantize_act_q8_0_neon;
    k.quantize[static_cast<int>(ActFormat::q8_1)] = quantize_act_q8_1_neon;
    k.quantize[static_cast<int>(ActFormat::q8_k)] = quantize_act_q8_k_neon;
}

} // namespace tern
#endif
