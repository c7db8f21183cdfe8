#pragma once
// The model families tern runs, as data: one FamilyDescriptor per general.architecture, saying what its GGUF
// metadata does not (rope style, activation, norms, routing), which family keys it reads into ModelConfig and
// with what defaults, and which of its layers slide or skip RoPE. model_config_from_gguf (engine/model_config.cpp)
// reads every file through its family's descriptor: a family without new math is a descriptor here (and a synth
// shape with its llama.cpp reference data), nothing else.
//
// Adding a family: (1) an Arch value (engine/model_config.h) and its row in kFamilies (engine/families.cpp), in
// Arch order, with llama.cpp's reading of its keys (src/models/<family>.cpp: which are required, their defaults,
// what 0 means); (2) a tensor the table does not hold yet as one row of engine/tensor_roles.cpp (and a member of
// LayerWeights); a new kind of step (a mixer, a norm placement) in engine/layer_program.h and each backend's
// steps; (3) a tiny `tern synth` shape (engine/tools/synth_shapes.cpp; synth.cpp writes the keys and
// tensors the flags imply); (4) llama.cpp's side of that shape recorded into tests/data/families by
// bench/family_vs_llamacpp.sh --save-reference, which tests/families_reference.py checks tern against; (5) a test
// that the family's keys and flags land in ModelConfig (tests/engine/test_model_config.cpp).
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

#include "engine/model_config.h"

namespace tern {

// The values a float key's meaning allows: finite, above lo (or at it, when lo_closed), at most hi, and a reason
// shown with the range. No key a family reads may be NaN or infinite: each one scales, caps or rotates every
// activation, and a value past its range gives NaN logits (an infinite softcap: inf * tanh(l / inf) = inf * 0)
// or output nothing was trained for.
struct FloatRange {
    float lo = 0.0f;
    bool lo_closed = false;
    float hi = std::numeric_limits<float>::max();
    const char* why = "";

    bool contains(float v) const;
    std::string text() const;
};

// A float key of one family ("<arch>.<suffix>") and the ModelConfig field it sets.
struct FamilyFloatKey {
    std::string_view suffix;
    float ModelConfig::*field = nullptr;
    float fallback = 0.0f; // the value when the key is absent (required: absent is an error)
    bool required = false;
    // llama.cpp reads 0 as "not set" (granite's multipliers): the field keeps the value it had, its default.
    bool zero_keeps_default = false;
    FloatRange range;
};

// Routed experts: none (an expert_count above 0 is refused), in every layer (expert_count and expert_used_count
// required, routed by the descriptor's gating), or llama's: dense unless expert_count says Mixtral.
enum class FamilyExperts { none, routed, llama_optional };

// Which layers attend through a sliding window: layer l is local when l % period < n_local.
struct SlidingWindowRule {
    enum class Key {
        none,     // no window; the key is not read
        fallback, // attention.sliding_window, `fallback` when absent
        required, // attention.sliding_window must be present
        refused,  // a positive attention.sliding_window is refused (`refused_why` says what it would be)
        // attention.sliding_window required, and attention.sliding_window_pattern an array with one bool per
        // layer, true for the local ones (gemma4); period and n_local are not used.
        pattern_array,
    };
    Key key = Key::none;
    int64_t fallback = 0;
    int32_t period = 1;
    int32_t n_local = 0;
    // > 0: attention.sliding_window_pattern, when present, must be this integer (the pattern the rule above is,
    // in words: pattern_text).
    int64_t only_pattern = 0;
    const char* pattern_text = "";
    // The local layers ignore the rope.* keys: base 10000, no scaling (gemma3).
    bool local_rope_unscaled = false;
    const char* refused_why = "";
};

// The query scale 1/sqrt(width): width the head dim, or the rotated dims (gpt-oss).
enum class AttnScaleWidth { head_dim, n_rot };

struct FamilyDescriptor {
    std::string_view name; // general.architecture
    Arch arch;
    RopeStyle rope_style = RopeStyle::normal;
    FfnActivation ffn_act = FfnActivation::silu;
    bool qkv_bias = false;                // attn_{q,k,v}.bias required
    bool qk_norm = false;                 // q/k RMSNorm before RoPE
    bool qk_norm_whole = false;           // ... over the whole q/k width, not per head
    bool pre_norms = true;                // attn_norm / ffn_norm before each block
    bool post_norms = false;              // post_attention_norm / post_ffw_norm before each residual add
    bool embed_scale_sqrt_dim = false;    // the embedding multiplied by sqrt(dim) (gemma)
    bool ffn_norm_post_attention = false; // the FFN's input norm stored as post_attention_norm.weight (gpt-oss)
    bool attn_sinks = false;
    bool ffn_gate_up_fused = false; // phi3: ffn_up.weight holds the gate's rows, then up's
    // gemma4: the sliding-window layers' own head sizes, rotated dims and rope base (attention.key_length_swa,
    // value_length_swa, rope.dimension_count_swa, rope.freq_base_swa; each the global value when absent), the
    // rope_freqs factors on the global layers only, the last attention.shared_kv_layers layers reading the KV
    // of the last earlier layer of their kind, V RMS-normed, and per-layer token embeddings when
    // embedding_length_per_layer_input is present.
    bool gemma4_layers = false;
    // > 0: q.k is multiplied by this instead of 1/sqrt(width) (gemma4: 1, its q/k norms set the scale).
    float fixed_attn_scale = 0.0f;

    FamilyExperts experts = FamilyExperts::none;
    ExpertGating gating = ExpertGating::softmax; // llama.cpp fixes these per architecture, not from metadata
    bool expert_weights_norm = false;
    bool expert_bias = false;
    // glm4moe: the routing keys (expert_gating_func, expert_weights_norm, expert_weights_scale) and
    // expert_shared_count are read from the file, `gating` and `expert_weights_norm` being the defaults.
    bool routing_from_file = false;
    bool expert_probs_bias = false;   // exp_probs_b.bias required in every layer of experts
    bool leading_dense = false;       // leading_dense_block_count: the first layers keep a dense FFN
    bool nextn_layers = false;        // nextn_predict_layers: block_count's last layers are not the decoder's
    bool qk_norm_optional = false;    // q/k norms when the file has them (blk.0.attn_q_norm.weight)

    SlidingWindowRule window;
    // > 0: layer l skips RoPE when (l + 1) % no_rope_period == 0 (SmolLM3: 4, no metadata key).
    int32_t no_rope_period = 0;
    // Not empty: a bool key, true when absent, whose false leaves every layer unrotated (granite's
    // rope.scaling.finetuned, which llama.cpp reads as a switch for RoPE).
    std::string_view rope_switch_key;
    // rope_freqs.weight (Llama 3.1's frequency factors) is accepted.
    bool rope_freqs_tensor = false;
    // LongRoPE wherever rope_factors_long / rope_factors_short are present, with or without rope.scaling.type
    // (phi3's converter writes none).
    bool longrope_from_tensors = false;
    // rope.freq_base_swa, when present, must equal rope.freq_base (one base for local and global layers).
    bool one_rope_base = false;

    AttnScaleWidth attn_scale_width = AttnScaleWidth::head_dim;
    // A model with this many layers scales queries by 1/sqrt(dim / n_heads) instead (the 27B gemmas); 0: none.
    int32_t attn_scale_by_dim_layers = 0;

    std::span<const FamilyFloatKey> float_keys; // read in this order
};

// Every family, in Arch order.
std::span<const FamilyDescriptor> families();
// The family whose general.architecture is `name`; nullptr when none.
const FamilyDescriptor* find_family(std::string_view name);
const FamilyDescriptor& family_of(Arch arch);

} // namespace tern
