// AVX2 + FMA causal conv1d (causal_conv1d.h), eight channels a vector: the scalar twin's fma chain and silu_f32's
// steps lane by lane, so the bits are the twin's. The tail channels go to the twin.
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/silu.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <vector>

namespace tern {
namespace {

// silu_f32 on 8 lanes: x / (1 + exp_f32(-x)), exp_f32's steps (silu.h).
inline __m256 silu8(__m256 x) {
    using namespace silu_detail;
    __m256 t = _mm256_sub_ps(_mm256_setzero_ps(), x);
    t = _mm256_min_ps(t, _mm256_set1_ps(kHi));
    t = _mm256_max_ps(t, _mm256_set1_ps(kLo));
    const __m256 nf = _mm256_round_ps(_mm256_mul_ps(t, _mm256_set1_ps(kLog2e)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-kLn2Hi), t);
    r = _mm256_fmadd_ps(nf, _mm256_set1_ps(-kLn2Lo), r);
    __m256 p = _mm256_set1_ps(kC[0]);
    for (int k = 1; k < 8; ++k) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kC[k]));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nf), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

template <int D> void conv_block8(const CausalConv1dArgs& a, int64_t c) {
    __m256 taps[D], win[D];
    for (int i = 0; i < D; ++i) {
        alignas(32) float t[8];
        for (int l = 0; l < 8; ++l) t[l] = a.w[(c + l) * D + i];
        taps[i] = _mm256_load_ps(t);
    }
    for (int i = 0; i + 1 < D; ++i) win[i] = _mm256_loadu_ps(a.state + i * a.channels + c);
    for (int64_t t = 0; t < a.n_tokens; ++t) {
        win[D - 1] = _mm256_loadu_ps(a.x + t * a.x_stride + c);
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < D; ++i) acc = _mm256_fmadd_ps(taps[i], win[i], acc);
        _mm256_storeu_ps(a.y + t * a.y_stride + c, a.silu ? silu8(acc) : acc);
        for (int i = 0; i + 1 < D; ++i) win[i] = win[i + 1];
    }
    for (int i = 0; i + 1 < D; ++i) _mm256_storeu_ps(a.state + i * a.channels + c, win[i]);
}

// Many tokens: the taps transposed once to [tap][channel] (per-thread scratch), then token after token with the
// channels side by side, so every row of x is read in order.
template <int D> void conv_rows(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end) {
    const int64_t nc = (c_end - c_begin) / 8 * 8;
    thread_local std::vector<float> wt;
    wt.resize(static_cast<size_t>(D * nc));
    for (int64_t c = 0; c < nc; ++c)
        for (int i = 0; i < D; ++i) wt[static_cast<size_t>(i * nc + c)] = a.w[(c_begin + c) * D + i];
    const float* rows[D];
    for (int64_t t = 0; t < a.n_tokens; ++t) {
        for (int i = 0; i < D; ++i) rows[i] = causal_conv1d_input_row(a, t + i) + c_begin;
        float* yt = a.y + t * a.y_stride + c_begin;
        for (int64_t c = 0; c < nc; c += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int i = 0; i < D; ++i)
                acc = _mm256_fmadd_ps(_mm256_loadu_ps(wt.data() + i * nc + c), _mm256_loadu_ps(rows[i] + c), acc);
            _mm256_storeu_ps(yt + c, a.silu ? silu8(acc) : acc);
        }
    }
    causal_conv1d_shift_state(a, c_begin, c_begin + nc);
    causal_conv1d_scalar(a, c_begin + nc, c_end);
}

// A few tokens (decode): eight channels at a time with their window in registers, no scratch.
template <int D> void conv_range(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end) {
    if (a.n_tokens >= 4) return conv_rows<D>(a, c_begin, c_end);
    int64_t c = c_begin;
    for (; c + 8 <= c_end; c += 8) conv_block8<D>(a, c);
    causal_conv1d_scalar(a, c, c_end);
}

void causal_conv1d_avx2(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end) {
    switch (a.d_conv) {
        case 2: conv_range<2>(a, c_begin, c_end); return;
        case 3: conv_range<3>(a, c_begin, c_end); return;
        case 4: conv_range<4>(a, c_begin, c_end); return;
        case 5: conv_range<5>(a, c_begin, c_end); return;
        case 6: conv_range<6>(a, c_begin, c_end); return;
        case 7: conv_range<7>(a, c_begin, c_end); return;
        case 8: conv_range<8>(a, c_begin, c_end); return;
        default: causal_conv1d_scalar(a, c_begin, c_end); return;
    }
}

} // namespace

void fill_causal_conv1d_avx2(CpuKernels& k) { k.causal_conv1d = causal_conv1d_avx2; }

} // namespace tern
#endif
