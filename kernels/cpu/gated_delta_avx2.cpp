// AVX2 + FMA gated delta rule (gated_delta.h): the algorithms of gated_delta_impl.inl over 8-lane primitives
// (the rows of the state and the keys, queries and deltas along d_k / d_v), scalar tails. The sums run in
// another order than the twins', so the results agree to rounding, not bit for bit.
#include "kernels/cpu/gated_delta.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/cpu/avx2_sum.h"

#include "kernels/cpu/gated_delta_impl.inl"

namespace tern {
namespace {

struct Avx2Ops {
    static float dot(const float* a, const float* b, int n) {
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
        }
        for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        float s = hsum(_mm256_add_ps(acc0, acc1));
        for (; i < n; ++i) s += a[i] * b[i];
        return s;
    }
    static void dot2(const float* s, const float* k, const float* q, int n, float& sk, float& sq) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
        int i = 0;
        for (; i + 16 <= n; i += 16) {
            const __m256 x0 = _mm256_loadu_ps(s + i), x1 = _mm256_loadu_ps(s + i + 8);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k + i), a0);
            b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(q + i), b0);
            a1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(k + i + 8), a1);
            b1 = _mm256_fmadd_ps(x1, _mm256_loadu_ps(q + i + 8), b1);
        }
        for (; i + 8 <= n; i += 8) {
            const __m256 x0 = _mm256_loadu_ps(s + i);
            a0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(k + i), a0);
            b0 = _mm256_fmadd_ps(x0, _mm256_loadu_ps(q + i), b0);
        }
        float a = hsum(_mm256_add_ps(a0, a1)), b = hsum(_mm256_add_ps(b0, b1));
        for (; i < n; ++i) {
            a += s[i] * k[i];
            b += s[i] * q[i];
        }
        sk = a, sq = b;
    }
    static void scale_axpy(float* s, float c, float d, const float* k, int n) {
        const __m256 vc = _mm256_set1_ps(c), vd = _mm256_set1_ps(d);
        int i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(s + i, _mm256_fmadd_ps(vd, _mm256_loadu_ps(k + i), _mm256_mul_ps(vc, _mm256_loadu_ps(s + i))));
        for (; i < n; ++i) s[i] = c * s[i] + d * k[i];
    }
    static void axpy(float* y, float c, const float* x, int n) {
        const __m256 vc = _mm256_set1_ps(c);
        int i = 0;
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vc, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
        for (; i < n; ++i) y[i] += c * x[i];
    }
    static void scale(float* y, float c, int n) {
        const __m256 vc = _mm256_set1_ps(c);
        int i = 0;
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), vc));
        for (; i < n; ++i) y[i] *= c;
    }
};

void recurrent_avx2(const GatedDeltaArgs& a, int h_begin, int h_end) { recurrent_heads<Avx2Ops>(a, h_begin, h_end); }
void chunked_avx2(const GatedDeltaArgs& a, int h_begin, int h_end) { chunked_heads<Avx2Ops>(a, h_begin, h_end); }

} // namespace

void fill_gated_delta_avx2(CpuKernels& k) {
    k.gated_delta_recurrent = recurrent_avx2;
    k.gated_delta_chunked = chunked_avx2;
}

} // namespace tern
#endif
