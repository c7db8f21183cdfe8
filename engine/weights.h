#pragma once
// Views of a model's tensors inside the GGUF mapping: no dequantized copy of the model is made.
// Shapes use GGUF order (ne[0] contiguous): a projection {n_in, n_out} is n_out rows of n_in.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quant/types.h"

namespace tern {

class GgufFile;
struct ModelConfig;

struct WeightRef {
    std::string name; // GGUF tensor name, for messages
    GgmlType type = GgmlType::F32;
    int64_t ne[2] = {0, 0};        // (ne[0] = n_in / length, ne[1] = n_out rows; 1 for vectors)
    int64_t n_mats = 1;            // a stack of matrices (ne[2] of a 3-D expert tensor), each n_out rows
    const uint8_t* data = nullptr; // inside the mapping; nullptr for an absent optional tensor

    bool present() const { return data != nullptr; }
    int64_t n_in() const { return ne[0]; }
    int64_t n_out() const { return ne[1]; }
    size_t row_size() const { return row_bytes(type, ne[0]); }
    const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_size(); }
    size_t n_bytes() const { return row_size() * static_cast<size_t>(ne[1] * n_mats); }
    // Matrix e of a stack: its rows are contiguous (rows e*n_out .. (e+1)*n_out - 1 of the tensor), so it is a
    // plain 2-D view every matmul takes.
    WeightRef matrix(int64_t e) const {
        WeightRef m = *this;
        m.n_mats = 1;
        m.data = data + static_cast<size_t>(e * ne[1]) * row_size();
        return m;
    }
};

struct LayerWeights {
    WeightRef attn_norm;            // (dim)
    WeightRef wq, wk, wv;           // (n_heads*head_dim, dim), (n_kv_heads*head_dim, dim), (.. head_dim_v ..)
    WeightRef bq, bk, bv;           // optional biases (n_heads*head_dim), (n_kv_heads*head_dim), ...
    WeightRef q_norm, k_norm;       // (head_dim) when ModelConfig::qk_norm
    WeightRef wo;                   // (dim, n_heads*head_dim_v)
    WeightRef bo;                   // optional (dim)
    WeightRef post_attn_norm;       // (dim) when ModelConfig::post_norms
    WeightRef ffn_norm;             // (dim)
    WeightRef w_gate, w_up;         // (ffn_dim, dim)
    WeightRef w_down;               // (dim, ffn_dim)
    WeightRef b_gate, b_up, b_down; // optional
    WeightRef post_ffn_norm;        // (dim) when ModelConfig::post_norms
    // Mixture of experts (ModelConfig::moe(); then w_gate/w_up/w_down are absent):
    WeightRef ffn_gate_inp;                   // the router (n_expert, dim)
    WeightRef gate_exps, up_exps, down_exps;  // n_expert stacked (expert_ffn, dim), .. , (dim, expert_ffn)
    // ModelConfig::expert_bias: the router's bias (n_expert) and one bias row per expert: (n_expert rows of
    // expert_ffn) for gate and up, (n_expert rows of dim) for down.
    WeightRef ffn_gate_inp_b, gate_exps_b, up_exps_b, down_exps_b;
    WeightRef attn_sinks;                     // (n_heads) when ModelConfig::attn_sinks
    WeightRef exp_probs_b;                    // (n_expert) when ModelConfig::expert_probs_bias
    WeightRef gate_shexp, up_shexp, down_shexp;   // the shared experts' FFN (ModelConfig::n_expert_shared)
    // A next-token-prediction layer's own tensors (ModelConfig::nextn_layers), checked at load and not run.
    WeightRef nextn_eh_proj, nextn_enorm, nextn_hnorm, nextn_embed_tokens, nextn_shared_head_head,
        nextn_shared_head_norm;
    // gemma4's per-layer input block (ModelConfig::per_layer_dim > 0): inp_gate (per_layer_dim, dim),
    // proj (dim, per_layer_dim), post_norm (dim); and the optional scalar its layer's output is multiplied by.
    WeightRef per_layer_gate, per_layer_proj, per_layer_post_norm;
    WeightRef layer_out_scale;                // optional (1)
};

struct ModelWeights {
    WeightRef token_embd;  // (vocab, dim)
    WeightRef output_norm; // (dim)
    WeightRef output;      // (vocab, dim): token_embd itself when the output is tied
    WeightRef rope_freqs;  // optional (n_rot/2) f32
    WeightRef rope_factors_long, rope_factors_short;  // LongRoPE (ModelConfig::rope_longrope): optional (n_rot/2)
    // gemma4's per-layer token embeddings (ModelConfig::per_layer_dim > 0): a row of n_layers*per_layer_dim per
    // token, the projection of the embedding to the same width, and the norm of each layer's chunk of it.
    WeightRef per_layer_token_embd;   // (vocab, n_layers*per_layer_dim)
    WeightRef per_layer_model_proj;   // (n_layers*per_layer_dim, dim)
    WeightRef per_layer_proj_norm;    // (per_layer_dim)
    std::vector<LayerWeights> layers;
    std::vector<LayerWeights> nextn_layers;   // ModelConfig::nextn_layers: loaded and checked, never run
    // Copies of the tensors whose bytes in the file do not start on a kWeightAlignment boundary
    // (a file written with general.alignment below 32): the views above point into these instead
    // of the mapping. Empty for every file written with the default alignment.
    std::vector<std::shared_ptr<const uint8_t>> realigned;
};

// The alignment every kernel may assume of a weight tensor's first byte: GGUF's default, which
// llama.cpp and tern always write. Rows inside a tensor are aligned only to their block struct.
inline constexpr size_t kWeightAlignment = 32;

// Finds every tensor the config needs and checks its shape and format, and the values of the small ones every
// token reads whole (norms, biases, attention sinks, the router, rope factors: finite, rope factors > 0).
// Throws InputError naming the file and the tensor: the shape found and the shape expected (with the dimension
// names), or the first bad value.
ModelWeights model_weights_from_gguf(const GgufFile& file, const ModelConfig& config);

// The frequency factors a forward over a context of n_ctx positions divides rope angles by: rope_freqs, or
// LongRoPE's long factors past the original context and its short ones within it (absent: no factors).
// A reference into w (backends look tensors up by address).
const WeightRef& rope_factors_for(const ModelWeights& w, const ModelConfig& config, int32_t n_ctx);

} // namespace tern
