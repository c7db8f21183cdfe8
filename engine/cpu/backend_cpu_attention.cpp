// The CPU backend's attention: each query token against the cached K/V of its layer, through the
// flash-style kernels of kernels/cpu/attention.h (chunks at absolute positions, so a token's output is
// the same bits alone, in a prefill batch or in a draft-verification batch, for any thread count).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/cpu/backend_cpu.h"
#include "kernels/cpu/attention.h"

namespace tern {
namespace {

// Above this the hardware prefetchers keep up with the longer streams and the requests would only crowd out
// the first chunks' lines.
constexpr size_t kMaxKvPrefetchBytes = 512u << 10;

void prefetch_lines(const void* p, size_t bytes) {
    const auto* b = static_cast<const char*>(p);
    for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(b + o, 0, 2);
}

} // namespace

// Token i (position pos0 + i) sees positions [lo, pos0 + i]: causal, and a sliding window keeps only
// q - k < window. Query head h reads KV head h / (n_heads / n_kv_heads).
void CpuBackend::attend(int32_t l, int32_t seq, int32_t pos0, int64_t n, const float* q, float* att) {
    const ModelConfig& c = config_;
    const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
    AttnParams p;
    p.format = kv_.format();
    p.head_dim = c.head_dim_of(l);
    p.head_dim_v = c.head_dim_v_of(l);
    const int32_t kl = kv_layer(l);   // the layer whose cache it reads (its own, or gemma4's shared one)
    p.group = lc.n_heads / lc.n_kv_heads;
    p.scale = c.attn_scale;
    p.softcap = c.attn_softcap;
    const std::vector<float>& sinks = layer_vectors_[static_cast<size_t>(l)][LayerRole::attn_sinks];
    p.sinks = sinks.empty() ? nullptr : sinks.data();
    const KvPagesView kv = kv_.pages_view(kl, seq);
    // Decode reads a few KiB of each head's K and V, which the weight stream has pushed out of the caches: asked
    // for all at once, they arrive at the memory's bandwidth instead of one latency per head's stream (llama-1b
    // Q4_0 at up to 64 positions, 2 threads: attention 416-461 -> 356-378 us per token, interleaved runs).
    if (n <= 4) {
        const int32_t lo = lc.sliding_window > 0 ? std::max(0, pos0 - lc.sliding_window + 1) : 0;
        const int32_t hi = pos0 + static_cast<int32_t>(n);   // one past the last visible position
        const size_t k_row = kv_row_bytes(p.format, p.head_dim), v_row = kv_row_bytes(p.format, p.head_dim_v);
        if (static_cast<size_t>(hi - lo) * (k_row + v_row) * static_cast<size_t>(lc.n_kv_heads) <= kMaxKvPrefetchBytes)
            for (int32_t g = 0; g < lc.n_kv_heads; ++g)
                for (int32_t pos = lo; pos < hi;) {   // the rows of each page are one run
                    const int32_t run = std::min(hi - pos, kKvPagePositions - pos % kKvPagePositions);
                    prefetch_lines(kv_.k_row(kl, g, pos, seq), static_cast<size_t>(run) * k_row);
                    prefetch_lines(kv_.v_row(kl, g, pos, seq), static_cast<size_t>(run) * v_row);
                    pos += run;
                }
    }
    attend_tokens(p, attn_chunk_kernel(p), lc.n_kv_heads, kv, pos0, n, lc.sliding_window, q, lc.n_heads * p.head_dim,
                  att, lc.n_heads * p.head_dim_v, n_threads_);
}

} // namespace tern
