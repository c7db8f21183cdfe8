// AVX-512 kernel set: F + BW + VL + VNNI (compiled with those flags, kernels/CMakeLists.txt).
//   * Q4_0, Q8_0, F16, BF16, F32: 512-bit kernels below, two 32-element blocks per zmm; F8_E4M3 one block
//     per zmm in 16-bit lanes.
//   * everything else: the 256-bit kernels of dot_x86.inl compiled here with VNNI, where one vpdpbusd
//     replaces vpmaddubsw + vpmaddwd. The k-quants gain little from 512 bits: their per-sub-block scales
//     change every 16-32 elements, and decode is memory bound anyway (see the report's GB/s table).
// Same caveat about shared inline helpers as dot_avx2.cpp.
#include "kernels/cpu/dispatch.h"

#if defined(__x86_64__)
// gcc 12's avx512fintrin.h builds many intrinsics on a deliberately undefined register (__Y), which
// -Wuninitialized reports once per inlined use: a known false positive of the header, not of this code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "kernels/cpu/dot_x86.inl"

namespace tern {
namespace {

inline __m512i load2x256(const void* lo, const void* hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(lo))),
                              _mm256_loadu_si256(static_cast<const __m256i*>(hi)), 1);
}

// Scales of two blocks: lanes 0-7 take d0, lanes 8-15 d1 (matching the i32 lanes of the two blocks).
inline __m512 scale2(float d0, float d1) { return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(d0), _mm512_set1_ps(d1)); }

float vec_dot_q4_0_q8_0_avx512(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const int64_t nb = n / QK4_0;
    const __m512i m4 = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const __m256i n0 = nibbles32(wb[b].qs), n1 = nibbles32(wb[b + 1].qs);
        const __m512i q = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(n0), n1, 1), m4);
        const __m512i a = load2x256(xb[b].qs, xb[b + 1].qs);
        // sum((q - 8) * a) = sum(q * a) - sum(8 * a): both unsigned-by-signed, so vpdpbusd takes them as is.
        const __m512i p = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a),
                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, a));
        const __m512 d = scale2(f16s(wb[b].d) * f16s(xb[b].d), f16s(wb[b + 1].d) * f16s(xb[b + 1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float s = _mm512_reduce_add_ps(acc);
    if (b < nb) s += vec_dot_q4_0_q8_0_x86(QK4_0, wb + b, xb + b);
    return s;
}

float vec_dot_q8_0_q8_0_avx512(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ8_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const int64_t nb = n / QK8_0;
    __m512 acc = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + 1 < nb; b += 2) {
        const __m512i q = load2x256(wb[b].qs, wb[b + 1].qs);
        const __m512i a = load2x256(xb[b].qs, xb[b + 1].qs);
        // |q| (128 for -128 is fine: vpdpbusd does not saturate) times a with q's sign.
        const __m512i sa = _mm512_mask_sub_epi8(a, _mm512_movepi8_mask(q), _mm512_setzero_si512(), a);
        const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(q), sa);
        const __m512 d = scale2(f16s(wb[b].d) * f16s(xb[b].d), f16s(wb[b + 1].d) * f16s(xb[b + 1].d));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(p), acc);
    }
    float s = _mm512_reduce_add_ps(acc);
    if (b < nb) s += vec_dot_q8_0_q8_0_x86(QK8_0, wb + b, xb + b);
    return s;
}

// F8_E4M3 weights, Q8_0 activations: the same exact integer block sum as vec_dot_f8_e4m3_q8_0_x86, one block
// per zmm in 16-bit lanes. A code times 512 is mag << s (normal: mag = 8 + m, s = e - 1; subnormal: mag = m,
// s = 0), which does not fit 16 bits, but mag << (s mod 8) does (<= 1920); so the lanes with s >= 8 are summed
// apart by vpmaddwd and that sum shifted by 8: isum = S0 + (S1 << 8), exact (|S1 << 8| < 2^27). About 20
// instructions a block instead of the 256-bit kernel's ~60: this dot is compute-bound in prefill and decode.
float vec_dot_f8_e4m3_q8_0_avx512(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockF8_E4M3*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    const __m512i c15 = _mm512_set1_epi16(15), c7 = _mm512_set1_epi16(7), c8 = _mm512_set1_epi16(8);
    const __m512i one = _mm512_set1_epi16(1), sign = _mm512_set1_epi16(0x80), zero = _mm512_setzero_si512();
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / QK_F8; ++b) {
        const __m512i q = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb[b].qs)));
        const __m512i a = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb[b].qs)));
        const __m512i e = _mm512_and_si512(_mm512_srli_epi16(q, 3), c15);
        const __m512i m = _mm512_and_si512(q, c7);
        const __m512i mag = _mm512_mask_add_epi16(m, _mm512_test_epi16_mask(e, e), m, c8);
        const __m512i s = _mm512_subs_epu16(e, one);   // e - 1, and 0 for subnormals (e = 0)
        __m512i v = _mm512_sllv_epi16(mag, _mm512_and_si512(s, c7));
        v = _mm512_mask_sub_epi16(v, _mm512_test_epi16_mask(q, sign), zero, v);
        const __mmask32 high = _mm512_cmpge_epu16_mask(s, c8);
        const __m512i s0 = _mm512_madd_epi16(_mm512_maskz_mov_epi16(static_cast<__mmask32>(~high), v), a);
        const __m512i s1 = _mm512_madd_epi16(_mm512_maskz_mov_epi16(high, v), a);
        const __m512i isum = _mm512_add_epi32(s0, _mm512_slli_epi32(s1, 8));
        const float d = f16s(wb[b].d) * f16s(xb[b].d) * (1.0f / 512.0f);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(isum), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

float vec_dot_f16_f16_avx512(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    // Four independent accumulators: two FMA ports x 4-cycle latency want at least 8 in flight for in-cache
    // rows; 4 keeps the conversions (one port) as the limit.
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    int64_t i = 0;
    for (; i + 64 <= n; i += 64)
        for (int k = 0; k < 4; ++k)
            acc[k] = _mm512_fmadd_ps(_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i + 16 * k))),
                                     _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 16 * k))),
                                     acc[k]);
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
    if (i < n) s += vec_dot_f16_f16_x86(n - i, a + i, b + i);
    return s;
}

inline __m512 bf16x16(const uint16_t* p) {
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

float vec_dot_bf16_bf16_avx512(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(bf16x16(a + i), bf16x16(b + i), acc0);
        acc1 = _mm512_fmadd_ps(bf16x16(a + i + 16), bf16x16(b + i + 16), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if (i < n) s += vec_dot_bf16_bf16_x86(n - i, a + i, b + i);
    return s;
}

float vec_dot_f32_f32_avx512(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const float*>(w);
    const auto* b = static_cast<const float*>(x);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
        acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if (i < n) s += vec_dot_f32_f32_x86(n - i, a + i, b + i);
    return s;
}

} // namespace

void fill_cpu_kernels_avx512(CpuKernels& k) {
    fill_x86_256(k);   // the 256-bit kernels, here compiled with VNNI
    k.q4_0 = vec_dot_q4_0_q8_0_avx512;
    k.q8_0 = vec_dot_q8_0_q8_0_avx512;
    k.f8_e4m3 = vec_dot_f8_e4m3_q8_0_avx512;
    k.f16 = vec_dot_f16_f16_avx512;
    k.bf16 = vec_dot_bf16_bf16_avx512;
    k.f32 = vec_dot_f32_f32_avx512;
}

} // namespace tern
#endif
