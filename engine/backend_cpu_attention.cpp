// The CPU backend's attention: each query token against the cached K/V of its layer.
#include <algorithm>
#include <vector>

#include "engine/backend_cpu.h"
#include "kernels/cpu/ops.h"

namespace tern {

// Token i (position pos0 + i) sees positions [lo, pos0 + i]: causal, and a sliding window keeps only
// q - k < window. Query head h reads KV head h / (n_heads / n_kv_heads).
void CpuBackend::attend(int32_t l, int32_t pos0, int64_t n, const float* q, float* att) {
    const ModelConfig& c = config_;
    const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
    const int64_t n_heads = lc.n_heads, n_kv_heads = lc.n_kv_heads;
    const int64_t head_dim = c.head_dim, head_dim_v = c.head_dim_v;
    const int64_t q_dim = n_heads * head_dim, att_dim = n_heads * head_dim_v;
    const int64_t group = n_heads / n_kv_heads;
    const int attn_threads = threads_for_work(n * n_heads * (pos0 + n) * (head_dim + head_dim_v), n_threads_);
#pragma omp parallel num_threads(attn_threads)
    {
        std::vector<float> scores(static_cast<size_t>(pos0 + n)); // (n_keys) f32
#pragma omp for schedule(static) collapse(2)
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t h = 0; h < n_heads; ++h) {
                const int32_t pos = pos0 + static_cast<int32_t>(i);
                const int32_t lo = lc.sliding_window > 0 ? std::max(0, pos - lc.sliding_window + 1) : 0;
                const int32_t g = static_cast<int32_t>(h / group);
                attention_head(q + i * q_dim + h * head_dim, kv_.k_row(l, g, lo), kv_.v_row(l, g, lo), kv_.elem(),
                               pos - lo + 1, head_dim, head_dim_v, c.attn_scale, c.attn_softcap, scores.data(),
                               att + i * att_dim + h * head_dim_v);
            }
        }
    }
}

} // namespace tern
