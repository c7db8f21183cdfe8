// The scalar twin of the causal conv1d (causal_conv1d.h) and the call through the dispatch table.
#include "kernels/cpu/causal_conv1d.h"

#include <cmath>
#include <stdexcept>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"

namespace tern {

void causal_conv1d_scalar(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end) {
    const int d = a.d_conv;
    if (d < 1 || d > kMaxConvTaps) throw std::invalid_argument("causal_conv1d: d_conv out of [1, 64]");
    float window[kMaxConvTaps];   // one channel's window: d_conv - 1 state values, then the current input
    for (int64_t c = c_begin; c < c_end; ++c) {
        const float* wc = a.w + c * d;
        for (int i = 0; i + 1 < d; ++i) window[i] = a.state[i * a.channels + c];
        for (int64_t t = 0; t < a.n_tokens; ++t) {
            window[d - 1] = a.x[t * a.x_stride + c];
            float acc = 0.0f;
            for (int i = 0; i < d; ++i) acc = std::fma(wc[i], window[i], acc);
            a.y[t * a.y_stride + c] = a.silu ? silu_f32(acc) : acc;
            for (int i = 0; i + 1 < d; ++i) window[i] = window[i + 1];
        }
        for (int i = 0; i + 1 < d; ++i) a.state[i * a.channels + c] = window[i];
    }
}

void causal_conv1d(const CausalConv1dArgs& a) { cpu_kernels().causal_conv1d(a, 0, a.channels); }

} // namespace tern
