// The CPU backend's reference attention, for RunOptions::exact_matmul over an f32 cache: per query head,
// every visible score, one softmax over them all, then the weighted sum of V (kernels/cpu/ops.h
// attention_head). The flash kernels (backend_cpu_attention.cpp) reach the same numbers up to rounding by
// merging chunk states; this is the plain arithmetic that quantize --calibrate's statistics are defined
// by (engine/quantize/calibration.h), so they do not move when the fast kernels change. Each (token, head)
// is computed alone, so the result is the same for any batch and any thread count.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "base/parallel_for.h"
#include "engine/cpu/backend_cpu.h"
#include "kernels/cpu/ops.h"

namespace tern {

void CpuBackend::attend_plain(int32_t l, int32_t seq, int32_t pos0, int64_t n, const float* q, float* att) {
    const ModelConfig& c = config_;
    const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
    const int64_t group = lc.n_heads / lc.n_kv_heads;
    const int64_t head_dim = c.head_dim_of(l), head_dim_v = c.head_dim_v_of(l);
    const int64_t q_dim = lc.n_heads * head_dim, att_dim = lc.n_heads * head_dim_v;
    const int32_t kl = kv_layer(l);   // the layer whose cache it reads (its own, or gemma4's shared one)
    const std::vector<float>& sinks = layer_vectors_[static_cast<size_t>(l)][LayerRole::attn_sinks];   // gpt-oss, else empty
    parallel_for(n, threads_for_work(n * (pos0 + n) * lc.n_heads * head_dim, n_threads_), 8, [&](int64_t i0, int64_t i1) {
        std::vector<float> scores(static_cast<size_t>(pos0 + i1));
        std::vector<float> k, v;   // one KV head's visible rows, gathered from their pages
        for (int64_t i = i0; i < i1; ++i) {
            const auto pos = static_cast<int32_t>(pos0 + i);
            const int32_t lo = lc.sliding_window > 0 ? std::max(0, pos - lc.sliding_window + 1) : 0;
            const auto rows = static_cast<size_t>(pos - lo + 1);
            for (int64_t h = 0; h < lc.n_heads; ++h) {
                const auto g = static_cast<int32_t>(h / group);
                if (h % group == 0) {
                    k.resize(rows * static_cast<size_t>(head_dim));
                    v.resize(rows * static_cast<size_t>(head_dim_v));
                    for (size_t r = 0; r < rows; ++r) {
                        const int32_t at = lo + static_cast<int32_t>(r);
                        std::memcpy(k.data() + r * static_cast<size_t>(head_dim), kv_.k_row(kl, g, at, seq),
                                    sizeof(float) * static_cast<size_t>(head_dim));
                        std::memcpy(v.data() + r * static_cast<size_t>(head_dim_v), kv_.v_row(kl, g, at, seq),
                                    sizeof(float) * static_cast<size_t>(head_dim_v));
                    }
                }
                attention_head(q + i * q_dim + h * head_dim, k.data(), v.data(), KvElem::f32, pos - lo + 1, head_dim,
                               head_dim_v, c.attn_scale, c.attn_softcap, scores.data(),
                               att + i * att_dim + h * head_dim_v,
                               sinks.empty() ? nullptr : &sinks[static_cast<size_t>(h)]);
            }
        }
    });
}

} // namespace tern
