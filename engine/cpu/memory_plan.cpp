#include "engine/cpu/memory_plan.h"

#include <algorithm>
#include <set>

#include "engine/memory_budget.h"
#include "engine/tensor_roles.h"

namespace tern {
namespace {

// Per-thread scratch, the tokenizer's tables, the allocator's slack: not worth modelling one by
// one, but a fixed allowance keeps a "fits exactly" estimate from being an OOM in practice.
constexpr uint64_t kFixedOverhead = 32ull << 20;

uint64_t weight_bytes(const WeightRef& w) {
    if (!w.present()) return 0;
    return static_cast<uint64_t>(w.row_size()) * static_cast<uint64_t>(std::max<int64_t>(w.n_out(), 1) * w.n_mats);
}

} // namespace

MemoryNeed cpu_memory_need(const ModelConfig& c, const ModelWeights& w, const MemoryRequest& r) {
    MemoryNeed need;
    // Distinct tensors: a tied output is token_embd itself and is counted once.
    std::set<const uint8_t*> seen, copied;
    auto add = [&](const WeightRef& ref, bool packed) {
        if (!ref.present()) return;
        if (seen.insert(ref.data).second) need.weights += weight_bytes(ref);
        // The CPU backend packs the matrices it multiplies (engine/cpu/backend_cpu_matmul.cpp) into new
        // buffers and releases their mapped pages: counted as copies, conservatively all of them.
        if (packed && copied.insert(ref.data).second) need.copies += weight_bytes(ref);
    };
    add(w.token_embd, false);
    add(w.output_norm, false);
    add(w.output, true);
    add(w.rope_freqs, false);
    add(w.rope_factors_long, false);
    add(w.rope_factors_short, false);
    add(w.per_layer_token_embd, false);
    add(w.per_layer_model_proj, true);
    add(w.per_layer_proj_norm, false);
    for (const LayerWeights& l : w.layers)
        for (const LayerTensor& t : layer_tensors()) add(l.*t.member, is_matrix(t.kind));
    need.kv = kv_cache_bytes(c, r.kv_type, std::max(r.kv_pool_positions, r.n_ctx));   // the pool's pages

    // One forward batch (engine/cpu/backend_cpu.cpp): x, xn, out of width dim; q, k, v, attention
    // output; gate and up of ffn_dim; the quantized activations (~1 byte an element, two
    // formats at most); logits of the kept rows. All f32.
    uint64_t per_token = 3ull * 4 * static_cast<uint64_t>(c.dim);
    uint64_t widest_attn = 0, widest_ffn = 0;
    for (int32_t i = 0; i < c.n_layers; ++i) {
        const LayerConfig& l = c.layers[static_cast<size_t>(i)];
        const uint64_t hd = static_cast<uint64_t>(c.head_dim_of(i) + c.head_dim_v_of(i));
        const uint64_t qkv = static_cast<uint64_t>(l.n_heads) * hd + static_cast<uint64_t>(l.n_kv_heads) * hd;
        widest_attn = std::max(widest_attn, qkv);
        widest_ffn = std::max<uint64_t>(widest_ffn, static_cast<uint64_t>(l.ffn_dim));
        if (l.moe) widest_ffn = std::max<uint64_t>(widest_ffn, static_cast<uint64_t>(c.expert_shared_ffn_dim));
    }
    per_token += 4 * widest_attn + 2 * 4 * widest_ffn + 2 * std::max<uint64_t>(static_cast<uint64_t>(c.dim), widest_ffn);
    // MoE: the router's logits, and each used expert's output row and a gathered input row (backend_cpu_moe.cpp).
    // gemma4's per-layer inputs: every layer's chunk of every token.
    per_token += 4 * static_cast<uint64_t>(c.n_layers) * static_cast<uint64_t>(c.per_layer_dim);
    per_token += 4 * (static_cast<uint64_t>(c.n_expert) + static_cast<uint64_t>(c.n_expert_used + 1) * c.dim);
    const uint64_t batch = static_cast<uint64_t>(std::max(1, std::min(r.n_batch, std::max(r.n_ctx, 1))));
    const uint64_t logit_rows = static_cast<uint64_t>(std::max(1, r.n_logit_rows));
    need.buffers = batch * per_token + logit_rows * 4 * static_cast<uint64_t>(c.vocab) + kFixedOverhead;
    return need;
}

} // namespace tern
