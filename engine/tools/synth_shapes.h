#pragma once
// The named model shapes `tern synth` (and `tern bench --synthetic`) builds random-weight models
// of: the hyper-parameters of real published models, so a synthetic file costs what the real one
// costs to run (same matrices, same KV cache, same lm_head), without downloading anything.
#include <cstdint>
#include <span>
#include <string_view>

namespace tern {

struct SynthShape {
    std::string_view name;          // "llama-1b"
    std::string_view arch;          // general.architecture: llama, qwen2, qwen3, gemma3, ... (phi3: fused tensors)
    std::string_view model;         // the real model it copies, for general.name and --help
    int32_t dim = 0;                // embedding_length
    int32_t n_layers = 0;
    int32_t n_heads = 0;
    int32_t n_kv_heads = 0;
    int32_t head_dim = 0;           // key_length = value_length
    int32_t ffn_dim = 0;
    int32_t vocab = 0;              // the real model's vocabulary size (the built-in vocab is padded to it)
    int32_t n_ctx_train = 0;        // context_length
    float rope_base = 10000.0f;
    float rms_eps = 1e-5f;
    bool tied_output = false;       // no output.weight: token_embd is the lm_head
    bool qkv_bias = false;          // qwen2: attn_{q,k,v}.bias
    bool qk_norm = false;           // qwen3, gemma3: attn_{q,k}_norm.weight
    bool qk_norm_whole = false;     // olmo2: those norms span every head ([n_heads * head_dim], [n_kv_heads * ...])
    bool pre_norms = true;          // false (olmo2): no attn_norm / ffn_norm
    bool post_norms = false;        // gemma, olmo2: post_attention_norm / post_ffw_norm
    int32_t sliding_window = 0;     // gemma3: the local layers' window (5 local : 1 global); gemma2: every other layer
    int32_t n_expert = 0;           // qwen3moe: routed experts per layer (0: a dense FFN)
    int32_t n_expert_used = 0;
    int32_t expert_ffn_dim = 0;     // expert_feed_forward_length
    // glm4moe: the first n_dense_lead layers dense (leading_dense_block_count), shared experts of n_expert_shared
    // expert widths, a selection bias on the router (exp_probs_b), sigmoid routing with the weights normalised and
    // times expert_weights_scale, and the last n_nextn of n_layers next-token-prediction layers
    int32_t n_dense_lead = 0;
    int32_t n_expert_shared = 0;
    float expert_weights_scale = 0.0f;
    int32_t n_nextn = 0;
    // gpt-oss: attention sinks, biases on q/k/v/o, on the router and on the experts, the FFN norm stored as
    // post_attention_norm, a window on the even layers
    bool gpt_oss = false;
    int32_t n_rot = 0;              // rope.dimension_count when only part of a head rotates (Phi-4-mini); 0: all
    float yarn_factor = 0.0f;       // > 0: rope.scaling.type yarn with this factor (Qwen3's long-context config)
    int32_t yarn_n_ctx_orig = 0;    // rope.scaling.original_context_length
    int32_t longrope_n_ctx_orig = 0; // > 0: LongRoPE over this original context (rope_factors_long/short tensors)
    // mistral3's converted YaRN keys (written when yarn_factor > 0 and these are > 0) and its attention temperature
    float yarn_beta_fast = 0.0f, yarn_beta_slow = 0.0f, yarn_log_mul = 0.0f;
    float attn_temp_scale = 0.0f;   // attention.temperature_scale (llama_4_scaling_beta)
    // granite's multipliers (each written when > 0): embedding_scale, residual_scale, attention.scale, logit_scale
    float embedding_scale = 0.0f, residual_scale = 0.0f, attention_scale = 0.0f, logit_scale = 0.0f;
    // gemma4: every swa_period-th layer global, the others local with head size head_dim_swa and rope base
    // rope_base_swa (rope_freqs.weight on the global ones), the last shared_kv_layers layers reading earlier KV,
    // per-layer token embeddings of width per_layer_dim (0: none, the 31B), a layer_output_scale per layer.
    int32_t swa_period = 0, head_dim_swa = 0, shared_kv_layers = 0, per_layer_dim = 0;
    bool global_k_eq_v = false;     // gemma4: the global layers carry no attn_v (V is K's projection)
    float rope_base_swa = 0.0f;
};

std::span<const SynthShape> synth_shapes();
const SynthShape* find_synth_shape(std::string_view name);   // nullptr when unknown

} // namespace tern
