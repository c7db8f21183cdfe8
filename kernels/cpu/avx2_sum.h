#pragma once
// The horizontal sum of an AVX2 register, for the *_avx2.cpp kernels only (the including file is compiled with
// -mavx2; a TU without it must not include this). Static so that no copy compiled elsewhere can stand in for it.
#if defined(__x86_64__)
#include <immintrin.h>

namespace tern {

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace tern
#endif
