// AVX-512 gated delta rule (gated_delta.h): the algorithms of gated_delta_impl.inl over 16-lane primitives, with
// masked loads and stores for the tails (no scalar remainder). Equal to the twins to rounding, like the AVX2 set.
#include "kernels/cpu/gated_delta.h"

#if defined(__x86_64__)
// gcc 12's avx512fintrin.h builds intrinsics on a deliberately undefined register: -Wuninitialized false
// positives of the header (dot_avx512.cpp says the same).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "kernels/cpu/gated_delta_impl.inl"

namespace tern {
namespace {

inline __mmask16 tail_mask(int left) { return static_cast<__mmask16>((1u << left) - 1u); }

struct Avx512Ops {
    static float dot(const float* a, const float* b, int n) {
        __m512 acc = _mm512_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc);
        if (i < n) {
            const __mmask16 m = tail_mask(n - i);
            acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
        }
        return _mm512_reduce_add_ps(acc);
    }
    static void dot2(const float* s, const float* k, const float* q, int n, float& sk, float& sq) {
        __m512 a = _mm512_setzero_ps(), b = _mm512_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m512 x = _mm512_loadu_ps(s + i);
            a = _mm512_fmadd_ps(x, _mm512_loadu_ps(k + i), a);
            b = _mm512_fmadd_ps(x, _mm512_loadu_ps(q + i), b);
        }
        if (i < n) {
            const __mmask16 m = tail_mask(n - i);
            const __m512 x = _mm512_maskz_loadu_ps(m, s + i);
            a = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(m, k + i), a);
            b = _mm512_fmadd_ps(x, _mm512_maskz_loadu_ps(m, q + i), b);
        }
        sk = _mm512_reduce_add_ps(a), sq = _mm512_reduce_add_ps(b);
    }
    static void scale_axpy(float* s, float c, float d, const float* k, int n) {
        const __m512 vc = _mm512_set1_ps(c), vd = _mm512_set1_ps(d);
        int i = 0;
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(s + i, _mm512_fmadd_ps(vd, _mm512_loadu_ps(k + i), _mm512_mul_ps(vc, _mm512_loadu_ps(s + i))));
        if (i < n) {
            const __mmask16 m = tail_mask(n - i);
            _mm512_mask_storeu_ps(s + i, m, _mm512_fmadd_ps(vd, _mm512_maskz_loadu_ps(m, k + i),
                                                            _mm512_mul_ps(vc, _mm512_maskz_loadu_ps(m, s + i))));
        }
    }
    static void axpy(float* y, float c, const float* x, int n) {
        const __m512 vc = _mm512_set1_ps(c);
        int i = 0;
        for (; i + 16 <= n; i += 16)
            _mm512_storeu_ps(y + i, _mm512_fmadd_ps(vc, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
        if (i < n) {
            const __mmask16 m = tail_mask(n - i);
            _mm512_mask_storeu_ps(y + i, m,
                                  _mm512_fmadd_ps(vc, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
        }
    }
    static void scale(float* y, float c, int n) {
        const __m512 vc = _mm512_set1_ps(c);
        int i = 0;
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), vc));
        if (i < n) {
            const __mmask16 m = tail_mask(n - i);
            _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), vc));
        }
    }
};

void recurrent_avx512(const GatedDeltaArgs& a, int h_begin, int h_end) {
    recurrent_heads<Avx512Ops>(a, h_begin, h_end);
}
void chunked_avx512(const GatedDeltaArgs& a, int h_begin, int h_end) { chunked_heads<Avx512Ops>(a, h_begin, h_end); }

} // namespace

void fill_gated_delta_avx512(CpuKernels& k) {
    k.gated_delta_recurrent = recurrent_avx512;
    k.gated_delta_chunked = chunked_avx512;
}

} // namespace tern
#endif
