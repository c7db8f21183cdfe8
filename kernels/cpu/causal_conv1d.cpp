// The scalar twin of the causal conv1d (causal_conv1d.h) and the call through the dispatch table.
#include "kernels/cpu/causal_conv1d.h"

#include <cmath>
#include <stdexcept>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"

namespace tern {

// Token after token, the channels of a token side by side (the rows of x are read in order, not one float a
// row per channel); the taps of the window come from the state's rows, then x's.
void causal_conv1d_scalar(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end) {
    const int d = a.d_conv;
    if (d < 1 || d > kMaxConvTaps) throw std::invalid_argument("causal_conv1d: d_conv out of [1, 64]");
    const float* rows[kMaxConvTaps];
    for (int64_t t = 0; t < a.n_tokens; ++t) {
        for (int i = 0; i < d; ++i) rows[i] = causal_conv1d_input_row(a, t + i);
        float* yt = a.y + t * a.y_stride;
        for (int64_t c = c_begin; c < c_end; ++c) {
            const float* wc = a.w + c * d;
            float acc = 0.0f;
            for (int i = 0; i < d; ++i) acc = std::fma(wc[i], rows[i][c], acc);
            yt[c] = a.silu ? silu_f32(acc) : acc;
        }
    }
    causal_conv1d_shift_state(a, c_begin, c_end);
}

const float* causal_conv1d_input_row(const CausalConv1dArgs& a, int64_t r) {
    return r < a.d_conv - 1 ? a.state + r * a.channels : a.x + (r - (a.d_conv - 1)) * a.x_stride;
}

void causal_conv1d_shift_state(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end) {
    if (a.n_tokens <= 0) return;
    // New row r is input row n + r >= r: rows in increasing order read old state rows not yet overwritten.
    for (int r = 0; r + 1 < a.d_conv; ++r) {
        const float* src = causal_conv1d_input_row(a, a.n_tokens + r);
        float* dst = a.state + r * a.channels;
        for (int64_t c = c_begin; c < c_end; ++c) dst[c] = src[c];
    }
}

void causal_conv1d(const CausalConv1dArgs& a) { cpu_kernels().causal_conv1d(a, 0, a.channels); }

} // namespace tern
