#pragma once
// Every tensor a decoder layer may hold, listed once: its role, where LayerWeights keeps it, its GGUF name,
// what kind of tensor it is, its shape from the config and when a file must carry it. The loader
// (engine/weights.cpp), both backends (which copy the vectors to f32 and upload the matrices), memory
// planning, `tern bench`'s byte count and the load-time value check iterate this table; none of them lists
// a layer's tensors by hand. A new tensor is one row here and one member of LayerWeights.
#include <cstdint>
#include <span>
#include <string>

#include "engine/weights.h"

namespace tern {

struct LayerConfig;
struct ModelConfig;

enum class LayerRole : uint8_t {
    attn_norm, wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, bo, ffn_norm, attn_sinks,
    ffn_gate_inp, gate_exps, up_exps, down_exps, ffn_gate_inp_b, gate_exps_b, up_exps_b, down_exps_b,
    w_gate, w_up, w_down, b_gate, b_up, b_down, post_attn_norm, post_ffn_norm,
    exp_probs_b, gate_shexp, up_shexp, down_shexp,
    nextn_eh_proj, nextn_enorm, nextn_hnorm, nextn_embed_tokens, nextn_shared_head_head, nextn_shared_head_norm,
    per_layer_gate, per_layer_proj, per_layer_post_norm, layer_out_scale,
};
inline constexpr int kLayerRoles = static_cast<int>(LayerRole::layer_out_scale) + 1;

// How a backend holds a tensor of that role:
//   matrix      - a projection in its GGUF format (n_out rows of n_in)
//   stack       - n_mats matrices (the experts), each read as a matrix
//   vector      - a 1-D tensor read whole as f32 (norms, biases, sinks)
//   vector_rows - one f32 vector per row (the experts' biases, a row per expert)
enum class TensorKind : uint8_t { matrix, stack, vector, vector_rows };

// Whether a file must carry the tensor, for a config.
enum class TensorNeed : uint8_t { absent, optional, required };

struct TensorShape {
    int64_t n_in = 0, n_out = 1, n_mats = 1;
};

struct LayerTensor {
    LayerRole role;
    WeightRef LayerWeights::*member;
    const char* name;   // after "blk.N."
    // Another name for some configs (gpt-oss keeps the FFN's input norm as post_attention_norm), or null.
    const char* (*name_for)(const ModelConfig&);
    TensorKind kind;
    const char* dims;   // the shape in words, for messages: "[dim, n_heads*head_dim]"
    TensorShape (*shape)(const ModelConfig&, const LayerConfig&);
    // Per layer: a layer's FFN kind (LayerConfig::moe) and whether it is a next-token-prediction layer
    // (LayerConfig::nextn) decide which tensors it holds.
    TensorNeed (*need)(const ModelConfig&, const LayerConfig&);
};

// The tensors of one gated FFN act(W_gate x + b) * (W_up x + b), then W_down (+ b): the dense FFN, or a layer's
// shared experts (which have no biases).
struct FfnRoles {
    LayerRole gate, up, down;
    bool biases;   // b_gate / b_up / b_down, each optional (the dense FFN's)
};
enum class GatedFfn : uint8_t { dense, shared_experts };
constexpr FfnRoles ffn_roles(GatedFfn f) {
    return f == GatedFfn::dense ? FfnRoles{LayerRole::w_gate, LayerRole::w_up, LayerRole::w_down, true}
                                : FfnRoles{LayerRole::gate_shexp, LayerRole::up_shexp, LayerRole::down_shexp, false};
}

// The tensor's name in layer `layer` of a file of this config: "blk.3.attn_q.weight".
std::string layer_tensor_name(const LayerTensor& t, const ModelConfig& config, int32_t layer);

// Every row, in the order the loader binds them (its first missing tensor is the one a message names).
std::span<const LayerTensor> layer_tensors();
const LayerTensor& layer_tensor(LayerRole role);

// A role's tensor in a layer.
inline const WeightRef& weight_of(const LayerWeights& layer, LayerRole role) {
    return layer.*layer_tensor(role).member;
}

inline bool is_matrix(TensorKind k) { return k == TensorKind::matrix || k == TensorKind::stack; }

} // namespace tern
