#include "engine/families.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "base/finite.h"

namespace tern {

bool FloatRange::contains(float v) const {
    return std::isfinite(v) && (lo_closed ? v >= lo : v > lo) && v <= hi;
}

std::string FloatRange::text() const {
    std::string t = std::string("expected a finite number ") + (lo_closed ? ">= " : "> ") + float_text(lo);
    if (hi < std::numeric_limits<float>::max()) t += " and <= " + float_text(hi);
    if (*why) t += ": " + std::string(why);
    return t;
}

namespace {

constexpr float kFloatMax = std::numeric_limits<float>::max();

// The ranges of the family keys (the generic keys' ranges are in engine/model_config.cpp).
constexpr FloatRange kSoftcapRange{0.0f, false, kFloatMax, "c * tanh(x / c) caps scores and logits at +-c"};
constexpr FloatRange kTemperatureRange{0.0f, true, 10.0f,
                                       "q's temperature 1 + scale * ln(...) grows with the position"};
constexpr FloatRange kMultiplierRange{0.0f, true, kFloatMax, "a multiplier of the activations (0: none)"};
constexpr FloatRange kLogitScaleRange{0.0f, false, kFloatMax, "the logits are divided by it"};

// gemma2: tanh caps on the attention scores and the logits, Gemma 2's values when absent.
constexpr FamilyFloatKey kGemma2Keys[] = {
    {"attn_logit_softcapping", &ModelConfig::attn_softcap, 50.0f, false, false, kSoftcapRange},
    {"final_logit_softcapping", &ModelConfig::final_softcap, 30.0f, false, false, kSoftcapRange},
};

// mistral3: Llama 4's attention temperature (llama.cpp reads it for mistral3 only); its floor is the original
// context (model_config.cpp).
// gemma4: the logits' tanh cap, llama.cpp's 30 when absent.
constexpr FamilyFloatKey kGemma4Keys[] = {
    {"final_logit_softcapping", &ModelConfig::final_softcap, 30.0f, false, false, kSoftcapRange},
};

constexpr FamilyFloatKey kMistral3Keys[] = {
    {"attention.temperature_scale", &ModelConfig::attn_temp_scale, 0.0f, false, false, kTemperatureRange},
};

// granite (Granite 3.x): the embedding, each block's output (before its residual add) and q.k are multiplied by
// these, the logits divided by logit_scale. As llama.cpp reads them: logit_scale required, the others optional
// and 0 meaning none (the default: 1, 1/sqrt(head_dim)).
constexpr FamilyFloatKey kGraniteKeys[] = {
    {"logit_scale", &ModelConfig::logit_scale, 1.0f, true, false, kLogitScaleRange},
    {"residual_scale", &ModelConfig::residual_scale, 0.0f, false, true, kMultiplierRange},
    {"embedding_scale", &ModelConfig::embed_scale, 0.0f, false, true, kMultiplierRange},
    {"attention.scale", &ModelConfig::attn_scale, 0.0f, false, true, kMultiplierRange},
};

constexpr FamilyDescriptor kFamilies[] = {
    {.name = "llama", .arch = Arch::llama, .experts = FamilyExperts::llama_optional, .rope_freqs_tensor = true},
    {.name = "qwen2", .arch = Arch::qwen2, .rope_style = RopeStyle::neox, .qkv_bias = true},
    {.name = "qwen3", .arch = Arch::qwen3, .rope_style = RopeStyle::neox, .qk_norm = true},
    // gemma2: even layers local (a 4096-token window when the file says none), softcaps, the 27B's query scale.
    {.name = "gemma2",
     .arch = Arch::gemma2,
     .rope_style = RopeStyle::neox,
     .ffn_act = FfnActivation::gelu_tanh,
     .post_norms = true,
     .embed_scale_sqrt_dim = true,
     .window = {.key = SlidingWindowRule::Key::fallback, .fallback = 4096, .period = 2, .n_local = 1},
     .attn_scale_by_dim_layers = 46,
     .float_keys = kGemma2Keys},
    // gemma3: 5 local layers : 1 global, the local ones with their own unscaled RoPE.
    {.name = "gemma3",
     .arch = Arch::gemma3,
     .rope_style = RopeStyle::neox,
     .ffn_act = FfnActivation::gelu_tanh,
     .qk_norm = true,
     .post_norms = true,
     .embed_scale_sqrt_dim = true,
     .window = {.key = SlidingWindowRule::Key::required, .period = 6, .n_local = 5, .local_rope_unscaled = true},
     .attn_scale_by_dim_layers = 62},
    // qwen3moe: qwen3's attention, softmax routing, top-k weights normalised (llama.cpp's build_moe_ffn norm_w).
    {.name = "qwen3moe",
     .arch = Arch::qwen3moe,
     .rope_style = RopeStyle::neox,
     .qk_norm = true,
     .experts = FamilyExperts::routed,
     .gating = ExpertGating::softmax,
     .expert_weights_norm = true},
    // gpt-oss: clamped SwiGLU experts, top-k by logit then a softmax over the k (softmax_weight), the FFN's norm
    // named post_attention_norm, a sink in every softmax, biases everywhere, even layers local (only that
    // pattern), one rope base, and queries scaled by the rotated width as llama.cpp does.
    {.name = "gpt-oss",
     .arch = Arch::gpt_oss,
     .rope_style = RopeStyle::neox,
     .ffn_act = FfnActivation::swiglu_oai,
     .ffn_norm_post_attention = true,
     .attn_sinks = true,
     .experts = FamilyExperts::routed,
     .gating = ExpertGating::softmax_weight,
     .expert_bias = true,
     .window = {.key = SlidingWindowRule::Key::required,
                .period = 2,
                .n_local = 1,
                .only_pattern = 2,
                .pattern_text = "even layers local"},
     .one_rope_base = true,
     .attn_scale_width = AttnScaleWidth::n_rot},
    // smollm3: llama's layers, with RoPE left out of every 4th.
    {.name = "smollm3", .arch = Arch::smollm3, .no_rope_period = 4},
    // phi3 (Phi-3, Phi-4): fused attn_qkv and gate/up tensors (engine/weights.cpp), neox RoPE, often partial, and
    // LongRoPE wherever its factor tensors are. Its attention.sliding_window is read by llama.cpp and then switched
    // off (its conversions do not say which layers slide), so every layer attends globally here too.
    {.name = "phi3",
     .arch = Arch::phi3,
     .rope_style = RopeStyle::neox,
     .ffn_gate_up_fused = true,
     .longrope_from_tensors = true},
    // mistral3 (Ministral 3): llama's layers (the converter permutes q/k for adjacent pairs), usually with YaRN
    // and an attention temperature.
    {.name = "mistral3", .arch = Arch::mistral3, .rope_freqs_tensor = true, .float_keys = kMistral3Keys},
    // granite (Granite 3.x): llama's layers with four multipliers, and RoPE switched by rope.scaling.finetuned.
    {.name = "granite", .arch = Arch::granite, .rope_switch_key = "rope.scaling.finetuned", .float_keys = kGraniteKeys},
    // olmo2 (OLMo 2): no pre-norms (each block reads the residual stream, its output normed before the add), q and
    // k normed over their whole width, neox RoPE. OLMo 3's files are olmo2 with sliding-window layers.
    {.name = "olmo2",
     .arch = Arch::olmo2,
     .rope_style = RopeStyle::neox,
     .qk_norm = true,
     .qk_norm_whole = true,
     .pre_norms = false,
     .post_norms = true,
     .window = {.key = SlidingWindowRule::Key::refused,
                .refused_why = "sliding-window layers (OLMo 3) are not supported yet"}},
    // glm4moe (GLM-4.5/4.6/4.7 and -Air): leading dense layers, then routed experts chosen by sigmoid probability
    // plus a selection bias, and shared experts; q/k/v biases, q/k norms in the files that have them (GLM-4.5),
    // partial neox RoPE, the FFN's norm named post_attention_norm, and the next-token-prediction layers at the end
    // of block_count loaded and not run (as llama.cpp does without a drafter).
    {.name = "glm4moe",
     .arch = Arch::glm4moe,
     .rope_style = RopeStyle::neox,
     .qkv_bias = true,
     .ffn_norm_post_attention = true,
     .experts = FamilyExperts::routed,
     .gating = ExpertGating::sigmoid,
     .routing_from_file = true,
     .expert_probs_bias = true,
     .leading_dense = true,
     .nextn_layers = true,
     .qk_norm_optional = true},
    // gemma4 (Gemma 4 E2B/E4B, 31B): gemma3's layers with the local layers named by a per-layer array and their
    // own head sizes and rope, q/k normed and V normed, q.k unscaled, per-layer token embeddings, the last layers
    // sharing the KV of earlier ones, each layer's output optionally scaled (layer_output_scale.weight).
    {.name = "gemma4",
     .arch = Arch::gemma4,
     .rope_style = RopeStyle::neox,
     .ffn_act = FfnActivation::gelu_tanh,
     .qk_norm = true,
     .post_norms = true,
     .embed_scale_sqrt_dim = true,
     .gemma4_layers = true,
     .fixed_attn_scale = 1.0f,
     .window = {.key = SlidingWindowRule::Key::pattern_array},
     .rope_freqs_tensor = true,
     .float_keys = kGemma4Keys},
};

constexpr bool in_arch_order() {
    for (size_t i = 0; i < std::size(kFamilies); ++i)
        if (static_cast<size_t>(kFamilies[i].arch) != i) return false;
    return true;
}
static_assert(in_arch_order(), "kFamilies must list the families in Arch order (arch_name indexes it)");

constexpr std::array<std::string_view, std::size(kFamilies)> kNames = [] {
    std::array<std::string_view, std::size(kFamilies)> names{};
    for (size_t i = 0; i < names.size(); ++i)
        names[i] = kFamilies[i].name;
    return names;
}();

} // namespace

std::span<const FamilyDescriptor> families() {
    return kFamilies;
}

const FamilyDescriptor* find_family(std::string_view name) {
    const auto it = std::find_if(std::begin(kFamilies), std::end(kFamilies),
                                 [&](const FamilyDescriptor& f) { return f.name == name; });
    return it == std::end(kFamilies) ? nullptr : &*it;
}

const FamilyDescriptor& family_of(Arch arch) {
    return kFamilies[static_cast<size_t>(arch)];
}

std::span<const std::string_view> supported_architectures() {
    return kNames;
}

std::string_view arch_name(Arch arch) {
    return kNames[static_cast<size_t>(arch)];
}

} // namespace tern
