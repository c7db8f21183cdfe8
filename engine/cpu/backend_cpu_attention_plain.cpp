// The CPU backend's reference attention, for RunOptions::exact_matmul over an f32 cache: per query head,
// every visible score, one softmax over them all, then the weighted sum of V (kernels/cpu/ops.h
// attention_head). The flash kernels (backend_cpu_attention.cpp) reach the same numbers up to rounding by
// merging chunk states; this is the plain arithmetic that quantize --calibrate's statistics are defined
// by (engine/quantize/calibration.h), so they do not move when the fast kernels change. Each (token, head)
// is computed alone, so the result is the same for any batch and any thread count.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "base/parallel_for.h"
#include "engine/cpu/backend_cpu.h"
#include "kernels/cpu/ops.h"

namespace tern {

void CpuBackend::attend_plain(int32_t l, int32_t pos0, int64_t n, const float* q, float* att) {
    const ModelConfig& c = config_;
    const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
    const int64_t group = lc.n_heads / lc.n_kv_heads;
    const int64_t q_dim = lc.n_heads * c.head_dim, att_dim = lc.n_heads * c.head_dim_v;
    parallel_for(n, threads_for_work(n * (pos0 + n) * lc.n_heads * c.head_dim, n_threads_), 8, [&](int64_t i0, int64_t i1) {
        std::vector<float> scores(static_cast<size_t>(pos0 + i1));
        for (int64_t i = i0; i < i1; ++i) {
            const int64_t pos = pos0 + i;
            const int64_t lo = lc.sliding_window > 0 ? std::max<int64_t>(0, pos - lc.sliding_window + 1) : 0;
            for (int64_t h = 0; h < lc.n_heads; ++h) {
                const auto g = static_cast<int32_t>(h / group);
                const auto* k = static_cast<const float*>(kv_.k_head(l, g)) + lo * c.head_dim;
                const auto* v = static_cast<const float*>(kv_.v_head(l, g)) + lo * c.head_dim_v;
                attention_head(q + i * q_dim + h * c.head_dim, k, v, KvElem::f32, pos - lo + 1, c.head_dim,
                               c.head_dim_v, c.attn_scale, c.attn_softcap, scores.data(), att + i * att_dim + h * c.head_dim_v);
            }
        }
    });
}

} // namespace tern
