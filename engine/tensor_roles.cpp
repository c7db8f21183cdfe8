#include "engine/tensor_roles.h"

#include <array>

#include "engine/model_config.h"

namespace tern {
namespace {

using C = const ModelConfig&;
using L = const LayerConfig&;

// Widths of one layer's attention (q/k/v rows, the output projection's input).
// (A layer's own head sizes where it has them: gemma4's sliding-window layers.)
int64_t hd(C c, L l) { return l.head_dim > 0 ? l.head_dim : c.head_dim; }
int64_t hd_v(C c, L l) { return l.head_dim_v > 0 ? l.head_dim_v : c.head_dim_v; }
int64_t q_dim(C c, L l) { return int64_t{l.n_heads} * hd(c, l); }
int64_t k_dim(C c, L l) { return int64_t{l.n_kv_heads} * hd(c, l); }
int64_t v_dim(C c, L l) { return int64_t{l.n_kv_heads} * hd_v(c, l); }
int64_t o_dim(C c, L l) { return int64_t{l.n_heads} * hd_v(c, l); }

TensorShape vec(int64_t n) { return {n, 1, 1}; }

TensorNeed required(C, L) { return TensorNeed::required; }
TensorNeed optional(C, L) { return TensorNeed::optional; }
TensorNeed when(bool b) { return b ? TensorNeed::required : TensorNeed::absent; }
bool dense(L l) { return !l.moe; }
TensorNeed shared_experts(C c, L l) { return when(l.moe && c.n_expert_shared > 0); }
TensorNeed nextn_optional(C, L l) { return l.nextn ? TensorNeed::optional : TensorNeed::absent; }

constexpr std::array kTable = {
    LayerTensor{LayerRole::attn_norm, &LayerWeights::attn_norm, "attn_norm.weight", nullptr, TensorKind::vector,
                "[dim]", [](C c, L) { return vec(c.dim); }, [](C c, L) { return when(c.pre_norms); }},
    LayerTensor{LayerRole::wq, &LayerWeights::wq, "attn_q.weight", nullptr, TensorKind::matrix,
                "[dim, n_heads*head_dim]", [](C c, L l) { return TensorShape{c.dim, q_dim(c, l)}; }, required},
    // (gemma4's layers on shared KV need no attn_k / attn_k_norm: engine/weights.cpp requires them where a layer
    // has its own KV.)
    LayerTensor{LayerRole::wk, &LayerWeights::wk, "attn_k.weight", nullptr, TensorKind::matrix,
                "[dim, n_kv_heads*head_dim]", [](C c, L l) { return TensorShape{c.dim, k_dim(c, l)}; },
                [](C c, L) { return c.shares_kv() ? TensorNeed::optional : TensorNeed::required; }},
    // gemma4 may leave attn_v out (V is then K's projection: its 31B's global layers).
    LayerTensor{LayerRole::wv, &LayerWeights::wv, "attn_v.weight", nullptr, TensorKind::matrix,
                "[dim, n_kv_heads*head_dim_v]", [](C c, L l) { return TensorShape{c.dim, v_dim(c, l)}; },
                [](C c, L) { return c.arch == Arch::gemma4 ? TensorNeed::optional : TensorNeed::required; }},
    // Biases of q/k/v: required where the family has them (qwen2), optional elsewhere (some llama files).
    LayerTensor{LayerRole::bq, &LayerWeights::bq, "attn_q.bias", nullptr, TensorKind::vector, "[n_heads*head_dim]",
                [](C c, L l) { return vec(q_dim(c, l)); },
                [](C c, L) { return c.qkv_bias ? TensorNeed::required : TensorNeed::optional; }},
    LayerTensor{LayerRole::bk, &LayerWeights::bk, "attn_k.bias", nullptr, TensorKind::vector, "[n_kv_heads*head_dim]",
                [](C c, L l) { return vec(k_dim(c, l)); },
                [](C c, L) { return c.qkv_bias ? TensorNeed::required : TensorNeed::optional; }},
    LayerTensor{LayerRole::bv, &LayerWeights::bv, "attn_v.bias", nullptr, TensorKind::vector,
                "[n_kv_heads*head_dim_v]", [](C c, L l) { return vec(v_dim(c, l)); },
                [](C c, L) { return c.qkv_bias ? TensorNeed::required : TensorNeed::optional; }},
    // q/k norms: one head's width, or every head's at once (olmo2).
    LayerTensor{LayerRole::q_norm, &LayerWeights::q_norm, "attn_q_norm.weight", nullptr, TensorKind::vector,
                "[head_dim]", [](C c, L l) { return vec(c.qk_norm_whole ? q_dim(c, l) : hd(c, l)); },
                [](C c, L) { return when(c.qk_norm); }},
    LayerTensor{LayerRole::k_norm, &LayerWeights::k_norm, "attn_k_norm.weight", nullptr, TensorKind::vector,
                "[head_dim]", [](C c, L l) { return vec(c.qk_norm_whole ? k_dim(c, l) : hd(c, l)); },
                [](C c, L) { return !c.qk_norm ? TensorNeed::absent : c.shares_kv() ? TensorNeed::optional
                                                                                : TensorNeed::required; }},
    LayerTensor{LayerRole::wo, &LayerWeights::wo, "attn_output.weight", nullptr, TensorKind::matrix,
                "[n_heads*head_dim_v, dim]", [](C c, L l) { return TensorShape{o_dim(c, l), c.dim}; }, required},
    LayerTensor{LayerRole::bo, &LayerWeights::bo, "attn_output.bias", nullptr, TensorKind::vector, "[dim]",
                [](C c, L) { return vec(c.dim); }, optional},
    LayerTensor{LayerRole::ffn_norm, &LayerWeights::ffn_norm, "ffn_norm.weight",
                [](C c) { return c.ffn_norm_post_attention ? "post_attention_norm.weight" : "ffn_norm.weight"; },
                TensorKind::vector, "[dim]", [](C c, L) { return vec(c.dim); },
                [](C c, L) { return when(c.pre_norms); }},
    LayerTensor{LayerRole::attn_sinks, &LayerWeights::attn_sinks, "attn_sinks.weight", nullptr, TensorKind::vector,
                "[n_heads]", [](C, L l) { return vec(l.n_heads); }, [](C c, L) { return when(c.attn_sinks); }},
    // Mixture of experts: the router, the experts' stacks and (gpt-oss) their biases.
    LayerTensor{LayerRole::ffn_gate_inp, &LayerWeights::ffn_gate_inp, "ffn_gate_inp.weight", nullptr,
                TensorKind::matrix, "[dim, n_expert]", [](C c, L) { return TensorShape{c.dim, c.n_expert}; },
                [](C, L l) { return when(l.moe); }},
    LayerTensor{LayerRole::gate_exps, &LayerWeights::gate_exps, "ffn_gate_exps.weight", nullptr, TensorKind::stack,
                "[dim, expert_ffn, n_expert]",
                [](C c, L) { return TensorShape{c.dim, c.expert_ffn_dim, c.n_expert}; },
                [](C, L l) { return when(l.moe); }},
    LayerTensor{LayerRole::up_exps, &LayerWeights::up_exps, "ffn_up_exps.weight", nullptr, TensorKind::stack,
                "[dim, expert_ffn, n_expert]",
                [](C c, L) { return TensorShape{c.dim, c.expert_ffn_dim, c.n_expert}; },
                [](C, L l) { return when(l.moe); }},
    LayerTensor{LayerRole::down_exps, &LayerWeights::down_exps, "ffn_down_exps.weight", nullptr, TensorKind::stack,
                "[expert_ffn, dim, n_expert]",
                [](C c, L) { return TensorShape{c.expert_ffn_dim, c.dim, c.n_expert}; },
                [](C, L l) { return when(l.moe); }},
    LayerTensor{LayerRole::ffn_gate_inp_b, &LayerWeights::ffn_gate_inp_b, "ffn_gate_inp.bias", nullptr,
                TensorKind::vector, "[n_expert]", [](C c, L) { return vec(c.n_expert); },
                [](C c, L l) { return when(l.moe && c.expert_bias); }},
    LayerTensor{LayerRole::gate_exps_b, &LayerWeights::gate_exps_b, "ffn_gate_exps.bias", nullptr,
                TensorKind::vector_rows, "[expert_ffn, n_expert]",
                [](C c, L) { return TensorShape{c.expert_ffn_dim, c.n_expert}; },
                [](C c, L l) { return when(l.moe && c.expert_bias); }},
    LayerTensor{LayerRole::up_exps_b, &LayerWeights::up_exps_b, "ffn_up_exps.bias", nullptr, TensorKind::vector_rows,
                "[expert_ffn, n_expert]", [](C c, L) { return TensorShape{c.expert_ffn_dim, c.n_expert}; },
                [](C c, L l) { return when(l.moe && c.expert_bias); }},
    LayerTensor{LayerRole::down_exps_b, &LayerWeights::down_exps_b, "ffn_down_exps.bias", nullptr,
                TensorKind::vector_rows, "[dim, n_expert]", [](C c, L) { return TensorShape{c.dim, c.n_expert}; },
                [](C c, L l) { return when(l.moe && c.expert_bias); }},
    // The dense FFN (phi3 fuses gate and up into ffn_up: engine/weights.cpp splits it) and its optional biases.
    LayerTensor{LayerRole::w_gate, &LayerWeights::w_gate, "ffn_gate.weight", nullptr, TensorKind::matrix,
                "[dim, ffn_dim]", [](C c, L l) { return TensorShape{c.dim, l.ffn_dim}; },
                [](C, L l) { return when(dense(l)); }},
    LayerTensor{LayerRole::w_up, &LayerWeights::w_up, "ffn_up.weight", nullptr, TensorKind::matrix, "[dim, ffn_dim]",
                [](C c, L l) { return TensorShape{c.dim, l.ffn_dim}; }, [](C, L l) { return when(dense(l)); }},
    LayerTensor{LayerRole::w_down, &LayerWeights::w_down, "ffn_down.weight", nullptr, TensorKind::matrix,
                "[ffn_dim, dim]", [](C c, L l) { return TensorShape{l.ffn_dim, c.dim}; },
                [](C, L l) { return when(dense(l)); }},
    LayerTensor{LayerRole::b_gate, &LayerWeights::b_gate, "ffn_gate.bias", nullptr, TensorKind::vector, "[ffn_dim]",
                [](C, L l) { return vec(l.ffn_dim); },
                [](C c, L l) { return dense(l) && !c.ffn_gate_up_fused ? TensorNeed::optional : TensorNeed::absent; }},
    LayerTensor{LayerRole::b_up, &LayerWeights::b_up, "ffn_up.bias", nullptr, TensorKind::vector, "[ffn_dim]",
                [](C, L l) { return vec(l.ffn_dim); },
                [](C c, L l) { return dense(l) && !c.ffn_gate_up_fused ? TensorNeed::optional : TensorNeed::absent; }},
    LayerTensor{LayerRole::b_down, &LayerWeights::b_down, "ffn_down.bias", nullptr, TensorKind::vector, "[dim]",
                [](C c, L) { return vec(c.dim); },
                [](C c, L l) { return dense(l) && !c.ffn_gate_up_fused ? TensorNeed::optional : TensorNeed::absent; }},
    // Norms after each block, before its residual add (gemma, olmo2).
    LayerTensor{LayerRole::post_attn_norm, &LayerWeights::post_attn_norm, "post_attention_norm.weight", nullptr,
                TensorKind::vector, "[dim]", [](C c, L) { return vec(c.dim); },
                [](C c, L) { return when(c.post_norms); }},
    LayerTensor{LayerRole::post_ffn_norm, &LayerWeights::post_ffn_norm, "post_ffw_norm.weight", nullptr,
                TensorKind::vector, "[dim]", [](C c, L) { return vec(c.dim); },
                [](C c, L) { return when(c.post_norms); }},
    // glm4moe: the bias added to the experts' probabilities to choose them (not to weight them).
    LayerTensor{LayerRole::exp_probs_b, &LayerWeights::exp_probs_b, "exp_probs_b.bias", nullptr, TensorKind::vector,
                "[n_expert]", [](C c, L) { return vec(c.n_expert); },
                [](C c, L l) { return when(l.moe && c.expert_probs_bias); }},
    // Shared experts: one gated FFN every token runs beside the routed experts.
    LayerTensor{LayerRole::gate_shexp, &LayerWeights::gate_shexp, "ffn_gate_shexp.weight", nullptr,
                TensorKind::matrix, "[dim, shared_ffn]",
                [](C c, L) { return TensorShape{c.dim, c.expert_shared_ffn_dim}; }, shared_experts},
    LayerTensor{LayerRole::up_shexp, &LayerWeights::up_shexp, "ffn_up_shexp.weight", nullptr, TensorKind::matrix,
                "[dim, shared_ffn]", [](C c, L) { return TensorShape{c.dim, c.expert_shared_ffn_dim}; },
                shared_experts},
    LayerTensor{LayerRole::down_shexp, &LayerWeights::down_shexp, "ffn_down_shexp.weight", nullptr,
                TensorKind::matrix, "[shared_ffn, dim]",
                [](C c, L) { return TensorShape{c.expert_shared_ffn_dim, c.dim}; }, shared_experts},
    // A next-token-prediction layer's own tensors (GLM): the projection of [enorm(embedding), hnorm(hidden)] and
    // optionally its own embedding, head and head norm. Loaded and checked; no decoder step reads them.
    LayerTensor{LayerRole::nextn_eh_proj, &LayerWeights::nextn_eh_proj, "nextn.eh_proj.weight", nullptr,
                TensorKind::matrix, "[2*dim, dim]", [](C c, L) { return TensorShape{2 * int64_t{c.dim}, c.dim}; },
                [](C, L l) { return when(l.nextn); }},
    LayerTensor{LayerRole::nextn_enorm, &LayerWeights::nextn_enorm, "nextn.enorm.weight", nullptr, TensorKind::vector,
                "[dim]", [](C c, L) { return vec(c.dim); }, [](C, L l) { return when(l.nextn); }},
    LayerTensor{LayerRole::nextn_hnorm, &LayerWeights::nextn_hnorm, "nextn.hnorm.weight", nullptr, TensorKind::vector,
                "[dim]", [](C c, L) { return vec(c.dim); }, [](C, L l) { return when(l.nextn); }},
    LayerTensor{LayerRole::nextn_embed_tokens, &LayerWeights::nextn_embed_tokens, "nextn.embed_tokens.weight",
                nullptr, TensorKind::matrix, "[dim, vocab]", [](C c, L) { return TensorShape{c.dim, c.vocab}; },
                nextn_optional},
    LayerTensor{LayerRole::nextn_shared_head_head, &LayerWeights::nextn_shared_head_head,
                "nextn.shared_head_head.weight", nullptr, TensorKind::matrix, "[dim, vocab]",
                [](C c, L) { return TensorShape{c.dim, c.vocab}; }, nextn_optional},
    LayerTensor{LayerRole::nextn_shared_head_norm, &LayerWeights::nextn_shared_head_norm,
                "nextn.shared_head_norm.weight", nullptr, TensorKind::vector, "[dim]",
                [](C c, L) { return vec(c.dim); }, nextn_optional},
    // gemma4's per-layer input block and its layer's output scale.
    LayerTensor{LayerRole::per_layer_gate, &LayerWeights::per_layer_gate, "inp_gate.weight", nullptr,
                TensorKind::matrix, "[dim, per_layer_dim]", [](C c, L) { return TensorShape{c.dim, c.per_layer_dim}; },
                [](C c, L) { return when(c.per_layer_dim > 0); }},
    LayerTensor{LayerRole::per_layer_proj, &LayerWeights::per_layer_proj, "proj.weight", nullptr, TensorKind::matrix,
                "[per_layer_dim, dim]", [](C c, L) { return TensorShape{c.per_layer_dim, c.dim}; },
                [](C c, L) { return when(c.per_layer_dim > 0); }},
    LayerTensor{LayerRole::per_layer_post_norm, &LayerWeights::per_layer_post_norm, "post_norm.weight", nullptr,
                TensorKind::vector, "[dim]", [](C c, L) { return vec(c.dim); },
                [](C c, L) { return when(c.per_layer_dim > 0); }},
    LayerTensor{LayerRole::layer_out_scale, &LayerWeights::layer_out_scale, "layer_output_scale.weight", nullptr,
                TensorKind::vector, "[1]", [](C, L) { return vec(1); },
                [](C c, L) { return c.arch == Arch::gemma4 ? TensorNeed::optional : TensorNeed::absent; }},
};
static_assert(kTable.size() == static_cast<size_t>(kLayerRoles));

// The table is indexed by role as well as walked in order: each row must sit at its role's index.
constexpr bool rows_in_role_order() {
    for (size_t i = 0; i < kTable.size(); ++i)
        if (static_cast<size_t>(kTable[i].role) != i) return false;
    return true;
}
static_assert(rows_in_role_order());

} // namespace

std::span<const LayerTensor> layer_tensors() { return kTable; }

const LayerTensor& layer_tensor(LayerRole role) { return kTable[static_cast<size_t>(role)]; }

std::string layer_tensor_name(const LayerTensor& t, const ModelConfig& config, int32_t layer) {
    return "blk." + std::to_string(layer) + "." + (t.name_for ? t.name_for(config) : t.name);
}

} // namespace tern
