#include "quant/plan.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <numeric>
#include <regex>
#include <set>
#include <string>

#include "base/error.h"

namespace tern {
namespace {

// LLAMA_FTYPE ids from ../shared/FORMATS.md §5.6; f8_e4m3 is tern's (1000, like its tensor id).
constexpr std::array kFtypes = {
    FtypeInfo{QuantFtype::f32, "f32", 0, GgmlType::F32},
    FtypeInfo{QuantFtype::f16, "f16", 1, GgmlType::F16},
    FtypeInfo{QuantFtype::bf16, "bf16", 32, GgmlType::BF16},
    FtypeInfo{QuantFtype::q4_0, "q4_0", 2, GgmlType::Q4_0},
    FtypeInfo{QuantFtype::q4_1, "q4_1", 3, GgmlType::Q4_1},
    FtypeInfo{QuantFtype::q5_0, "q5_0", 8, GgmlType::Q5_0},
    FtypeInfo{QuantFtype::q5_1, "q5_1", 9, GgmlType::Q5_1},
    FtypeInfo{QuantFtype::q8_0, "q8_0", 7, GgmlType::Q8_0},
    FtypeInfo{QuantFtype::q2_k, "q2_k", 10, GgmlType::Q2_K},
    FtypeInfo{QuantFtype::q3_k_s, "q3_k_s", 11, GgmlType::Q3_K},
    FtypeInfo{QuantFtype::q3_k_m, "q3_k_m", 12, GgmlType::Q3_K},
    FtypeInfo{QuantFtype::q4_k_s, "q4_k_s", 14, GgmlType::Q4_K},
    FtypeInfo{QuantFtype::q4_k_m, "q4_k_m", 15, GgmlType::Q4_K},
    FtypeInfo{QuantFtype::q5_k_s, "q5_k_s", 16, GgmlType::Q5_K},
    FtypeInfo{QuantFtype::q5_k_m, "q5_k_m", 17, GgmlType::Q5_K},
    FtypeInfo{QuantFtype::q6_k, "q6_k", 18, GgmlType::Q6_K},
    FtypeInfo{QuantFtype::f8_e4m3, "f8_e4m3", 1000, GgmlType::F8_E4M3},
    FtypeInfo{QuantFtype::mxfp4_moe, "mxfp4_moe", 38, GgmlType::MXFP4},
    FtypeInfo{QuantFtype::mxfp4, "mxfp4", 38, GgmlType::MXFP4},   // after mxfp4_moe: file type 38 reads as that
};

bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

int effective_dims(const int64_t ne[4]) {
    int n = 4;
    while (n > 1 && ne[n - 1] == 1) --n;
    return n;
}

// The layer of a "blk.N." name, -1 for names without one.
int64_t layer_of(std::string_view name) {
    if (!name.starts_with("blk.")) return -1;
    int64_t v = 0;
    size_t i = 4;
    if (i >= name.size() || !std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) {
        v = v * 10 + (name[i] - '0');
        if (v > (int64_t{1} << 40)) return -1;
        ++i;
    }
    if (i >= name.size() || name[i] != '.') return -1;
    return v;
}

bool is_plain_float(QuantFtype f) { return f == QuantFtype::f32 || f == QuantFtype::f16 || f == QuantFtype::bf16; }

std::string tname(GgmlType t) { return std::string(type_name(t)); }

// The state llama-quantize carries from tensor to tensor: the attn_v and ffn_down counters.
struct Counters {
    int64_t n_attn_v = 0;   // tensors named *attn_v.weight / *attn_qkv.weight / *attn_kv_b.weight
    int64_t i_attn_v = 0;
    int64_t i_ffn_down = 0;
    bool has_output = false;
};

// FORMATS.md §5.2-5.3 for a quantized ftype (not --pure). Returns the type and sets `reason`
// when it differs from the default.
GgmlType mixture_type(const PlanInput& t, const ModelFacts& m, QuantFtype f, GgmlType def, Counters& c,
                      std::string& reason) {
    using F = QuantFtype;
    const std::string& name = t.name;
    const int64_t gqa = (m.n_head > 0 && m.n_head_kv > 0) ? m.n_head / m.n_head_kv : 0;
    GgmlType type = def;

    if (f == F::mxfp4_moe || f == F::mxfp4) {
        // llama-quantize's MXFP4_MOE rule comes before every other one: experts MXFP4, everything else Q8_0.
        const bool is_output = name == "output.weight" || (!c.has_output && name == "token_embd.weight");
        const bool ffn_matrix = contains(name, "ffn_up") || contains(name, "ffn_gate") || contains(name, "ffn_down");
        if (!is_output && (t.ne[2] > 1 || (f == F::mxfp4 && ffn_matrix))) return GgmlType::MXFP4;
        reason = is_output ? "output tensor" : f == F::mxfp4 ? "not an FFN tensor" : "not an expert tensor";
        return GgmlType::Q8_0;
    }
    // gemma4's per_layer_token_embd is a token embedding to llama-quantize: the output's type when tied.
    if (name == "output.weight" ||
        (!c.has_output && (name == "token_embd.weight" || name == "per_layer_token_embd.weight"))) {
        if (t.ne[0] % block_elems(def) != 0) type = GgmlType::Q8_0;
        else if (def != GgmlType::Q8_0) type = GgmlType::Q6_K;
        reason = "output tensor";
        return type;
    }
    if (contains(name, "token_embd.weight")) return type;   // untied embeddings keep the default

    // llama-quantize treats the fused q/k/v (phi3) and the MLA kv_b tensors as attn_v: the same rules, one counter.
    const bool attn_v_like = contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") ||
                             contains(name, "attn_kv_b.weight");
    // llama-quantize gives an 8-expert model's attn_k and attn_v Q8_0 ("trades just ~128MB"), whatever the rules
    // below say.
    if (m.n_expert == 8 && (contains(name, "attn_k.weight") || attn_v_like)) {
        if (attn_v_like) ++c.i_attn_v;
        reason = "8-expert attn_k/attn_v";
        return GgmlType::Q8_0;
    }
    if (attn_v_like) {
        const int64_t i = c.i_attn_v++, n = c.n_attn_v;
        if (f == F::q2_k) type = gqa >= 4 ? GgmlType::Q4_K : GgmlType::Q3_K;
        else if (f == F::q3_k_m) type = i < 2 ? GgmlType::Q5_K : GgmlType::Q4_K;
        else if (f == F::q4_k_s && i < 4) type = GgmlType::Q5_K;
        else if ((f == F::q4_k_m || f == F::q5_k_m) && more_bits(i, n)) type = GgmlType::Q6_K;
        // The 70B models share each attn_v among 8 query heads: llama-quantize gives it more bits.
        const bool is_70b = m.n_layer == 80 && ((m.arch == "llama" && gqa > 1) || m.arch == "qwen2");
        if (is_70b && (type == GgmlType::Q3_K || type == GgmlType::Q4_K)) type = GgmlType::Q5_K;
        if (type != def) reason = "attn_v bump (i=" + std::to_string(i) + " of " + std::to_string(n) + ")";
        return type;
    }
    if (contains(name, "ffn_down")) {
        // MoE models: the layer from the name (llama-quantize's layer_info), not the count of ffn_down tensors seen.
        int64_t i = c.i_ffn_down++;
        const int64_t n = m.n_layer;
        if (m.n_expert > 1 && layer_of(name) >= 0) i = layer_of(name);
        if (f == F::q2_k) type = GgmlType::Q3_K;
        else if (f == F::q3_k_m) type = i < n / 16 ? GgmlType::Q5_K : GgmlType::Q4_K;
        else if (f == F::q4_k_s && i < n / 8) type = GgmlType::Q5_K;
        else if ((f == F::q4_k_m || f == F::q5_k_m) && more_bits(i, n)) type = GgmlType::Q6_K;
        if (type != def) reason = "ffn_down bump (i=" + std::to_string(i) + " of " + std::to_string(n) + ")";
        return type;
    }
    if (contains(name, "attn_output.weight") && m.n_expert == 8) {
        if (f == F::q2_k || f == F::q3_k_s || f == F::q3_k_m || f == F::q4_k_s || f == F::q4_k_m)
            type = GgmlType::Q5_K;
        if (type != def) reason = "8-expert attn_output bump";
        return type;
    }
    if (contains(name, "attn_output.weight")) {
        if (f == F::q2_k) type = GgmlType::Q3_K;
        else if (f == F::q3_k_m) type = GgmlType::Q4_K;
        if (type != def) reason = "attn_output bump";
        return type;
    }
    return type;
}

// FORMATS.md §5.4, plus tern's F8_E4M3 -> F16. Sets `note` when the type changed.
GgmlType width_fallback(const PlanInput& t, GgmlType type, std::string& note) {
    const int64_t width = t.ne[0];
    if (width % block_elems(type) == 0) return type;
    GgmlType fb;
    switch (type) {
    // Q2_K/Q3_K: llama-quantize 0c1e57098 (the peer build) falls back to Q4_0; the FORMATS.md
    // baseline c392e5094 used IQ4_NL. Q4_0 keeps the files byte-identical with today's llama.cpp and
    // its RMS error on embeddings is lower (bench/results: IQ4_NL was up to 4% worse there).
    case GgmlType::Q2_K:
    case GgmlType::Q3_K: fb = GgmlType::Q4_0; break;
    case GgmlType::IQ4_XS: fb = GgmlType::IQ4_NL; break;
    case GgmlType::Q4_K: fb = GgmlType::Q5_0; break;
    case GgmlType::Q5_K: fb = GgmlType::Q5_1; break;
    case GgmlType::Q6_K: fb = GgmlType::Q8_0; break;
    case GgmlType::F8_E4M3: fb = GgmlType::F16; break;
    default:
        // llama-quantize at our baseline (c392e5094) stopped with "Unsupported tensor size" here;
        // later versions (0c1e57098, the peer build) store such tensors as F16, and so does tern:
        // a file with a few F16 tensors is more useful than no file.
        fb = GgmlType::F16;
        break;
    }
    if (width % block_elems(fb) != 0) fb = GgmlType::F16;
    note = tname(type) + " -> " + tname(fb) + ": width " + std::to_string(width) + " is not a multiple of " +
           std::to_string(block_elems(type));
    return fb;
}

} // namespace

const FtypeInfo& ftype_info(QuantFtype f) {
    for (const FtypeInfo& i : kFtypes)
        if (i.ftype == f) return i;
    throw UsageError("unknown quantization type");
}

std::optional<QuantFtype> ftype_from_name(std::string_view name) {
    for (const FtypeInfo& i : kFtypes) {
        if (i.name.size() != name.size()) continue;
        bool eq = true;
        for (size_t k = 0; k < name.size() && eq; ++k)
            eq = std::tolower(static_cast<unsigned char>(name[k])) == i.name[k];
        if (eq) return i.ftype;
    }
    return std::nullopt;
}

std::vector<std::string_view> ftype_names() {
    std::vector<std::string_view> out;
    for (const FtypeInfo& i : kFtypes) out.push_back(i.name);
    return out;
}

const FtypeInfo* ftype_from_file_type(uint32_t id) {
    for (const FtypeInfo& i : kFtypes)
        if (i.file_type == id) return &i;
    return nullptr;
}

uint64_t PlannedTensor::n_bytes() const {
    return static_cast<uint64_t>(row_bytes(to, ne[0])) * static_cast<uint64_t>(ne[1] * ne[2] * ne[3]);
}

uint64_t QuantPlan::data_bytes() const {
    uint64_t sum = 0;
    for (const PlannedTensor& t : tensors) sum += t.n_bytes();
    return sum;
}

bool is_quantizable(std::string_view name, int n_dims) {
    if (!name.ends_with("weight") || n_dims < 2) return false;
    for (std::string_view skip : {"_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight", "attn_rel_b.weight",
                                  "pos_embd", "token_types", "time_mix_first.weight", "time_mix_w1.weight",
                                  "time_mix_w2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
                                  "time_mix_lerp_fused.weight", "altup", "laurel", "per_layer_model_proj"})
        if (contains(name, skip)) return false;
    return true;
}

bool more_bits(int64_t i, int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool tensor_order_less(std::string_view a, std::string_view b) {
    const int64_t la = layer_of(a), lb = layer_of(b);
    if (la != lb) return la < lb;
    return a < b;   // std::string_view compares as unsigned bytes (char_traits<char>::compare)
}

QuantPlan make_quant_plan(const std::vector<PlanInput>& tensors, const ModelFacts& facts, const PlanOptions& options) {
    const FtypeInfo& fi = ftype_info(options.ftype);

    std::vector<std::regex> patterns;
    for (const TypeOverride& o : options.overrides) {
        try {
            patterns.emplace_back(o.pattern, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            throw UsageError("--tensor-type " + o.pattern + ": not a valid regular expression (" + e.what() + ")");
        }
    }

    Counters counters;
    for (const PlanInput& t : tensors) {
        if (t.name == "output.weight") counters.has_output = true;
        if (contains(t.name, "attn_v.weight") || contains(t.name, "attn_qkv.weight") ||
            contains(t.name, "attn_kv_b.weight"))
            ++counters.n_attn_v;
    }

    std::vector<size_t> order(tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return tensor_order_less(tensors[a].name, tensors[b].name); });

    QuantPlan plan;
    plan.ftype = options.ftype;
    std::set<std::string> seen_notes;
    for (size_t idx : order) {
        const PlanInput& t = tensors[idx];
        PlannedTensor p;
        p.source_index = idx;
        p.name = t.name;
        p.from = t.type;
        p.n_dims = t.n_dims;
        std::copy(t.ne, t.ne + 4, p.ne);
        p.quantizable = is_quantizable(t.name, effective_dims(t.ne));
        GgmlType to = t.type;
        if (p.quantizable) {
            const bool is_output =
                t.name == "output.weight" || (!counters.has_output && t.name == "token_embd.weight");
            to = fi.default_type;
            if (options.ftype == QuantFtype::f8_e4m3 && (is_output || t.name == "token_embd.weight")) {
                // FP8 pays off in matrix products; the embedding is a row lookup (no FP8 compute to
                // gain) and the output is the most sensitive matrix, so both stay f16.
                to = GgmlType::F16;
                p.reason = is_output ? "output tensor (f8_e4m3 keeps it f16)" : "token_embd (f8_e4m3 keeps it f16)";
            } else if (!is_plain_float(options.ftype) && options.ftype != QuantFtype::f8_e4m3 && !options.pure) {
                to = mixture_type(t, facts, options.ftype, fi.default_type, counters, p.reason);
            }
            for (size_t k = 0; k < patterns.size(); ++k) {
                if (std::regex_search(t.name, patterns[k])) {
                    to = options.overrides[k].type;
                    p.reason = "--tensor-type " + options.overrides[k].pattern;
                    break;
                }
            }
            to = width_fallback(t, to, p.fallback);
            if (!p.fallback.empty() && seen_notes.insert(p.fallback).second) plan.fallback_notes.push_back(p.fallback);
        }
        p.to = to;
        plan.tensors.push_back(std::move(p));
    }
    return plan;
}

} // namespace tern
