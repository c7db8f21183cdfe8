#include "app/model_summary.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <span>
#include <string_view>

#include "base/error.h"
#include "engine/model_config.h"

namespace tern::app {
namespace {

// LLAMA_FTYPE ids stored in general.file_type (../shared/FORMATS.md §5.6).
std::string file_type_name(int64_t id) {
    static const std::map<int64_t, std::string> names = {
        {0, "all F32"},   {1, "mostly F16"}, {2, "Q4_0"},    {3, "Q4_1"},    {7, "Q8_0"},    {8, "Q5_0"},
        {9, "Q5_1"},      {10, "Q2_K"},      {11, "Q3_K_S"}, {12, "Q3_K_M"}, {13, "Q3_K_L"}, {14, "Q4_K_S"},
        {15, "Q4_K_M"},   {16, "Q5_K_S"},    {17, "Q5_K_M"}, {18, "Q6_K"},   {19, "IQ2_XXS"}, {20, "IQ2_XS"},
        {21, "Q2_K_S"},   {22, "IQ3_XS"},    {23, "IQ3_XXS"}, {24, "IQ1_S"}, {25, "IQ4_NL"}, {26, "IQ3_S"},
        {27, "IQ3_M"},    {28, "IQ2_S"},     {29, "IQ2_M"},  {30, "IQ4_XS"}, {31, "IQ1_M"},  {32, "mostly BF16"},
        {36, "TQ1_0"},    {37, "TQ2_0"},     {38, "MXFP4_MOE"}, {1000, "F8_E4M3 (tern)"},
    };
    auto it = names.find(id);
    return it != names.end() ? it->second : "unknown (" + std::to_string(id) + ")";
}

// Metadata of files in the wild is messy; `info` shows what it can instead of failing on one
// odd key (strict checks belong to the loader).
template <typename F>
auto lenient(F&& f, decltype(f()) fallback) -> decltype(f()) {
    try {
        return f();
    } catch (const TernError&) {
        return fallback;
    }
}

} // namespace

ModelSummary summarize_model(const GgufFile& file) {
    ModelSummary s;
    s.name = lenient([&] { return file.get_string("general.name", ""); }, "");
    s.architecture = lenient([&] { return file.get_string("general.architecture", ""); }, "");
    const std::span<const std::string_view> supported = supported_architectures();
    s.architecture_supported = std::find(supported.begin(), supported.end(), s.architecture) != supported.end();
    if (file.has("general.file_type"))
        s.file_type = file_type_name(lenient([&] { return file.get_int("general.file_type"); }, -1));

    const std::string a = s.architecture + ".";
    auto get_int = [&](const std::string& key) { return lenient([&] { return file.get_int(key, 0); }, int64_t{0}); };
    auto get_max = [&](const std::string& key, int64_t n_layers) {
        return lenient(
            [&] {
                if (!file.has(key)) return int64_t{0};
                // A scalar holds for every layer: not expanded to block_count copies, since
                // block_count is not checked here and a hostile file sets it to 2^40 (fuzz finding).
                if (file.find(key)->type != GgufType::array) return file.get_int(key);
                const std::vector<int64_t> v = file.get_per_layer(key, std::max<int64_t>(n_layers, 1));
                return v.empty() ? int64_t{0} : *std::max_element(v.begin(), v.end());
            },
            int64_t{0});
    };
    if (!s.architecture.empty()) {
        s.n_layers = get_int(a + "block_count");
        s.dim = get_int(a + "embedding_length");
        s.context_length = get_int(a + "context_length");
        s.ffn_dim = get_max(a + "feed_forward_length", s.n_layers);
        s.n_heads = get_max(a + "attention.head_count", s.n_layers);
        s.n_kv_heads = file.has(a + "attention.head_count_kv") ? get_max(a + "attention.head_count_kv", s.n_layers)
                                                               : s.n_heads;
        s.head_dim = get_int(a + "attention.key_length");
        if (s.head_dim == 0 && s.n_heads > 0) s.head_dim = s.dim / s.n_heads;
        s.n_expert = get_int(a + "expert_count");
        s.n_expert_used = get_max(a + "expert_used_count", s.n_layers);
        s.expert_ffn_dim = get_max(a + "expert_feed_forward_length", s.n_layers);
        s.n_expert_shared = get_int(a + "expert_shared_count");
        s.n_dense_lead = get_int(a + "leading_dense_block_count");
        s.n_nextn = get_int(a + "nextn_predict_layers");
        s.head_dim_swa = get_int(a + "attention.key_length_swa");
        s.shared_kv_layers = get_int(a + "attention.shared_kv_layers");
        s.per_layer_dim = get_int(a + "embedding_length_per_layer_input");
    }
    // A tensor of a next-token-prediction layer (blk.N. with N past the decoder's layers) is never run.
    const auto in_nextn_layer = [&](const std::string& name) {
        int64_t layer = -1;
        if (s.n_nextn <= 0 || std::sscanf(name.c_str(), "blk.%" SCNd64 ".", &layer) != 1) return false;
        return layer >= s.n_layers - s.n_nextn;
    };

    std::map<std::string, FormatUse> formats;
    uint64_t total_bytes = 0;
    for (const GgufTensor& t : file.tensors()) {
        s.n_params += static_cast<uint64_t>(t.n_elements());
        // An expert tensor (ne[2] = n_expert): a token reads n_expert_used of its matrices.
        const bool experts = s.n_expert > 0 && s.n_expert_used > 0 && s.n_expert_used <= s.n_expert &&
                             t.ne[2] == s.n_expert && t.name.find("_exps.") != std::string::npos;
        if (!in_nextn_layer(t.name))
            s.n_active_params += experts ? static_cast<uint64_t>(t.n_elements() / s.n_expert * s.n_expert_used)
                                         : static_cast<uint64_t>(t.n_elements());
        total_bytes += t.n_bytes;
        FormatUse& f = formats[std::string(type_name(t.type))];
        f.name = type_name(t.type);
        f.n_tensors += 1;
        f.n_bytes += t.n_bytes;
    }
    for (auto& [name, use] : formats) s.formats.push_back(use);
    std::sort(s.formats.begin(), s.formats.end(),
              [](const FormatUse& x, const FormatUse& y) { return x.n_bytes > y.n_bytes; });
    if (s.n_params > 0) s.bits_per_weight = 8.0 * static_cast<double>(total_bytes) / static_cast<double>(s.n_params);

    s.tokenizer_model = lenient([&] { return file.get_string("tokenizer.ggml.model", ""); }, "");
    s.tokenizer_pre = lenient([&] { return file.get_string("tokenizer.ggml.pre", ""); }, "");
    if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens"))
        s.vocab_size = static_cast<int64_t>(tokens->array.size());
    if (file.has("tokenizer.ggml.bos_token_id")) s.bos = get_int("tokenizer.ggml.bos_token_id");
    if (file.has("tokenizer.ggml.eos_token_id")) s.eos = get_int("tokenizer.ggml.eos_token_id");

    const std::string tmpl = lenient([&] { return file.get_string("tokenizer.chat_template", ""); }, "");
    s.chat_template = tmpl.empty() ? "none" : "present (" + std::to_string(tmpl.size()) + " chars)";
    return s;
}

} // namespace tern::app
