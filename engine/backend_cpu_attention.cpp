// The CPU backend's attention: each query token against the cached K/V of its layer, through the
// flash-style kernels of kernels/cpu/attention.h (chunks at absolute positions, so a token's output is
// the same bits alone, in a prefill batch or in a draft-verification batch, for any thread count).
#include <vector>

#include "engine/backend_cpu.h"
#include "kernels/cpu/attention.h"

namespace tern {

// Token i (position pos0 + i) sees positions [lo, pos0 + i]: causal, and a sliding window keeps only
// q - k < window. Query head h reads KV head h / (n_heads / n_kv_heads).
void CpuBackend::attend(int32_t l, int32_t pos0, int64_t n, const float* q, float* att) {
    const ModelConfig& c = config_;
    const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
    AttnParams p;
    p.format = kv_.format();
    p.head_dim = c.head_dim;
    p.head_dim_v = c.head_dim_v;
    p.group = lc.n_heads / lc.n_kv_heads;
    p.scale = c.attn_scale;
    p.softcap = c.attn_softcap;
    std::vector<const void*> k_heads(static_cast<size_t>(lc.n_kv_heads)), v_heads(k_heads.size());
    for (int32_t g = 0; g < lc.n_kv_heads; ++g) {
        k_heads[static_cast<size_t>(g)] = kv_.k_head(l, g);
        v_heads[static_cast<size_t>(g)] = kv_.v_head(l, g);
    }
    attend_tokens(p, attn_chunk_kernel(p), lc.n_kv_heads, k_heads.data(), v_heads.data(), pos0, n, lc.sliding_window,
                  q, lc.n_heads * c.head_dim, att, lc.n_heads * c.head_dim_v, n_threads_);
}

} // namespace tern
