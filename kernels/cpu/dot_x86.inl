// 256-bit x86 dot kernels, included by dot_avx2.cpp (-mavx2 -mfma -mf16c) and dot_avx512.cpp (adds
// -mavx512f/bw/vl/vnni). Each includer compiles its own copy with its own flags, in an anonymous namespace,
// so the two copies never meet at link time and the AVX2 one never contains an AVX-512 instruction. The
// only difference between the copies is mul_sum_us8(): with AVX-512 VNNI + VL one vpdpbusd replaces
// vpmaddubsw + vpmaddwd (and cannot saturate).
//
// Common shapes: a 32-element block of 8-bit codes is one ymm; products of unsigned weight codes and
// signed activation codes are summed in pairs by vpmaddubsw, which saturates at +-32767, so every caller
// keeps |u * a| * 2 <= 32767: codes are at most 127 (|Q8| <= 127 by construction of the quantizers, the
// sign trick moves the weight's sign onto the activation) or small unsigned nibbles.
// Integer sums are exact; the float accumulation order differs from the scalar twin's, which the tests
// allow for by normalised error.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/dot_unaligned.h"
#include "kernels/cpu/quantize_act.h"
#include "quant/blocks.h"

namespace tern {
namespace {

inline float f16s(uint16_t h) { return _cvtsh_ss(h); }

inline float hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

inline int hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// 8 int32 lanes, lane i = sum of u[4i..4i+3] * s[4i..4i+3] (u unsigned, s signed bytes).
inline __m256i mul_sum_us8(__m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

// Signed x signed: move x's sign onto y so vpmaddubsw / vpdpbusd can take |x| as the unsigned side.
inline __m256i mul_sum_i8(__m256i x, __m256i y) { return mul_sum_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); }

// Unsigned codes u times signed activations, pairs summed to i16 and then multiplied by the per-128-bit-lane
// scale in sc (i16) while summing pairs to i32: the k-quant sub-block step. |u| <= 63 keeps the i16 sums
// below 2 * 63 * 127 = 16002.
inline __m256i mul_sum_scaled(__m256i u, __m256i s, __m256i sc) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), sc);
}

// 32 nibbles of a Q4_0-style block: bytes 0-15 are the low nibbles (elements 0-15), 16-31 the high ones.
inline __m256i nibbles32(const uint8_t* qs) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

// Byte e = 0xFF where bit e of the little-endian u32 at qh is set, else 0.
inline __m256i bits32(const uint8_t* qh) {
    uint32_t v;
    std::memcpy(&v, qh, 4);
    const __m256i x = _mm256_set1_epi32(static_cast<int>(v));
    // In each 128-bit lane, bytes 8k..8k+7 take byte k (lane 0) or k + 2 (lane 1) of v.
    const __m256i spread = _mm256_shuffle_epi8(
        x, _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
    return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

inline __m256i loadu256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Two i16 scales broadcast to the low and high 128-bit lanes (the two 16-element sub-blocks of a ymm).
inline __m256i scale_pair(int lo, int hi) {
    return _mm256_set_m128i(_mm_set1_epi16(static_cast<short>(hi)), _mm_set1_epi16(static_cast<short>(lo)));
}

float vec_dot_q4_0_q8_0_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const int64_t nb = n / QK4_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t b = 0;
    // Two blocks per step: two independent FMA chains hide the 4-cycle FMA latency.
    for (; b + 1 < nb; b += 2) {
        const __m256i q0 = _mm256_sub_epi8(nibbles32(wb[b].qs), _mm256_set1_epi8(8));
        const __m256i q1 = _mm256_sub_epi8(nibbles32(wb[b + 1].qs), _mm256_set1_epi8(8));
        const __m256 p0 = _mm256_cvtepi32_ps(mul_sum_i8(q0, loadu256(xb[b].qs)));
        const __m256 p1 = _mm256_cvtepi32_ps(mul_sum_i8(q1, loadu256(xb[b + 1].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b + 1].d) * f16s(xb[b + 1].d)), p1, acc1);
    }
    for (; b < nb; ++b) {
        const __m256i q0 = _mm256_sub_epi8(nibbles32(wb[b].qs), _mm256_set1_epi8(8));
        const __m256 p0 = _mm256_cvtepi32_ps(mul_sum_i8(q0, loadu256(xb[b].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p0, acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

float vec_dot_q4_1_q8_1_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_1*>(w);
    const auto* xb = static_cast<const BlockQ8_1*>(x);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t b = 0; b < n / QK4_1; ++b) {
        const __m256 p = _mm256_cvtepi32_ps(mul_sum_us8(nibbles32(wb[b].qs), loadu256(xb[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p, acc);
        summ += f16s(wb[b].m) * f16s(xb[b].s);
    }
    return hsum_ps(acc) + summ;
}

float vec_dot_q5_0_q8_0_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK5_0; ++b) {
        // q - 16 is the nibble when the 16s bit is set, else nibble - 16 = nibble | 0xF0 as int8.
        const __m256i hi = _mm256_andnot_si256(bits32(wb[b].qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
        const __m256i q = _mm256_or_si256(nibbles32(wb[b].qs), hi);
        const __m256 p = _mm256_cvtepi32_ps(mul_sum_i8(q, loadu256(xb[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p, acc);
    }
    return hsum_ps(acc);
}

// vec_dot_q5_0_q8_0_x86 for C columns: each block's codes are rebuilt once, then every column runs the
// single-column kernel's instructions in its order (its bits are that kernel's).
template <int C>
void dot_cols_q5_0_q8_0_x86(int64_t n, const void* w, const void* x, size_t x_stride, float* out, size_t out_stride) {
    const auto* wb = static_cast<const BlockQ5_0*>(w);
    const BlockQ8_0* xb[C];
    __m256 acc[C];
    for (int c = 0; c < C; ++c) {
        xb[c] = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(x) + static_cast<size_t>(c) * x_stride);
        acc[c] = _mm256_setzero_ps();
    }
    for (int64_t b = 0; b < n / QK5_0; ++b) {
        const __m256i hi = _mm256_andnot_si256(bits32(wb[b].qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
        const __m256i q = _mm256_or_si256(nibbles32(wb[b].qs), hi);
        const float dw = f16s(wb[b].d);
        for (int c = 0; c < C; ++c) {
            const __m256 p = _mm256_cvtepi32_ps(mul_sum_i8(q, loadu256(xb[c][b].qs)));
            acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * f16s(xb[c][b].d)), p, acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) out[static_cast<size_t>(c) * out_stride] = hsum_ps(acc[c]);
}

void vec_dot_cols_q5_0_q8_0_x86(int64_t n, const void* w, const void* x, size_t x_stride, int n_cols, float* out,
                                size_t out_stride) {
    static_assert(kDotCols == 4, "handles 1..4 columns");
    switch (n_cols) {
    case 1: dot_cols_q5_0_q8_0_x86<1>(n, w, x, x_stride, out, out_stride); break;
    case 2: dot_cols_q5_0_q8_0_x86<2>(n, w, x, x_stride, out, out_stride); break;
    case 3: dot_cols_q5_0_q8_0_x86<3>(n, w, x, x_stride, out, out_stride); break;
    default: dot_cols_q5_0_q8_0_x86<4>(n, w, x, x_stride, out, out_stride); break;
    }
}

float vec_dot_q5_1_q8_1_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_1*>(w);
    const auto* xb = static_cast<const BlockQ8_1*>(x);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t b = 0; b < n / QK5_1; ++b) {
        const __m256i hi = _mm256_and_si256(bits32(wb[b].qh), _mm256_set1_epi8(0x10));
        const __m256i q = _mm256_or_si256(nibbles32(wb[b].qs), hi);   // 0..31, unsigned
        const __m256 p = _mm256_cvtepi32_ps(mul_sum_us8(q, loadu256(xb[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p, acc);
        summ += f16s(wb[b].m) * f16s(xb[b].s);
    }
    return hsum_ps(acc) + summ;
}

float vec_dot_q8_0_q8_0_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ8_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const int64_t nb = n / QK8_0;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const __m256 p0 = _mm256_cvtepi32_ps(mul_sum_i8(loadu256(wb[b].qs), loadu256(xb[b].qs)));
        const __m256 p1 = _mm256_cvtepi32_ps(mul_sum_i8(loadu256(wb[b + 1].qs), loadu256(xb[b + 1].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b + 1].d) * f16s(xb[b + 1].d)), p1, acc1);
    }
    for (; b < nb; ++b) {
        const __m256 p0 = _mm256_cvtepi32_ps(mul_sum_i8(loadu256(wb[b].qs), loadu256(xb[b].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p0, acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// The 16 IQ4 code-book values in both 128-bit lanes, for vpshufb lookups by nibble.
inline __m256i iq4_table() {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIq4Values));
    return _mm256_set_m128i(t, t);
}

float vec_dot_iq4_nl_q8_0_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockIQ4_NL*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const __m256i table = iq4_table();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK4_NL; ++b) {
        const __m256i q = _mm256_shuffle_epi8(table, nibbles32(wb[b].qs));   // -127..113
        const __m256 p = _mm256_cvtepi32_ps(mul_sum_i8(q, loadu256(xb[b].qs)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16s(wb[b].d) * f16s(xb[b].d)), p, acc);
    }
    return hsum_ps(acc);
}

// MXFP4: IQ4_NL's shape with the doubled E2M1 code book (-12..12) and a power-of-two weight scale.
float vec_dot_mxfp4_q8_0_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockMXFP4*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kMxfp4Values));
    const __m256i table = _mm256_set_m128i(t, t);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / QK_MXFP4;
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {   // two accumulators hide the fma latency
        const __m256i q0 = _mm256_shuffle_epi8(table, nibbles32(wb[b].qs));
        const __m256i q1 = _mm256_shuffle_epi8(table, nibbles32(wb[b + 1].qs));
        const __m256 p0 = _mm256_cvtepi32_ps(mul_sum_i8(q0, loadu256(xb[b].qs)));
        const __m256 p1 = _mm256_cvtepi32_ps(mul_sum_i8(q1, loadu256(xb[b + 1].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(xb[b].d) * mxfp4_scale_half(wb[b].e)), p0, acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(xb[b + 1].d) * mxfp4_scale_half(wb[b + 1].e)), p1, acc1);
    }
    for (; b < nb; ++b) {
        const __m256i q = _mm256_shuffle_epi8(table, nibbles32(wb[b].qs));
        const __m256 p = _mm256_cvtepi32_ps(mul_sum_i8(q, loadu256(xb[b].qs)));
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16s(xb[b].d) * mxfp4_scale_half(wb[b].e)), p, acc0);
    }
    return hsum_ps(_mm256_add_ps(acc0, acc1));
}

// 8 e4m3 codes (low bytes of the i32 lanes) -> value * 2^9 as exact i32 (see dot_scalar.cpp):
// (8 + m) << (e - 1) for e > 0 (vpsllvd gives 0 for the e = 0 count of -1), m for subnormals.
inline __m256i e4m3_times512(__m256i q) {
    const __m256i e = _mm256_and_si256(_mm256_srli_epi32(q, 3), _mm256_set1_epi32(15));
    const __m256i m = _mm256_and_si256(q, _mm256_set1_epi32(7));
    const __m256i normal = _mm256_sllv_epi32(_mm256_or_si256(m, _mm256_set1_epi32(8)), _mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    const __m256i sub = _mm256_and_si256(m, _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
    const __m256i mag = _mm256_add_epi32(normal, sub);
    const __m256i neg = _mm256_cmpgt_epi32(q, _mm256_set1_epi32(0x7F));
    return _mm256_sub_epi32(_mm256_xor_si256(mag, neg), neg);   // two's complement negate where the sign is set
}

float vec_dot_f8_e4m3_q8_0_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockF8_E4M3*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_F8; ++b) {
        __m256i s = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k) {
            const __m256i q = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(wb[b].qs + 8 * k)));
            const __m256i a = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(xb[b].qs + 8 * k)));
            s = _mm256_add_epi32(s, _mm256_mullo_epi32(e4m3_times512(q), a));   // |sum| < 2^30: exact
        }
        const float d = f16s(wb[b].d) * f16s(xb[b].d) * (1.0f / 512.0f);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum_ps(acc);
}

float vec_dot_q2_k_q8_k_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ2_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    const __m256i m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ2_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(B.scales));
        const __m128i mins8 = _mm_and_si128(_mm_srli_epi16(sc8, 4), _mm_set1_epi8(0x0F));
        const int mins = hsum_epi32(_mm256_madd_epi16(_mm256_cvtepu8_epi16(mins8), loadu256(A.bsums)));
        __m256i s = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i qb = loadu256(B.qs + 32 * c);
            for (int g = 0; g < 4; ++g) {
                // Elements 128c + 32g .. +31: sub-blocks 8c + 2g (low lane) and 8c + 2g + 1 (high lane).
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * g), m3);
                const int j = 8 * c + 2 * g;
                s = _mm256_add_epi32(s, mul_sum_scaled(q, loadu256(A.qs + 128 * c + 32 * g),
                                                       scale_pair(B.scales[j] & 15, B.scales[j + 1] & 15)));
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(A.d * f16s(B.d)), _mm256_cvtepi32_ps(s), acc);
        summ += (A.d * f16s(B.dmin)) * static_cast<float>(mins);
    }
    return hsum_ps(acc) - summ;
}

float vec_dot_q3_k_q8_k_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ3_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    const __m256i m3 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    float sum = 0.0f;   // the offset needs the integer total, so each block ends in a scalar
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ3_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        // q = q2 + 4h - 4, so sum(sc * q * a) = sum(sc * (q2 + 4h) * a) - 4 * sum(sc * bsum): the codes stay
        // unsigned (0..7) for vpmaddubsw and the offset comes from the activation's sub-block sums.
        int sc[16];
        int offs = 0;
        for (int j = 0; j < 16; ++j) {
            sc[j] = q3_k_scale(B.scales, j) - 32;
            offs += sc[j] * A.bsums[j];
        }
        const __m256i hm = loadu256(B.hmask);
        __m256i s = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i qb = loadu256(B.qs + 32 * c);
            for (int g = 0; g < 4; ++g) {
                const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * g), m3);
                const __m256i h = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * c + g), one);
                const __m256i q = _mm256_or_si256(q2, _mm256_slli_epi16(h, 2));
                const int j = 8 * c + 2 * g;
                s = _mm256_add_epi32(s, mul_sum_scaled(q, loadu256(A.qs + 128 * c + 32 * g), scale_pair(sc[j], sc[j + 1])));
            }
        }
        sum += (A.d * f16s(B.d)) * static_cast<float>(hsum_epi32(s) - 4 * offs);
    }
    return sum;
}

// Q4_K / Q5_K: `qh` is nullptr for Q4_K. Returns d * sum(sc * q * a) - dmin * sum(m * bsum) for one block.
inline void q45_k_block(const BlockQ8_K& A, uint16_t d, uint16_t dmin, const uint8_t* scales, const uint8_t* qs,
                        const uint8_t* qh, __m256& acc, float& summ) {
    // The 12 scale bytes as three u32 words a, b, c (FORMATS.md §3.4): scales 0-3 = a & 63, mins 0-3 = b & 63,
    // scales 4-7 = low nibbles of c | top 2 bits of a << 4, mins 4-7 = high nibbles of c | top 2 bits of b << 4.
    // Four bytes per word operation instead of 16 calls of q4_k_scale_min().
    uint32_t a, b, c;
    std::memcpy(&a, scales, 4);
    std::memcpy(&b, scales + 4, 4);
    std::memcpy(&c, scales + 8, 4);
    const uint32_t sw[2] = {a & 0x3F3F3F3Fu, (c & 0x0F0F0F0Fu) | (((a >> 6) & 0x03030303u) << 4)};
    const uint32_t mw[2] = {b & 0x3F3F3F3Fu, ((c >> 4) & 0x0F0F0F0Fu) | (((b >> 6) & 0x03030303u) << 4)};
    uint8_t sc[8], mn[8];
    std::memcpy(sc, sw, 8);
    std::memcpy(mn, mw, 8);
    // sum_j m_j * (bsums[2j] + bsums[2j + 1]): each min repeated twice as i16 against the 16 bsums.
    const __m128i m16 = _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn)),
                                         _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7));
    const int mins = hsum_epi32(_mm256_madd_epi16(_mm256_cvtepu8_epi16(m16), loadu256(A.bsums)));
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i hb = qh ? loadu256(qh) : _mm256_setzero_si256();
    __m256i s = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
        // 64 elements: sub-block 2c in the low nibbles of qs[32c..], 2c + 1 in the high ones.
        const __m256i qb = loadu256(qs + 32 * c);
        __m256i lo = _mm256_and_si256(qb, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
        if (qh) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * c + 1), one), 4));
        }
        s = _mm256_add_epi32(s, mul_sum_scaled(lo, loadu256(A.qs + 64 * c), _mm256_set1_epi16(sc[2 * c])));
        s = _mm256_add_epi32(s, mul_sum_scaled(hi, loadu256(A.qs + 64 * c + 32), _mm256_set1_epi16(sc[2 * c + 1])));
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(A.d * f16s(d)), _mm256_cvtepi32_ps(s), acc);
    summ += (A.d * f16s(dmin)) * static_cast<float>(mins);
}

float vec_dot_q4_k_q8_k_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) q45_k_block(xb[b], wb[b].d, wb[b].dmin, wb[b].scales, wb[b].qs, nullptr, acc, summ);
    return hsum_ps(acc) - summ;
}

float vec_dot_q5_k_q8_k_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    __m256 acc = _mm256_setzero_ps();
    float summ = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) q45_k_block(xb[b], wb[b].d, wb[b].dmin, wb[b].scales, wb[b].qs, wb[b].qh, acc, summ);
    return hsum_ps(acc) - summ;
}

float vec_dot_q6_k_q8_k_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ6_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ6_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        // q - 32 with q in 0..63: the unsigned codes go to vpmaddubsw and 32 * sum(sc * bsum) is the offset.
        const int offs = hsum_epi32(_mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(B.scales))), loadu256(A.bsums)));
        __m256i s = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
            const __m256i la = loadu256(B.ql + 64 * c);
            const __m256i lb = loadu256(B.ql + 64 * c + 32);
            const __m256i hq = loadu256(B.qh + 32 * c);
            const __m256i low[4] = {_mm256_and_si256(la, m4), _mm256_and_si256(lb, m4),
                                    _mm256_and_si256(_mm256_srli_epi16(la, 4), m4),
                                    _mm256_and_si256(_mm256_srli_epi16(lb, 4), m4)};
            for (int g = 0; g < 4; ++g) {
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(hq, 2 * g), m3);
                const __m256i q = _mm256_or_si256(low[g], _mm256_slli_epi16(high, 4));
                const int j = 8 * c + 2 * g;
                s = _mm256_add_epi32(s, mul_sum_scaled(q, loadu256(A.qs + 128 * c + 32 * g), scale_pair(B.scales[j], B.scales[j + 1])));
            }
        }
        sum += (A.d * f16s(B.d)) * static_cast<float>(hsum_epi32(s) - 32 * offs);
    }
    return sum;
}

float vec_dot_iq4_xs_q8_k_x86(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockIQ4_XS*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    const __m256i table = iq4_table();
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockIQ4_XS& B = wb[b];
        const BlockQ8_K& A = xb[b];
        __m256i s = _mm256_setzero_si256();
        for (int ib = 0; ib < 8; ++ib) {
            const __m256i q = _mm256_shuffle_epi8(table, nibbles32(B.qs + 16 * ib));
            const __m256i a = loadu256(A.qs + 32 * ib);
            // |T| <= 127 and |a| <= 127: pair sums stay below 32767 in vpmaddubsw.
            const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(a, q));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, _mm256_set1_epi16(static_cast<short>(iq4_xs_scale(B, ib) - 32))));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(A.d * f16s(B.d)), _mm256_cvtepi32_ps(s), acc);
    }
    return hsum_ps(acc);
}

float vec_dot_f16_f16_x86(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) {
            const __m256 wa = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i + 8 * k)));
            const __m256 xb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8 * k)));
            acc[k] = _mm256_fmadd_ps(wa, xb, acc[k]);
        }
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) s += _cvtsh_ss(load_u16_at(a, i)) * _cvtsh_ss(load_u16_at(b, i));
    return s;
}

inline __m256 bf16x8(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

float vec_dot_bf16_bf16_x86(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k) acc[k] = _mm256_fmadd_ps(bf16x8(a + i + 8 * k), bf16x8(b + i + 8 * k), acc[k]);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) s += bf16_to_f32(load_u16_at(a, i)) * bf16_to_f32(load_u16_at(b, i));
    return s;
}

float vec_dot_f32_f32_x86(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const float*>(w);
    const auto* b = static_cast<const float*>(x);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; ++k)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8 * k), _mm256_loadu_ps(b + i + 8 * k), acc[k]);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; ++i) s += load_f32_at(a, i) * load_f32_at(b, i);
    return s;
}

// Activation quantizers, bit-identical to quantize_act.cpp's scalar ones (and to ggml's AVX code):
// amax over the block, d = amax / 127, id = 127 / amax, codes = round-half-even(x * id).
inline __m256i q8_block_x86(const float* x, float& d) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8), v2 = _mm256_loadu_ps(x + 16),
                 v3 = _mm256_loadu_ps(x + 24);
    __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                             _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i i0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), kRound));
    const __m256i i1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), kRound));
    const __m256i i2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), kRound));
    const __m256i i3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), kRound));
    // The packs work per 128-bit lane, leaving 4-byte groups in the order 0 2 4 6 1 3 5 7: undo it.
    const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void quantize_act_q8_0_x86(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_0*>(dst);
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        float d;
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), q8_block_x86(x + b * QK8_0, d));
        y[b].d = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    }
}

void quantize_act_q8_1_x86(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_1*>(dst);
    for (int64_t b = 0; b < n / QK8_1; ++b) {
        float d;
        const __m256i q = q8_block_x86(x + b * QK8_1, d);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), q);
        const __m256i s16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);   // pairs of codes, |.| <= 254
        const int sum = hsum_epi32(_mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
        y[b].d = static_cast<uint16_t>(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        y[b].s = static_cast<uint16_t>(_cvtss_sh(d * static_cast<float>(sum), _MM_FROUND_TO_NEAREST_INT));
    }
}

void quantize_act_f16_x86(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<uint16_t*>(dst);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) y[i] = static_cast<uint16_t>(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

// Q8_K, bit-identical to quantize_act_q8_k_scalar: the signed value of the FIRST element with the largest |x|
// (the scalar loop keeps the first of equal maxima, so +m before -m gives m and -m before +m gives -m),
// iscale = -127 / max, q = min(127, round-half-even(iscale * x)) (one f32 multiply, as in the scalar loop),
// bsums per 16 codes, d = 1 / iscale. An all-zero block is all zero bytes.
void quantize_act_q8_k_x86(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_K*>(dst);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        BlockQ8_K& blk = y[b];
        // max(|v|, acc) returns acc when |v| is NaN, so a NaN never becomes the maximum (as with the scalar '>').
        __m256 acc = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) acc = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), acc);
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        if (amax == 0.0f) {
            std::memset(&blk, 0, sizeof blk);
            continue;
        }
        const __m256 amax8 = _mm256_set1_ps(amax);
        float max = 0.0f;
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 eq = _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), amax8, _CMP_EQ_OQ);
            const int mask = _mm256_movemask_ps(eq);
            if (mask != 0) {
                max = x[j + __builtin_ctz(static_cast<unsigned>(mask))];
                break;
            }
        }
        const float iscale = -127.0f / max;
        const __m256 is8 = _mm256_set1_ps(iscale);
        const __m256 top = _mm256_set1_ps(127.0f);
        constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i i[4];
            for (int k = 0; k < 4; ++k)
                i[k] = _mm256_cvtps_epi32(
                    _mm256_min_ps(_mm256_round_ps(_mm256_mul_ps(is8, _mm256_loadu_ps(x + j + 8 * k)), kRound), top));
            // Codes lie in [-127, 127] (|iscale * x| <= 127 up to one ulp), so the saturating packs are exact.
            const __m256i q = _mm256_permutevar8x32_epi32(
                _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3])), order);
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(blk.qs + j), q);
            // Sums of 4 codes per int32 lane: lanes 0-3 are codes j..j+15, lanes 4-7 codes j+16..j+31.
            const __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
            __m128i s = _mm_hadd_epi32(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
            s = _mm_hadd_epi32(s, s);
            blk.bsums[j / 16] = static_cast<int16_t>(_mm_cvtsi128_si32(s));
            blk.bsums[j / 16 + 1] = static_cast<int16_t>(_mm_extract_epi32(s, 1));
        }
        blk.d = 1.0f / iscale;
    }
}

// Registers the 256-bit kernels (shared by the AVX2 and AVX-512 sets).
void fill_x86_256(CpuKernels& k) {
    k.q4_0 = vec_dot_q4_0_q8_0_x86;
    k.q4_1 = vec_dot_q4_1_q8_1_x86;
    k.q5_0 = vec_dot_q5_0_q8_0_x86;
    k.q5_0_cols = vec_dot_cols_q5_0_q8_0_x86;
    k.q5_1 = vec_dot_q5_1_q8_1_x86;
    k.q8_0 = vec_dot_q8_0_q8_0_x86;
    k.q2_k = vec_dot_q2_k_q8_k_x86;
    k.q3_k = vec_dot_q3_k_q8_k_x86;
    k.q4_k = vec_dot_q4_k_q8_k_x86;
    k.q5_k = vec_dot_q5_k_q8_k_x86;
    k.q6_k = vec_dot_q6_k_q8_k_x86;
    k.iq4_nl = vec_dot_iq4_nl_q8_0_x86;
    k.iq4_xs = vec_dot_iq4_xs_q8_k_x86;
    k.f8_e4m3 = vec_dot_f8_e4m3_q8_0_x86;
    k.mxfp4 = vec_dot_mxfp4_q8_0_x86;
    k.f16 = vec_dot_f16_f16_x86;
    k.bf16 = vec_dot_bf16_bf16_x86;
    k.f32 = vec_dot_f32_f32_x86;
    k.quantize[static_cast<int>(ActFormat::q8_0)] = quantize_act_q8_0_x86;
    k.quantize[static_cast<int>(ActFormat::q8_1)] = quantize_act_q8_1_x86;
    k.quantize[static_cast<int>(ActFormat::q8_k)] = quantize_act_q8_k_x86;
    k.quantize[static_cast<int>(ActFormat::f16)] = quantize_act_f16_x86;
}

} // namespace
} // namespace tern
