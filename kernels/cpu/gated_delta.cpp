// The scalar twins of the gated delta rule (gated_delta.h), its gates and L2 norm, and the calls through the
// dispatch table.
#include "kernels/cpu/gated_delta.h"

#include <cmath>

#include "kernels/cpu/gated_delta_impl.inl"

namespace tern {
namespace {

struct ScalarOps {
    static float dot(const float* a, const float* b, int n) {
        float s = 0.0f;
        for (int i = 0; i < n; ++i) s += a[i] * b[i];
        return s;
    }
    static void dot2(const float* s, const float* k, const float* q, int n, float& sk, float& sq) {
        float a = 0.0f, b = 0.0f;
        for (int i = 0; i < n; ++i) {
            a += s[i] * k[i];
            b += s[i] * q[i];
        }
        sk = a, sq = b;
    }
    static void scale_axpy(float* s, float c, float d, const float* k, int n) {
        for (int i = 0; i < n; ++i) s[i] = c * s[i] + d * k[i];
    }
    static void axpy(float* y, float c, const float* x, int n) {
        for (int i = 0; i < n; ++i) y[i] += c * x[i];
    }
    static void scale(float* y, float c, int n) {
        for (int i = 0; i < n; ++i) y[i] *= c;
    }
};

} // namespace

void gated_delta_recurrent_scalar(const GatedDeltaArgs& a, int h_begin, int h_end) {
    recurrent_heads<ScalarOps>(a, h_begin, h_end);
}

void gated_delta_chunked_scalar(const GatedDeltaArgs& a, int h_begin, int h_end) {
    chunked_heads<ScalarOps>(a, h_begin, h_end);
}

void gated_delta(const GatedDeltaArgs& a) { cpu_kernels().gated_delta_recurrent(a, 0, a.n_v_heads); }

void gated_delta_gates(const float* alpha, const float* beta_in, const float* dt_bias, const float* a_neg_exp,
                       float* g, float* beta, int n_v_heads) {
    for (int h = 0; h < n_v_heads; ++h) {
        const float x = alpha[h] + dt_bias[h];
        const float sp = x > 20.0f ? x : static_cast<float>(std::log1p(std::exp(static_cast<double>(x))));
        g[h] = sp * a_neg_exp[h];
        beta[h] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(beta_in[h]))));
    }
}

void l2_normalize_heads(float* x, int64_t n_heads, int64_t d, float eps) {
    for (int64_t j = 0; j < n_heads; ++j) {
        float* xh = x + j * d;
        double ss = 0.0;
        for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(xh[i]) * xh[i];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss + static_cast<double>(eps)));
        for (int64_t i = 0; i < d; ++i) xh[i] *= inv;
    }
}

} // namespace tern
