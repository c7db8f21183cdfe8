#pragma once
// The facts `tern info` shows, derived from metadata and the tensor table alone (no weights
// are touched, so it works on vocabulary-only and unsupported files too).
#include <cstdint>
#include <string>
#include <vector>

#include "formats/gguf.h"

namespace tern::app {

struct FormatUse {
    std::string name;
    int64_t n_tensors = 0;
    uint64_t n_bytes = 0;
};

struct ModelSummary {
    std::string name, architecture, file_type;
    bool architecture_supported = false;
    int64_t n_layers = 0, dim = 0, ffn_dim = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
    int64_t context_length = 0;
    uint64_t n_params = 0;
    int64_t n_expert = 0, n_expert_used = 0, expert_ffn_dim = 0;   // mixture of experts (0: dense)
    int64_t n_expert_shared = 0, n_dense_lead = 0;   // shared experts, leading dense layers (glm4moe)
    int64_t n_nextn = 0;   // next-token-prediction layers at the end of block_count: loaded, not run
    // gemma4: the sliding-window layers' head size, the layers on shared KV, the per-layer embedding width (0: none).
    int64_t head_dim_swa = 0, shared_kv_layers = 0, per_layer_dim = 0;
    // per token: the *_exps tensors count n_expert_used of n_expert experts; the next-token-prediction layers none
    uint64_t n_active_params = 0;
    double bits_per_weight = 0;
    std::vector<FormatUse> formats;   // most bytes first
    std::string tokenizer_model, tokenizer_pre;
    int64_t vocab_size = 0, bos = -1, eos = -1;
    std::string chat_template;        // family name, "none", or "unknown (N chars)"
};

ModelSummary summarize_model(const GgufFile& file);

} // namespace tern::app
