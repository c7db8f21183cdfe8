#pragma once
// ModelConfig: the hyper-parameters and architecture flags of a decoder, read from a GGUF file's
// "<arch>.*" metadata (../shared/FORMATS.md §1.8-1.10) through its family's descriptor (engine/families.h).
// Every architecture difference the decoder needs is a field here, read by the one layer program
// (engine/layer_program.h) that every backend's steps run.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tern {

class GgufFile;

enum class Arch {
    llama, qwen2, qwen3, gemma2, gemma3, qwen3moe, gpt_oss, smollm3, phi3, mistral3, granite, olmo2, glm4moe, gemma4
};
enum class RopeStyle { normal, neox };        // adjacent pairs (2i, 2i+1) / halves (i, i + n_rot/2)
// SwiGLU / GeGLU / gpt-oss's clamped SwiGLU: min(g, 7) * sigmoid(1.702 * min(g, 7)) * (clamp(u, -7, 7) + 1)
enum class FfnActivation { silu, gelu_tanh, swiglu_oai };
// Router logits -> expert weights: softmax or sigmoid over all experts, then the top k; softmax_weight (gpt-oss):
// the top k by logit, then a softmax over those k logits only.
enum class ExpertGating { softmax, sigmoid, softmax_weight };

// The architectures tern runs, by their general.architecture spelling (engine/families.h: one descriptor each).
std::span<const std::string_view> supported_architectures();
std::string_view arch_name(Arch arch);

// What varies from layer to layer (per-layer metadata arrays, gemma's local/global layers).
struct LayerConfig {
    int32_t n_heads = 0;
    int32_t n_kv_heads = 0;
    int32_t ffn_dim = 0;        // the dense FFN's width, or one routed expert's in a layer of experts
    bool moe = false;           // routed experts (ModelConfig::moe() past its leading dense layers), else dense
    bool nextn = false;         // a next-token-prediction layer (ModelConfig::nextn_layers), not the decoder's
    int32_t sliding_window = 0; // 0: global attention; w: a query at q sees keys k with q - k < w
    float rope_base = 10000.0f;
    float rope_freq_scale = 1.0f; // angle multiplier (1 / linear scaling factor)
    bool no_rope = false;         // NoPE: q and k enter attention unrotated (SmolLM3's every 4th layer)
    // YaRN (rope.scaling.type "yarn"; kernels/cpu/ops.h RopeYarn): ext_factor 0 is off; pairs below corr_low
    // keep their unscaled angle, pairs above corr_high get rope_freq_scale, a ramp between. rope_mscale
    // multiplies every rotated q/k value (YaRN's attention factor, 0.1 ln(factor) + 1 by default).
    float yarn_ext_factor = 0.0f;
    float yarn_corr_low = 0.0f, yarn_corr_high = 0.0f;
    float rope_mscale = 1.0f;
    // This layer's head sizes and rotated dims (ModelConfig's head_dim / head_dim_v / n_rot but for gemma4's
    // sliding-window layers, which have their own: attention.key_length_swa, rope.dimension_count_swa).
    int32_t head_dim = 0, head_dim_v = 0, n_rot = 0;
    // rope_freqs.weight's factors do not apply here (gemma4: only the global layers' rope is proportional).
    bool no_freq_factors = false;
    // >= 0: the layer attends over that earlier layer's KV and writes none of its own (gemma4's last
    // attention.shared_kv_layers layers); -1: its own KV.
    int32_t kv_source = -1;
    bool has_kv() const { return kv_source < 0; }
};

struct ModelConfig {
    Arch arch = Arch::llama;
    std::string name; // general.name, or the architecture when absent

    int32_t n_layers = 0;
    int32_t dim = 0;   // embedding width (n_embd)
    int32_t vocab = 0; // rows of token_embd.weight
    int32_t n_ctx_train = 0;
    int32_t head_dim = 0;   // key_length
    int32_t head_dim_v = 0; // value_length
    int32_t n_rot = 0;      // rotated dims per head (rope.dimension_count)
    int32_t rope_n_ctx_orig = 0; // rope.scaling.original_context_length (n_ctx_train when absent)
    float rms_eps = 1e-5f;
    std::vector<LayerConfig> layers; // n_layers entries

    RopeStyle rope_style = RopeStyle::normal;
    bool rope_freq_factors = false; // rope_freqs.weight present (Llama 3.1): angle i divided by factor i
    // LongRoPE (rope.scaling.type "longrope", Phi-3 / Phi-4): the angles are divided by the factors of
    // rope_factors_long.weight when the context exceeds rope_n_ctx_orig, else rope_factors_short.weight
    // (engine/weights.h rope_factors_for); its attention factor is rope.scaling.attn_factor (rope_mscale).
    bool rope_longrope = false;
    bool rope_long_factors(int32_t n_ctx) const { return rope_longrope && n_ctx > rope_n_ctx_orig; }
    bool qkv_bias = false;          // q/k/v biases required (qwen2); llama may carry them optionally
    bool qk_norm = false;           // per-head RMSNorm of q and k before RoPE (qwen3, gemma3)
    // olmo2: q_norm / k_norm span every head at once (n_heads*head_dim, n_kv_heads*head_dim), not one head.
    bool qk_norm_whole = false;
    bool post_norms = false;        // post_attention_norm / post_ffw_norm before each residual add (gemma)
    // false (olmo2): no attn_norm / ffn_norm, each block reads the residual stream itself (its only norms are
    // the post norms).
    bool pre_norms = true;
    bool ffn_norm_post_attention = false; // gpt-oss: the FFN's input norm is stored as post_attention_norm.weight
    bool attn_sinks = false;        // gpt-oss: blk.N.attn_sinks.weight, a learned logit per query head that joins
                                    // each softmax's denominator (its exp adds to the sum; it has no value row)
    FfnActivation ffn_act = FfnActivation::silu;
    float embed_scale = 1.0f;   // gemma: sqrt(dim); granite: embedding_scale. Applied right after the lookup
    float attn_scale = 0.0f;    // multiplies q.k (1/sqrt(head_dim) unless a model says otherwise)
    float attn_softcap = 0.0f;  // gemma2: scores -> c * tanh(s / c); 0 = off
    float final_softcap = 0.0f; // gemma2: logits -> c * tanh(l / c); 0 = off
    // granite: each block's output is multiplied by residual_scale before it joins the residual stream, and
    // the logits are divided by logit_scale (after the softcap, which granite does not have).
    float residual_scale = 1.0f;
    float logit_scale = 1.0f;
    bool tied_output = false;   // no output.weight: token_embd.weight is the lm_head
    bool ffn_gate_up_fused = false; // phi3: ffn_up.weight holds the gate's rows, then the up projection's
    // Llama 4's attention temperature (mistral3's attention.temperature_scale): after RoPE, q at position p is
    // multiplied by attn_temperature(p) = 1 + attn_temp_scale * ln(floor(p / attn_temp_floor) + 1), 1 below
    // attn_temp_floor (the original context length). attn_temp_scale 0: off.
    float attn_temp_scale = 0.0f;
    // gemma4: V is RMS-normed per head (no weight) before it is cached.
    bool v_norm = false;
    // gemma4 E2B/E4B: per-layer token embeddings of this width (embedding_length_per_layer_input; 0: none).
    // Per token, once: P = (RMSNorm_chunks(per_layer_model_proj x / sqrt(dim)) * per_layer_proj_norm
    //                       + per_layer_token_embd[token] * sqrt(per_layer_dim)) / sqrt(2), n_layers chunks;
    // each layer, after its FFN: x += post_norm(proj(gelu(inp_gate x) * P[layer])).
    int32_t per_layer_dim = 0;
    // Layer l's head sizes and rotated dims (LayerConfig's, or the model's where a layer leaves them 0).
    int32_t head_dim_of(int32_t l) const;
    int32_t head_dim_v_of(int32_t l) const;
    int32_t n_rot_of(int32_t l) const;
    bool uniform_head_dims() const;   // every layer has the model's head sizes (one KV row shape)
    // Layers whose KV another reads (any layer's kv_source >= 0).
    bool shares_kv() const;
    int32_t attn_temp_floor = 0;
    float attn_temperature(int32_t pos) const;

    // Mixture of experts (n_expert > 0: every layer's FFN from n_dense_lead on is routed, LayerConfig::moe;
    // its LayerConfig::ffn_dim is then the expert FFN width). Per token: router logits = ffn_gate_inp x,
    // probabilities by `expert_gating`, the n_expert_used most probable experts (ties: the lower expert id
    // first; with expert_probs_bias, chosen by probability + exp_probs_b.bias, weighted by the probability
    // alone), their probabilities as weights (divided by their sum when expert_weights_norm, then times
    // expert_weights_scale), and the FFN output the weighted sum of those experts' FFNs in rank order, plus the
    // shared experts' FFN when n_expert_shared > 0.
    int32_t n_expert = 0;             // <arch>.expert_count
    int32_t n_expert_used = 0;        // <arch>.expert_used_count
    int32_t expert_ffn_dim = 0;       // <arch>.expert_feed_forward_length
    ExpertGating expert_gating = ExpertGating::softmax;
    bool expert_weights_norm = false; // qwen3moe: always (llama.cpp's norm_w), no key
    float expert_weights_scale = 1.0f;
    bool expert_bias = false;         // gpt-oss: ffn_gate_inp.bias on the router logits, ffn_{gate,up,down}_exps.bias
                                      // (one row per expert) on each expert's projections
    bool expert_probs_bias = false;   // glm4moe: exp_probs_b.bias, added to the probabilities to choose experts
    // Shared experts: every token also runs one gated FFN of width expert_shared_ffn_dim (ffn_*_shexp; glm4moe:
    // n_expert_shared expert widths) whose output adds to the routed experts'.
    int32_t n_expert_shared = 0;
    int32_t expert_shared_ffn_dim = 0;
    int32_t n_dense_lead = 0;         // <arch>.leading_dense_block_count: the first layers keep a dense FFN
    // <arch>.nextn_predict_layers: the last layers of block_count predict a later token (GLM's multi-token
    // prediction); their tensors are checked at load, not run. n_layers and `layers` count the decoder's only;
    // nextn_layers are the others' configs.
    std::vector<LayerConfig> nextn_layers;
    bool moe() const { return n_expert > 0; }

    int32_t max_n_heads() const;
    int32_t max_n_kv_heads() const;
    int32_t max_ffn_dim() const;
    bool uniform_kv_heads() const; // every layer has the same n_kv_heads (one KV cache shape)
};

// Reads and checks the metadata (and which optional tensors exist: output.weight, rope_freqs.weight).
// Throws InputError naming the file and key, or listing the supported architectures.
ModelConfig model_config_from_gguf(const GgufFile& file);

} // namespace tern
