#include "engine/model_config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>

#include "base/error.h"
#include "base/finite.h"
#include "engine/families.h"
#include "formats/gguf.h"
#include "formats/text.h"

namespace tern {
namespace {

std::string supported_list() {
    std::string s;
    for (std::string_view n : supported_architectures()) {
        if (!s.empty()) s += ", ";
        s += n;
    }
    return s;
}

// YaRN's correction range (in pairs) for one rope base: the pairs whose wavelength fits the original context
// between beta_fast and beta_slow turns, in float as llama.cpp's ggml_rope_yarn_corr_dims computes it.
void yarn_corr_range(int32_t n_rot, int32_t n_ctx_orig, float base, float beta_fast, float beta_slow, float& low,
                     float& high) {
    const auto dim_for = [&](float beta) {
        constexpr float kTwoPi = 6.28318530717958647692f;
        return static_cast<float>(n_rot) * std::log(static_cast<float>(n_ctx_orig) / (beta * kTwoPi)) /
               (2.0f * std::log(base));
    };
    low = std::max(0.0f, std::floor(dim_for(beta_fast)));
    high = std::min(static_cast<float>(n_rot - 1), std::ceil(dim_for(beta_slow)));
}

// The magnitude YaRN gives rotated q/k values (their cos/sin multiplier) for a scaling factor: the
// attention factor 0.1 ln(factor) + 1 (per transformers' yarn_get_mscale), divided by the same with
// yarn_log_multiplier when the file gives one, times rope.scaling.attn_factor. Float steps in llama.cpp's order
// (an attention factor that cancels the kernel's 0.1 ln(1/freq_scale) + 1, then the kernel's multiply).
float yarn_mscale(float freq_scale, float log_mul, float attn_factor) {
    const auto get_mscale = [](float scale, float m) {
        return scale <= 1.0f ? 1.0f : 0.1f * m * std::log(scale) + 1.0f;
    };
    const float factor = 1.0f / freq_scale;
    float attn = log_mul != 0.0f ? get_mscale(factor, 1.0f) / get_mscale(factor, log_mul) : get_mscale(factor, 1.0f);
    attn *= 1.0f / (1.0f + 0.1f * std::log(factor));
    attn *= attn_factor;
    return attn * (1.0f + 0.1f * std::log(1.0f / freq_scale));
}

class MetaReader {
public:
    MetaReader(const GgufFile& file, std::string_view arch) : file_(file), prefix_(std::string(arch) + ".") {}

    std::string key(std::string_view suffix) const { return prefix_ + std::string(suffix); }
    bool has(std::string_view suffix) const { return file_.has(key(suffix)); }
    int64_t get_int(std::string_view suffix) const { return file_.get_int(key(suffix)); }
    int64_t get_int(std::string_view suffix, int64_t fallback) const { return file_.get_int(key(suffix), fallback); }
    float get_f32(std::string_view suffix, float fallback) const { return file_.get_f32(key(suffix), fallback); }
    float get_f32(std::string_view suffix) const { return file_.get_f32(key(suffix)); }
    std::string get_string(std::string_view suffix, const std::string& fallback) const {
        return file_.get_string(key(suffix), fallback);
    }
    bool get_bool(std::string_view suffix, bool fallback) const { return file_.get_bool(key(suffix), fallback); }
    std::vector<int64_t> per_layer(std::string_view suffix, int64_t n_layers) const {
        return file_.get_per_layer(key(suffix), n_layers);
    }

    [[noreturn]] void fail(std::string_view suffix, const std::string& what) const {
        throw InputError(file_.path() + ": metadata " + key(suffix) + ": " + what);
    }
    // A positive count (at least min) that fits the int32 the backends index with.
    int32_t checked_count(std::string_view suffix, int64_t v, int64_t max = (int64_t{1} << 30), int64_t min = 1) const {
        if (v < min || v > max)
            fail(suffix, "value " + std::to_string(v) + " is out of range (expected " + std::to_string(min) + ".." +
                             std::to_string(max) + ")");
        return static_cast<int32_t>(v);
    }
    // A float key's value when it is finite and within `range`; else one line naming the key, the value, the
    // range and why the range is what it is.
    float checked_f32(std::string_view suffix, float v, const FloatRange& range) const {
        if (!range.contains(v)) fail(suffix, "value " + float_text(v) + " is out of range (" + range.text() + ")");
        return v;
    }
    float get_f32_in(std::string_view suffix, float fallback, const FloatRange& range) const {
        return checked_f32(suffix, get_f32(suffix, fallback), range);
    }

private:
    const GgufFile& file_;
    std::string prefix_;
};

// Largest expert count accepted (llama.cpp's LLAMA_MAX_EXPERTS).
constexpr int64_t kMaxExperts = 1024;

// The range of every float key all families read (FloatRange: finite always; a family's own keys have theirs in
// engine/families.cpp). The bounds are the keys' meanings, wide enough for every published model (epsilons 1e-6..1e-5,
// bases 1e4..1e7, YaRN factors 4..64, attention factors near 1).
constexpr float kFloatMax = std::numeric_limits<float>::max();
constexpr FloatRange kEpsilonRange{0.0f, false, 1.0f, "a norm's epsilon is a small positive guard"};
constexpr FloatRange kRopeBaseRange{1.0f, false, kFloatMax, "the rope frequencies base^(-2i/n_rot) must fall with i"};
// The scaling factors' upper bound is set per file: the context they stretch to, factor x the original context,
// must stay within the 2^31 positions tern indexes.
constexpr FloatRange kLinearFactorRange{0.0f, false, kFloatMax,
                                        "the original context times the factor must stay within 2^31 positions"};
constexpr FloatRange kYarnFactorRange{1.0f, true, kFloatMax,
                                      "YaRN stretches the original context by the factor, to at most 2^31 positions"};
constexpr FloatRange kYarnExtRange{0.0f, true, 1.0f, "the share of the extrapolated angle in YaRN's ramp"};
constexpr FloatRange kYarnBetaRange{0.0f, false, kFloatMax, "a number of rotations in the original context"};
constexpr FloatRange kYarnLogMulRange{0.0f, true, kFloatMax, "a multiplier of YaRN's 0.1 ln(factor)"};
constexpr FloatRange kAttnFactorRange{0.0f, false, 10.0f, "it multiplies every rotated q and k value"};
constexpr FloatRange kExpertScaleRange{0.0f, false, kFloatMax, "it multiplies the chosen experts' weights"};

// llama.cpp's expert_gating_func values (LLAMA_EXPERT_GATING_FUNC_TYPE); 0 says nothing (the architecture's own).
constexpr std::array<std::string_view, 4> kGatingFuncNames = {"none", "softmax", "sigmoid", "softmax_weight"};

int64_t gating_func_value(ExpertGating g) {
    switch (g) {
    case ExpertGating::softmax:
        return 1;
    case ExpertGating::sigmoid:
        return 2;
    case ExpertGating::softmax_weight:
        return 3;
    }
    return 0;
}

// The routing keys a file may carry beside what its architecture fixes (llama.cpp's keys; its graphs for these
// families fix the gating function and apply no weight scale, so a file saying otherwise was made for a
// different router and would run wrong, not fail): expert_gating_func must be a value the format defines and the
// architecture's own (or 0), expert_weights_scale a finite positive 1.
void check_routing_keys(const MetaReader& meta, std::string_view arch, ExpertGating gating) {
    if (meta.has("expert_gating_func")) {
        const int64_t v = meta.get_int("expert_gating_func");
        const int64_t own = gating_func_value(gating);
        const std::string own_text = std::to_string(own) + " " + std::string(kGatingFuncNames[size_t(own)]);
        if (v < 0 || v >= static_cast<int64_t>(kGatingFuncNames.size()))
            meta.fail("expert_gating_func", "value " + std::to_string(v) +
                                                " is not a gating function (the format defines 0 none, 1 softmax, "
                                                "2 sigmoid, 3 softmax_weight; " +
                                                std::string(arch) + " routes by " + own_text + ")");
        if (v != 0 && v != own)
            meta.fail("expert_gating_func",
                      "value " + std::to_string(v) + " (" + std::string(kGatingFuncNames[size_t(v)]) +
                          ") is not supported: " + std::string(arch) + " routes its experts by " + own_text);
    }
    if (meta.has("expert_weights_scale")) {
        const float scale = meta.get_f32_in("expert_weights_scale", 1.0f, kExpertScaleRange);
        if (scale != 1.0f)
            meta.fail("expert_weights_scale", "value " + float_text(scale) + " is not supported: " + std::string(arch) +
                                                  " weights its experts without a scale (1)");
    }
}

// A llama whose metadata counts experts (Mixtral): llama.cpp routes it like qwen3moe (softmax, the top-k
// weights divided by their sum, no scale key read) and sizes its experts by feed_forward_length, ignoring
// expert_feed_forward_length.
void read_llama_experts(const MetaReader& meta, int32_t n_layers, ModelConfig& c) {
    c.n_expert = meta.checked_count("expert_count", meta.get_int("expert_count"), kMaxExperts);
    c.n_expert_used = meta.checked_count("expert_used_count", meta.get_int("expert_used_count"), c.n_expert);
    const std::vector<int64_t> widths = meta.per_layer("feed_forward_length", n_layers);
    for (const int64_t w : widths)
        if (w != widths.front())
            meta.fail("feed_forward_length", "differs between layers (" + std::to_string(widths.front()) + " and " +
                                                 std::to_string(w) + "); a mixture-of-experts llama needs one width");
    c.expert_ffn_dim = meta.checked_count("feed_forward_length", widths.front());
    if (meta.has("expert_shared_count") && meta.get_int("expert_shared_count") != 0)
        meta.fail("expert_shared_count", "value " + std::to_string(meta.get_int("expert_shared_count")) +
                                             ": shared experts are not supported yet");
    c.expert_gating = ExpertGating::softmax;
    c.expert_weights_norm = true;
    check_routing_keys(meta, "llama", c.expert_gating);
}

// A family whose files say how they route (glm4moe, as llama.cpp reads it): expert_gating_func (0 or absent: the
// family's own), expert_weights_norm (false when absent), expert_weights_scale (0 or absent: none),
// expert_shared_count (required; shared experts of n_shared expert widths), the selection bias, and
// leading_dense_block_count (the first layers dense, read with the layers).
void read_file_routing(const MetaReader& meta, const FamilyDescriptor& family, ModelConfig& c) {
    if (meta.has("expert_gating_func")) {
        const int64_t v = meta.get_int("expert_gating_func");
        if (v < 0 || v >= static_cast<int64_t>(kGatingFuncNames.size()))
            meta.fail("expert_gating_func", "value " + std::to_string(v) +
                                                " is not a gating function (the format defines 0 none, 1 softmax, "
                                                "2 sigmoid, 3 softmax_weight)");
        if (v == 1) c.expert_gating = ExpertGating::softmax;
        if (v == 2) c.expert_gating = ExpertGating::sigmoid;
        if (v == 3) c.expert_gating = ExpertGating::softmax_weight;
    }
    c.expert_weights_norm = meta.get_bool("expert_weights_norm", false);
    if (meta.has("expert_weights_scale")) {
        // llama.cpp reads 0 as no scale.
        const float scale = meta.get_f32("expert_weights_scale");
        if (scale != 0.0f) c.expert_weights_scale = meta.checked_f32("expert_weights_scale", scale, kExpertScaleRange);
    }
    c.n_expert_shared = meta.checked_count("expert_shared_count", meta.get_int("expert_shared_count"), kMaxExperts, 0);
    c.expert_shared_ffn_dim = c.n_expert_shared * c.expert_ffn_dim;
    c.expert_probs_bias = family.expert_probs_bias;
}

// The expert metadata (llama.cpp's keys): required and checked for a family with routed experts; for one without,
// an expert_count above 0 is refused rather than run as dense (llama's Mixtral: read above).
void read_experts(const MetaReader& meta, const FamilyDescriptor& family, ModelConfig& c) {
    const std::string arch(family.name);
    if (family.experts == FamilyExperts::llama_optional && meta.has("expert_count") &&
        meta.get_int("expert_count") > 0) {
        read_llama_experts(meta, c.n_layers, c);
        return;
    }
    if (family.experts != FamilyExperts::routed) {
        if (meta.has("expert_count") && meta.get_int("expert_count") > 0)
            meta.fail("expert_count", "value " + std::to_string(meta.get_int("expert_count")) +
                                          ": mixture-of-experts " + arch +
                                          " models are not supported yet (supported: qwen3moe, gpt-oss, glm4moe and "
                                          "llama: Mixtral)");
        return;
    }
    c.n_expert = meta.checked_count("expert_count", meta.get_int("expert_count"), kMaxExperts);
    c.n_expert_used = meta.checked_count("expert_used_count", meta.get_int("expert_used_count"), c.n_expert);
    // llama.cpp's fallback when the expert width is absent: the dense width split among the used experts.
    if (meta.has("expert_feed_forward_length")) {
        c.expert_ffn_dim =
            meta.checked_count("expert_feed_forward_length", meta.get_int("expert_feed_forward_length"));
    } else {
        if (!meta.has("feed_forward_length"))
            meta.fail("expert_feed_forward_length", "is missing (and no feed_forward_length to derive it from)");
        c.expert_ffn_dim = meta.checked_count("expert_feed_forward_length",
                                              meta.get_int("feed_forward_length") / c.n_expert_used);
    }
    c.expert_gating = family.gating;
    c.expert_weights_norm = family.expert_weights_norm;
    if (family.routing_from_file) {
        read_file_routing(meta, family, c);
        return;
    }
    if (meta.has("expert_shared_count") && meta.get_int("expert_shared_count") != 0)
        meta.fail("expert_shared_count", "value " + std::to_string(meta.get_int("expert_shared_count")) + ": " +
                                             std::string(arch) + " has no shared experts");
    check_routing_keys(meta, arch, c.expert_gating);
}

// The families that accept rope_freqs.weight, as an error line lists them ("llama and mistral3").
std::string rope_freqs_families() {
    std::vector<std::string_view> names;
    for (const FamilyDescriptor& f : families())
        if (f.rope_freqs_tensor) names.push_back(f.name);
    std::string s;
    for (size_t i = 0; i < names.size(); ++i)
        s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + std::string(names[i]);
    return s;
}

// The window of a family's local layers (0: none), checked: a window of 1 would leave each token of a local layer
// attending to itself alone. A pattern key other than the family's own is refused, not ignored.
int32_t read_window(const MetaReader& meta, const GgufFile& file, const SlidingWindowRule& rule) {
    constexpr int64_t kMinWindow = 2, kMaxWindow = int64_t{1} << 30;
    constexpr std::string_view key = "attention.sliding_window", pattern_key = "attention.sliding_window_pattern";
    int32_t window = 0;
    switch (rule.key) {
    case SlidingWindowRule::Key::none:
        return 0;
    case SlidingWindowRule::Key::refused:
        if (meta.has(key) && meta.get_int(key) > 0)
            meta.fail(key, "value " + std::to_string(meta.get_int(key)) + ": " + rule.refused_why);
        return 0;
    case SlidingWindowRule::Key::fallback:
        window = meta.checked_count(key, meta.get_int(key, rule.fallback), kMaxWindow, kMinWindow);
        break;
    case SlidingWindowRule::Key::required:
    case SlidingWindowRule::Key::pattern_array:
        window = meta.checked_count(key, meta.get_int(key), kMaxWindow, kMinWindow);
        break;
    }
    if (rule.only_pattern > 0 && meta.has(pattern_key)) {
        const GgufValue* v = file.find(meta.key(pattern_key));
        if (v->type == GgufType::array || meta.get_int(pattern_key) != rule.only_pattern)
            meta.fail(pattern_key, "only the pattern " + std::to_string(rule.only_pattern) + " (" + rule.pattern_text +
                                       ") is supported");
    }
    return window;
}

// gemma4's sliding_window_pattern: one bool per layer, true for a local layer.
std::vector<bool> read_window_pattern(const MetaReader& meta, const GgufFile& file, int32_t n_layers) {
    constexpr std::string_view key = "attention.sliding_window_pattern";
    const GgufValue* v = file.find(meta.key(key));
    if (!v) meta.fail(key, "missing: one bool per layer (true: a sliding-window layer) is required");
    if (v->type != GgufType::array || v->elem_type != GgufType::boolean ||
        static_cast<int64_t>(v->array.size()) != n_layers)
        meta.fail(key, "expected an array of " + std::to_string(n_layers) + " bools (one per layer)");
    std::vector<bool> local;
    for (const GgufValue& e : v->array) local.push_back(e.u != 0);
    return local;
}

// gemma4's layers: the local layers' head sizes, rotated dims, rope base and window, the global layers' rope
// factors, the KV shared by the last layers (each reads the last layer of its kind that has KV, as llama.cpp
// maps them), V normed, per-layer embeddings.
void read_gemma4_layers(const MetaReader& meta, const GgufFile& file, int32_t window, ModelConfig& c) {
    const std::vector<bool> local = read_window_pattern(meta, file, c.n_layers);
    const int32_t hd_swa = meta.checked_count("attention.key_length_swa", meta.get_int("attention.key_length_swa", c.head_dim));
    const int32_t hdv_swa =
        meta.checked_count("attention.value_length_swa", meta.get_int("attention.value_length_swa", hd_swa));
    if (c.head_dim != c.head_dim_v || hd_swa != hdv_swa)
        meta.fail("attention.value_length", "gemma4 needs equal K and V head sizes (" + std::to_string(c.head_dim) + "/" +
                                                std::to_string(c.head_dim_v) + ", sliding-window " +
                                                std::to_string(hd_swa) + "/" + std::to_string(hdv_swa) + ")");
    const int32_t rot_swa =
        meta.checked_count("rope.dimension_count_swa", meta.get_int("rope.dimension_count_swa", c.n_rot));
    if (rot_swa > hd_swa || rot_swa % 2 != 0)
        meta.fail("rope.dimension_count_swa", "value " + std::to_string(rot_swa) +
                                                  " must be even and at most the head dim " + std::to_string(hd_swa));
    // llama.cpp's defaults for the local layers' rope: base 10000, unscaled.
    const float base_swa = meta.get_f32_in("rope.freq_base_swa", 10000.0f, kRopeBaseRange);
    const int64_t shared = meta.get_int("attention.shared_kv_layers", 0);
    if (shared < 0 || shared > c.n_layers - 2)
        meta.fail("attention.shared_kv_layers", "value " + std::to_string(shared) + " must be in [0, " +
                                                    std::to_string(std::max(0, c.n_layers - 2)) + "]");
    const int32_t first_shared = c.n_layers - static_cast<int32_t>(shared);
    for (int32_t l = 0; l < c.n_layers; ++l) {
        LayerConfig& lc = c.layers[static_cast<size_t>(l)];
        if (local[static_cast<size_t>(l)]) {
            lc.sliding_window = window;
            lc.head_dim = hd_swa;
            lc.head_dim_v = hdv_swa;
            lc.n_rot = rot_swa;
            lc.rope_base = base_swa;
            lc.rope_freq_scale = 1.0f;
            lc.yarn_ext_factor = 0.0f;
            lc.no_freq_factors = true;
        }
        if (l >= first_shared) {
            const int32_t src = first_shared - (local[static_cast<size_t>(l)] ? 2 : 1);
            if (local[static_cast<size_t>(src)] != local[static_cast<size_t>(l)])
                meta.fail("attention.shared_kv_layers",
                          "layer " + std::to_string(l) + " would read the KV of layer " + std::to_string(src) +
                              ", which is not of its kind (sliding-window or global)");
            lc.kv_source = src;
        }
    }
    c.v_norm = true;
    if (meta.has("embedding_length_per_layer_input"))
        c.per_layer_dim = meta.checked_count("embedding_length_per_layer_input",
                                             meta.get_int("embedding_length_per_layer_input"));
}

// A family's own float keys, each checked against its range.
void read_family_keys(const MetaReader& meta, const FamilyDescriptor& family, ModelConfig& c) {
    for (const FamilyFloatKey& k : family.float_keys) {
        const float v = meta.checked_f32(
            k.suffix, k.required ? meta.get_f32(k.suffix) : meta.get_f32(k.suffix, k.fallback), k.range);
        if (v != 0.0f || !k.zero_keeps_default) c.*k.field = v;
    }
}

// The vocabulary and the embedding must agree, as llama.cpp requires: a token id without an
// embedding row would only fail mid-run ("token id 270 is outside the vocabulary"), and a row
// without a token would let sampling pick an id the tokenizer cannot print. <arch>.vocab_size,
// when present, must say the same.
void check_vocabulary_fits(const GgufFile& file, const MetaReader& meta, int32_t rows) {
    const std::string head = file.path() + ": ";
    if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->type == GgufType::array) {
        const uint64_t n_tokens = tokens->array.size();
        if (n_tokens != static_cast<uint64_t>(rows))
            throw InputError(head + "the vocabulary has " + std::to_string(n_tokens) +
                             " tokens (tokenizer.ggml.tokens) but tensor token_embd.weight has " +
                             std::to_string(rows) + " rows, one per token" +
                             (n_tokens > static_cast<uint64_t>(rows)
                                  ? ": token ids " + std::to_string(rows) + ".." + std::to_string(n_tokens - 1) +
                                        " have no embedding"
                                  : std::string()) +
                             " (a vocabulary from another model, or a damaged file?)");
    }
    if (meta.has("vocab_size")) {
        const int64_t declared = meta.get_int("vocab_size");
        if (declared != rows)
            meta.fail("vocab_size", "value " + std::to_string(declared) + " but tensor token_embd.weight has " +
                                        std::to_string(rows) + " rows (a damaged file?)");
    }
}

} // namespace

int32_t ModelConfig::max_n_heads() const {
    int32_t m = 0;
    for (const LayerConfig& l : layers)
        m = std::max(m, l.n_heads);
    return m;
}

int32_t ModelConfig::max_n_kv_heads() const {
    int32_t m = 0;
    for (const LayerConfig& l : layers)
        m = std::max(m, l.n_kv_heads);
    return m;
}

int32_t ModelConfig::max_ffn_dim() const {
    int32_t m = 0;
    for (const LayerConfig& l : layers)
        m = std::max(m, l.ffn_dim);
    return m;
}

float ModelConfig::attn_temperature(int32_t pos) const {
    if (attn_temp_scale == 0.0f) return 1.0f;
    // llama.cpp's float position and float division, then its double log.
    const float steps = std::floor(static_cast<float>(pos) / static_cast<float>(attn_temp_floor));
    return static_cast<float>(std::log(static_cast<double>(steps) + 1.0) * attn_temp_scale + 1.0);
}

int32_t ModelConfig::head_dim_of(int32_t l) const {
    const int32_t d = layers[static_cast<size_t>(l)].head_dim;
    return d > 0 ? d : head_dim;
}

int32_t ModelConfig::head_dim_v_of(int32_t l) const {
    const int32_t d = layers[static_cast<size_t>(l)].head_dim_v;
    return d > 0 ? d : head_dim_v;
}

int32_t ModelConfig::n_rot_of(int32_t l) const {
    const int32_t d = layers[static_cast<size_t>(l)].n_rot;
    return d > 0 ? d : n_rot;
}

bool ModelConfig::uniform_head_dims() const {
    for (int32_t l = 0; l < static_cast<int32_t>(layers.size()); ++l)
        if (head_dim_of(l) != head_dim || head_dim_v_of(l) != head_dim_v) return false;
    return true;
}

bool ModelConfig::shares_kv() const {
    for (const LayerConfig& l : layers)
        if (!l.has_kv()) return true;
    return false;
}

bool ModelConfig::uniform_kv_heads() const {
    for (const LayerConfig& l : layers)
        if (l.n_kv_heads != layers.front().n_kv_heads) return false;
    return true;
}

ModelConfig model_config_from_gguf(const GgufFile& file) {
    const std::string arch_str = file.get_string("general.architecture");
    const FamilyDescriptor* found = find_family(arch_str);
    if (!found)
        throw InputError(file.path() + ": architecture '" + printable(arch_str) +
                         "' is not supported (supported: " + supported_list() + ")");
    const FamilyDescriptor& family = *found;
    const MetaReader meta(file, arch_str);

    ModelConfig c;
    c.arch = family.arch;
    c.name = file.get_string("general.name", arch_str);
    c.rope_style = family.rope_style;
    c.qkv_bias = family.qkv_bias;
    c.qk_norm = family.qk_norm;
    c.qk_norm_whole = family.qk_norm_whole;
    c.pre_norms = family.pre_norms;
    c.post_norms = family.post_norms;
    c.ffn_act = family.ffn_act;
    c.ffn_norm_post_attention = family.ffn_norm_post_attention;
    c.attn_sinks = family.attn_sinks;
    c.expert_bias = family.expert_bias;
    c.ffn_gate_up_fused = family.ffn_gate_up_fused;
    // block_count counts the next-token-prediction layers at its end too (nextn_predict_layers): the decoder runs
    // the others.
    const int32_t n_all = meta.checked_count("block_count", meta.get_int("block_count"), 4096);
    const int32_t n_nextn =
        family.nextn_layers ? meta.checked_count("nextn_predict_layers", meta.get_int("nextn_predict_layers", 0),
                                                 n_all - 1, 0)
                            : 0;
    c.n_layers = n_all - n_nextn;
    read_experts(meta, family, c);
    if (family.leading_dense && c.moe())
        c.n_dense_lead = meta.checked_count("leading_dense_block_count",
                                            meta.get_int("leading_dense_block_count", 0), c.n_layers, 0);
    if (family.qk_norm_optional && file.find_tensor("blk.0.attn_q_norm.weight") != nullptr) c.qk_norm = true;
    c.dim = meta.checked_count("embedding_length", meta.get_int("embedding_length"));
    c.n_ctx_train = meta.checked_count("context_length", meta.get_int("context_length"));
    c.rms_eps = meta.checked_f32("attention.layer_norm_rms_epsilon", meta.get_f32("attention.layer_norm_rms_epsilon"),
                                 kEpsilonRange);

    const GgufTensor& embd = file.tensor("token_embd.weight");
    if (embd.n_dims != 2 || embd.ne[0] != c.dim)
        throw InputError(file.path() + ": tensor token_embd.weight has shape " + embd.shape_string() +
                         " but expected [" + std::to_string(c.dim) + ", vocab]");
    c.vocab = meta.checked_count("vocab_size", embd.ne[1]);
    check_vocabulary_fits(file, meta, c.vocab);

    const std::vector<int64_t> n_heads = meta.per_layer("attention.head_count", n_all);
    const std::vector<int64_t> n_kv_heads =
        meta.has("attention.head_count_kv") ? meta.per_layer("attention.head_count_kv", n_all) : n_heads;
    // A layer of experts multiplies the expert width; feed_forward_length is read only when a layer is dense.
    const auto is_moe = [&](int32_t l) { return c.moe() && l >= c.n_dense_lead; };
    const std::vector<int64_t> ffn_dim = c.moe() && c.n_dense_lead == 0
                                             ? std::vector<int64_t>(static_cast<size_t>(n_all), c.expert_ffn_dim)
                                             : meta.per_layer("feed_forward_length", n_all);

    // Head dims: key_length/value_length, defaulting to dim / n_heads of the first layer.
    const int32_t n_heads0 = meta.checked_count("attention.head_count", n_heads[0]);
    c.head_dim = meta.checked_count("attention.key_length", meta.get_int("attention.key_length", c.dim / n_heads0));
    c.head_dim_v = meta.checked_count("attention.value_length", meta.get_int("attention.value_length", c.head_dim));
    c.n_rot = meta.checked_count("rope.dimension_count", meta.get_int("rope.dimension_count", c.head_dim));
    if (c.n_rot > c.head_dim || c.n_rot % 2 != 0)
        meta.fail("rope.dimension_count", "value " + std::to_string(c.n_rot) +
                                              " must be even and at most the head dim " + std::to_string(c.head_dim));

    // RoPE frequencies and scaling.
    const float rope_base = meta.get_f32_in("rope.freq_base", 10000.0f, kRopeBaseRange);
    const std::string scaling = meta.get_string("rope.scaling.type", "linear");
    std::string_view factor_key = "rope.scaling.factor";
    float factor = meta.get_f32(factor_key, 0.0f);
    if (factor == 0.0f && meta.has("rope.scale_linear")) { // older spelling
        factor_key = "rope.scale_linear";
        factor = meta.get_f32(factor_key);
    }
    float rope_freq_scale = 1.0f;
    const bool yarn = scaling == "yarn";
    c.rope_n_ctx_orig = meta.checked_count("rope.scaling.original_context_length",
                                           meta.get_int("rope.scaling.original_context_length", c.n_ctx_train));
    c.rope_longrope = scaling == "longrope";
    if (family.longrope_from_tensors && (file.find_tensor("rope_factors_long.weight") != nullptr ||
                                         file.find_tensor("rope_factors_short.weight") != nullptr))
        c.rope_longrope = true;
    if (scaling == "linear" || yarn || c.rope_longrope) {
        // 0 (or no key) is no scaling, as the format says; YaRN given a factor needs one that stretches.
        FloatRange range = yarn && meta.has(factor_key) ? kYarnFactorRange : kLinearFactorRange;
        range.hi = static_cast<float>(std::numeric_limits<int32_t>::max()) / static_cast<float>(c.rope_n_ctx_orig);
        if (factor != 0.0f || range.lo_closed) rope_freq_scale = 1.0f / meta.checked_f32(factor_key, factor, range);
    } else if (scaling != "none") {
        meta.fail("rope.scaling.type",
                  "'" + printable(scaling) + "' is not supported (supported: none, linear, yarn, longrope)");
    }
    if (!(rope_freq_scale > 0.0f) || !std::isfinite(rope_freq_scale)) // a factor so small its inverse overflows
        meta.fail(factor_key, "value " + float_text(factor) + " is out of range (1 / factor is not finite)");
    // YaRN's parameters; absent keys take llama.cpp's defaults (ext_factor 1, betas 32 and 1, no log multiplier).
    float yarn_ext = 0.0f, beta_fast = 32.0f, beta_slow = 1.0f, log_mul = 0.0f;
    if (yarn) {
        yarn_ext = meta.get_f32_in("rope.scaling.yarn_ext_factor", 1.0f, kYarnExtRange);
        beta_fast = meta.get_f32_in("rope.scaling.yarn_beta_fast", beta_fast, kYarnBetaRange);
        beta_slow = meta.get_f32_in("rope.scaling.yarn_beta_slow", beta_slow, kYarnBetaRange);
        log_mul = meta.get_f32_in("rope.scaling.yarn_log_multiplier", log_mul, kYarnLogMulRange);
    }
    const float attn_factor = meta.get_f32_in("rope.scaling.attn_factor", 1.0f, kAttnFactorRange);
    c.rope_freq_factors = file.find_tensor("rope_freqs.weight") != nullptr;
    if (c.rope_freq_factors && c.rope_longrope)
        throw InputError(file.path() + ": tensor rope_freqs.weight cannot go with rope.scaling.type longrope "
                                       "(its factors are rope_factors_long / rope_factors_short)");
    if (c.rope_freq_factors && !family.rope_freqs_tensor)
        throw InputError(file.path() + ": tensor rope_freqs.weight is only supported for " + rope_freqs_families() +
                         " models, not " + arch_str);

    const SlidingWindowRule& window_rule = family.window;
    const int32_t window = read_window(meta, file, window_rule);
    const bool rope_switched_on = family.rope_switch_key.empty() || meta.get_bool(family.rope_switch_key, true);

    c.layers.resize(static_cast<size_t>(n_all));
    for (int32_t l = 0; l < n_all; ++l) {
        LayerConfig& lc = c.layers[static_cast<size_t>(l)];
        lc.n_heads = meta.checked_count("attention.head_count", n_heads[static_cast<size_t>(l)]);
        lc.n_kv_heads = meta.checked_count("attention.head_count_kv", n_kv_heads[static_cast<size_t>(l)]);
        lc.moe = is_moe(l);
        lc.nextn = l >= c.n_layers;
        lc.ffn_dim = lc.moe ? c.expert_ffn_dim
                            : meta.checked_count("feed_forward_length", ffn_dim[static_cast<size_t>(l)]);
        if (lc.n_heads % lc.n_kv_heads != 0)
            meta.fail("attention.head_count_kv", "layer " + std::to_string(l) + ": " + std::to_string(lc.n_kv_heads) +
                                                     " KV heads do not divide " + std::to_string(lc.n_heads) +
                                                     " query heads");
        lc.rope_base = rope_base;
        lc.rope_freq_scale = rope_freq_scale;
        lc.rope_mscale = attn_factor;
        if (yarn_ext != 0.0f) {
            lc.yarn_ext_factor = yarn_ext;
            yarn_corr_range(c.n_rot, c.rope_n_ctx_orig, rope_base, beta_fast, beta_slow, lc.yarn_corr_low,
                            lc.yarn_corr_high);
            lc.rope_mscale = yarn_mscale(rope_freq_scale, log_mul, attn_factor);
        }
        if (window > 0 && l % window_rule.period < window_rule.n_local) {
            lc.sliding_window = window;
            if (window_rule.local_rope_unscaled) {
                lc.rope_base = 10000.0f;
                lc.rope_freq_scale = 1.0f;
                lc.yarn_ext_factor = 0.0f;
                lc.rope_mscale = attn_factor;
            }
        }
        lc.head_dim = c.head_dim;
        lc.head_dim_v = c.head_dim_v;
        lc.n_rot = c.n_rot;
        if (window_rule.key == SlidingWindowRule::Key::pattern_array) lc.sliding_window = 0;   // read below
        if (family.no_rope_period > 0 && (l + 1) % family.no_rope_period == 0) lc.no_rope = true;
        if (!rope_switched_on) lc.no_rope = true;
    }
    c.nextn_layers.assign(c.layers.begin() + c.n_layers, c.layers.end());
    c.layers.resize(static_cast<size_t>(c.n_layers));

    // Attention scale: 1/sqrt(head_dim) (or of the rotated width), except a family's wide model (the 27B gemmas),
    // which uses 1/sqrt(dim / n_heads).
    const int32_t scale_width = family.attn_scale_width == AttnScaleWidth::n_rot ? c.n_rot : c.head_dim;
    c.attn_scale = 1.0f / std::sqrt(static_cast<float>(scale_width));
    if (family.attn_scale_by_dim_layers > 0 && c.n_layers == family.attn_scale_by_dim_layers)
        c.attn_scale = 1.0f / std::sqrt(static_cast<float>(c.dim / n_heads0));
    if (family.fixed_attn_scale > 0.0f) c.attn_scale = family.fixed_attn_scale;
    if (family.gemma4_layers) read_gemma4_layers(meta, file, window, c);
    if (family.embed_scale_sqrt_dim) c.embed_scale = std::sqrt(static_cast<float>(c.dim));
    read_family_keys(meta, family, c);
    if (family.one_rope_base && meta.has("rope.freq_base_swa") && meta.get_f32("rope.freq_base_swa") != rope_base)
        meta.fail("rope.freq_base_swa", "a separate rope base for the sliding-window layers is not supported");
    if (c.attn_temp_scale != 0.0f)
        c.attn_temp_floor = c.rope_n_ctx_orig; // the temperature's floor: the original context

    c.tied_output = file.find_tensor("output.weight") == nullptr;
    return c;
}

} // namespace tern
