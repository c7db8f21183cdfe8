// AVX2 + FMA SwiGLU (silu.h): the scalar twin's steps on 8 lanes, the tail by the twin itself.
#include "kernels/cpu/silu.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace tern {
namespace {

void swiglu_avx2(const float* gate, const float* up, float* y, int64_t n) {
    using namespace silu_detail;
    const __m256 hi = _mm256_set1_ps(kHi), lo = _mm256_set1_ps(kLo), log2e = _mm256_set1_ps(kLog2e);
    const __m256 ln2_hi = _mm256_set1_ps(-kLn2Hi), ln2_lo = _mm256_set1_ps(-kLn2Lo), one = _mm256_set1_ps(1.0f);
    const __m256 zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(gate + i);
        __m256 t = _mm256_sub_ps(zero, x);   // -x, exactly
        t = _mm256_min_ps(t, hi);
        t = _mm256_max_ps(t, lo);
        const __m256 nf = _mm256_round_ps(_mm256_mul_ps(t, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        __m256 r = _mm256_fmadd_ps(nf, ln2_hi, t);
        r = _mm256_fmadd_ps(nf, ln2_lo, r);
        __m256 p = _mm256_set1_ps(kC[0]);
        for (int k = 1; k < 8; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[k]));
        const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nf), _mm256_set1_epi32(127)), 23);
        const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
        const __m256 silu = _mm256_div_ps(x, _mm256_add_ps(one, e));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(silu, _mm256_loadu_ps(up + i)));
    }
    swiglu_rows_scalar(gate + i, up + i, y + i, n - i);
}

} // namespace

void fill_swiglu_avx2(CpuKernels& k) { k.swiglu = swiglu_avx2; }

} // namespace tern
#endif
