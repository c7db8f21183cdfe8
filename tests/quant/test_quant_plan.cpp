// The quantization plan (quant/plan.h) against ../shared/FORMATS.md §5: more_bits, the mixtures'
// bumps and counters, the output rule, width fallbacks, the order, f8_e4m3, overrides, and every
// tensor type of the llama-quantize files in ../shared/models/synth (manifest.json).
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "base/error.h"
#include "formats/gguf.h"
#include "quant/plan.h"
#include "tests/test_support.h"

using namespace tern;

namespace {

std::set<int64_t> more_bits_set(int64_t n) {
    std::set<int64_t> s;
    for (int64_t i = 0; i < n; ++i)
        if (more_bits(i, n)) s.insert(i);
    return s;
}

PlanInput tensor(const std::string& name, int64_t ne0, int64_t ne1 = 1) {
    PlanInput p;
    p.name = name;
    p.type = GgmlType::F32;
    p.n_dims = ne1 > 1 ? 2 : 1;
    p.ne[0] = ne0;
    p.ne[1] = ne1;
    return p;
}

// A llama-shaped tensor list: dim, n_ff, kv width, vocab; `tied` drops output.weight.
std::vector<PlanInput> llama_tensors(int n_layer, int64_t dim, int64_t n_ff, int64_t kv, int64_t vocab, bool tied) {
    std::vector<PlanInput> t;
    t.push_back(tensor("token_embd.weight", dim, vocab));
    for (int l = 0; l < n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        t.push_back(tensor(p + "attn_norm.weight", dim));
        t.push_back(tensor(p + "attn_q.weight", dim, dim));
        t.push_back(tensor(p + "attn_k.weight", dim, kv));
        t.push_back(tensor(p + "attn_v.weight", dim, kv));
        t.push_back(tensor(p + "attn_output.weight", dim, dim));
        t.push_back(tensor(p + "ffn_norm.weight", dim));
        t.push_back(tensor(p + "ffn_gate.weight", dim, n_ff));
        t.push_back(tensor(p + "ffn_up.weight", dim, n_ff));
        t.push_back(tensor(p + "ffn_down.weight", n_ff, dim));
    }
    t.push_back(tensor("output_norm.weight", dim));
    if (!tied) t.push_back(tensor("output.weight", dim, vocab));
    return t;
}

std::map<std::string, GgmlType> plan_types(const QuantPlan& p) {
    std::map<std::string, GgmlType> m;
    for (const PlannedTensor& t : p.tensors) m[t.name] = t.to;
    return m;
}

QuantPlan plan_for(const std::vector<PlanInput>& t, QuantFtype f, int64_t n_layer, int64_t n_head = 8,
                   int64_t n_head_kv = 8) {
    PlanOptions o;
    o.ftype = f;
    return make_quant_plan(t, ModelFacts{"llama", n_layer, n_head, n_head_kv}, o);
}

std::set<int64_t> layers_with(const QuantPlan& p, const std::string& what, GgmlType type) {
    std::set<int64_t> s;
    for (const PlannedTensor& t : p.tensors)
        if (t.name.find(what) != std::string::npos && t.to == type) s.insert(std::stoll(t.name.substr(4)));
    return s;
}

} // namespace

TEST_CASE("more_bits matches FORMATS.md §5.1 examples") {
    CHECK(more_bits_set(16) == std::set<int64_t>{0, 1, 4, 7, 10, 13, 14, 15});
    CHECK(more_bits_set(12) == std::set<int64_t>{0, 3, 6, 9, 10, 11});
    std::set<int64_t> n32 = {0, 1, 2, 3, 28, 29, 30, 31};
    for (int64_t i = 6; i <= 27; i += 3) n32.insert(i);
    CHECK(more_bits_set(32) == n32);
    CHECK(more_bits_set(2) == std::set<int64_t>{1});
}

TEST_CASE("order: layer-less names first, then blk.N numerically, names bytewise") {
    const auto t = llama_tensors(11, 256, 512, 256, 512, false);
    const QuantPlan p = plan_for(t, QuantFtype::q8_0, 11);
    REQUIRE(p.tensors.size() == t.size());
    CHECK(p.tensors[0].name == "output.weight");
    CHECK(p.tensors[1].name == "output_norm.weight");
    CHECK(p.tensors[2].name == "token_embd.weight");
    CHECK(p.tensors[3].name == "blk.0.attn_k.weight");
    CHECK(p.tensors.back().name == "blk.10.ffn_up.weight");
    CHECK(tensor_order_less("blk.9.ffn_up.weight", "blk.10.attn_k.weight"));
    // source_index points back into the input
    for (const PlannedTensor& x : p.tensors) CHECK(t[x.source_index].name == x.name);
}

TEST_CASE("which tensors are quantized") {
    CHECK(is_quantizable("blk.0.attn_q.weight", 2));
    CHECK_FALSE(is_quantizable("blk.0.attn_norm.weight", 1));
    CHECK_FALSE(is_quantizable("blk.0.attn_q_norm.weight", 2));
    CHECK_FALSE(is_quantizable("blk.0.attn_q.bias", 2));
    CHECK_FALSE(is_quantizable("blk.0.ffn_gate_inp.weight", 2));
    CHECK_FALSE(is_quantizable("blk.0.attn_q.weight", 1));
    // [256, 1] counts as 1-D (trailing 1s dropped)
    std::vector<PlanInput> t = {tensor("blk.0.attn_q.weight", 256, 1)};
    t[0].n_dims = 2;
    CHECK(plan_for(t, QuantFtype::q8_0, 1).tensors[0].to == GgmlType::F32);
}

TEST_CASE("q4_k_m with 16 layers: attn_v and ffn_down bumped where more_bits") {
    const QuantPlan p = plan_for(llama_tensors(16, 256, 768, 256, 512, false), QuantFtype::q4_k_m, 16);
    const std::set<int64_t> expect = {0, 1, 4, 7, 10, 13, 14, 15};
    CHECK(layers_with(p, "attn_v.weight", GgmlType::Q6_K) == expect);
    CHECK(layers_with(p, "ffn_down", GgmlType::Q6_K) == expect);
    const auto m = plan_types(p);
    CHECK(m.at("output.weight") == GgmlType::Q6_K);
    CHECK(m.at("token_embd.weight") == GgmlType::Q4_K);
    CHECK(m.at("blk.3.attn_q.weight") == GgmlType::Q4_K);
    CHECK(m.at("blk.3.attn_norm.weight") == GgmlType::F32);
}

TEST_CASE("phi3's fused attn_qkv takes attn_v's rules and counter (llama-quantize 0c1e570), not a fixed bump") {
    std::vector<PlanInput> t;
    for (int l = 0; l < 16; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        t.push_back(tensor(p + "attn_qkv.weight", 256, 768));
        t.push_back(tensor(p + "attn_output.weight", 256, 256));
    }
    const std::set<int64_t> expect = {0, 1, 4, 7, 10, 13, 14, 15};
    CHECK(layers_with(plan_for(t, QuantFtype::q4_k_m, 16), "attn_qkv", GgmlType::Q6_K) == expect);
    CHECK(layers_with(plan_for(t, QuantFtype::q4_k_m, 16), "attn_qkv", GgmlType::Q4_K).size() == 8);
    const QuantPlan q3 = plan_for(t, QuantFtype::q3_k_m, 16);
    CHECK(layers_with(q3, "attn_qkv", GgmlType::Q5_K) == std::set<int64_t>{0, 1});
    CHECK(layers_with(q3, "attn_qkv", GgmlType::Q4_K).size() == 14);
}

TEST_CASE("q3_k_m / q4_k_s / q2_k counters and GQA rules") {
    const auto t = llama_tensors(16, 256, 768, 64, 512, false);
    const QuantPlan q3 = plan_for(t, QuantFtype::q3_k_m, 16, 8, 2);
    CHECK(layers_with(q3, "attn_v.weight", GgmlType::Q5_K) == std::set<int64_t>{0, 1});
    CHECK(layers_with(q3, "attn_v.weight", GgmlType::Q4_K).size() == 14);
    CHECK(layers_with(q3, "ffn_down", GgmlType::Q5_K) == std::set<int64_t>{0});   // i < 16/16
    CHECK(layers_with(q3, "attn_output", GgmlType::Q4_K).size() == 16);
    const QuantPlan q4s = plan_for(t, QuantFtype::q4_k_s, 16, 8, 2);
    CHECK(layers_with(q4s, "attn_v.weight", GgmlType::Q5_K) == std::set<int64_t>{0, 1, 2, 3});
    CHECK(layers_with(q4s, "ffn_down", GgmlType::Q5_K) == std::set<int64_t>{0, 1});   // i < 16/8
    const QuantPlan q2_gqa4 = plan_for(t, QuantFtype::q2_k, 16, 8, 2);
    CHECK(layers_with(q2_gqa4, "attn_v.weight", GgmlType::Q4_K).size() == 16);
    const QuantPlan q2_gqa2 = plan_for(t, QuantFtype::q2_k, 16, 8, 4);
    CHECK(layers_with(q2_gqa2, "attn_v.weight", GgmlType::Q3_K).size() == 16);
    CHECK(layers_with(q2_gqa2, "ffn_down", GgmlType::Q3_K).size() == 16);
    CHECK(layers_with(q2_gqa2, "attn_output", GgmlType::Q3_K).size() == 16);
    CHECK(layers_with(q2_gqa2, "attn_q", GgmlType::Q2_K).size() == 16);
    const QuantPlan q3s = plan_for(t, QuantFtype::q3_k_s, 16);
    CHECK(layers_with(q3s, "attn_v.weight", GgmlType::Q3_K).size() == 16);
    const QuantPlan q5s = plan_for(t, QuantFtype::q5_k_s, 16);
    CHECK(layers_with(q5s, "ffn_down", GgmlType::Q5_K).size() == 16);
}

TEST_CASE("width 320: q4_k_m bulk q5_0, bumps and output q8_0; q2_k bulk q4_0 (0c1e57098; iq4_nl before)") {
    const auto t = llama_tensors(12, 320, 640, 320, 512, false);
    const QuantPlan p = plan_for(t, QuantFtype::q4_k_m, 12);
    const auto m = plan_types(p);
    CHECK(m.at("blk.1.attn_q.weight") == GgmlType::Q5_0);
    CHECK(m.at("blk.0.attn_v.weight") == GgmlType::Q8_0);    // Q6_K bump -> Q8_0
    CHECK(m.at("blk.1.attn_v.weight") == GgmlType::Q5_0);
    CHECK(m.at("blk.0.ffn_down.weight") == GgmlType::Q8_0);  // more_bits: Q6_K -> Q8_0
    CHECK(m.at("blk.1.ffn_down.weight") == GgmlType::Q5_0);  // width 640 = 2.5 * 256 -> fallback
    CHECK(m.at("output.weight") == GgmlType::Q8_0);
    CHECK_FALSE(p.fallback_notes.empty());
    const auto m2 = plan_types(plan_for(t, QuantFtype::q2_k, 12));
    CHECK(m2.at("blk.1.attn_q.weight") == GgmlType::Q4_0);
    CHECK(m2.at("blk.1.attn_v.weight") == GgmlType::Q4_0);   // Q3_K -> Q4_0
    const auto m5 = plan_types(plan_for(t, QuantFtype::q5_k_m, 12));
    CHECK(m5.at("blk.1.attn_q.weight") == GgmlType::Q5_1);
}

TEST_CASE("widths that fit nothing: f16 fallback (llama-quantize 0c1e57098), reported once") {
    const auto t = llama_tensors(2, 64, 172, 64, 512, false);   // stories260K's widths
    const QuantPlan p = plan_for(t, QuantFtype::q4_k_m, 2);
    const auto m = plan_types(p);
    CHECK(m.at("blk.0.ffn_down.weight") == GgmlType::F16);   // q4_K -> q5_0 -> f16 at width 172
    CHECK(m.at("blk.0.attn_q.weight") == GgmlType::Q5_0);
    CHECK(m.at("output.weight") == GgmlType::Q8_0);
    CHECK(p.fallback_notes.size() == 4);   // q4_K->q5_0 @64, q4_K->f16 @172, q6_K->q8_0 @64, q6_K->f16 @172
    const auto q4 = plan_types(plan_for(t, QuantFtype::q4_0, 2));
    CHECK(q4.at("blk.0.ffn_down.weight") == GgmlType::F16);
    CHECK(q4.at("blk.1.ffn_down.weight") == GgmlType::F16);
    CHECK(q4.at("blk.1.ffn_up.weight") == GgmlType::Q4_0);
    CHECK(plan_types(plan_for(t, QuantFtype::q8_0, 2)).at("blk.0.ffn_down.weight") == GgmlType::F16);
}

TEST_CASE("tied output: token_embd takes the output rule") {
    const auto t = llama_tensors(2, 256, 768, 128, 512, true);
    CHECK(plan_types(plan_for(t, QuantFtype::q4_0, 2)).at("token_embd.weight") == GgmlType::Q6_K);
    CHECK(plan_types(plan_for(t, QuantFtype::q8_0, 2)).at("token_embd.weight") == GgmlType::Q8_0);
    const auto untied = llama_tensors(2, 256, 768, 128, 512, false);
    CHECK(plan_types(plan_for(untied, QuantFtype::q4_0, 2)).at("token_embd.weight") == GgmlType::Q4_0);
}

TEST_CASE("gemma4's per-layer tensors: per_layer_token_embd is a token embedding, per_layer_model_proj kept") {
    for (const bool tied : {true, false}) {
        CAPTURE(tied);
        auto t = llama_tensors(2, 256, 768, 128, 512, tied);
        t.push_back(tensor("per_layer_token_embd.weight", 512, 512));
        t.push_back(tensor("per_layer_model_proj.weight", 256, 512));
        t.push_back(tensor("per_layer_proj_norm.weight", 256));
        t.push_back(tensor("blk.0.inp_gate.weight", 256, 256));
        const auto q4 = plan_types(plan_for(t, QuantFtype::q4_0, 2));
        CHECK(q4.at("per_layer_token_embd.weight") == (tied ? GgmlType::Q6_K : GgmlType::Q4_0));
        CHECK(q4.at("per_layer_model_proj.weight") == GgmlType::F32);
        CHECK(q4.at("blk.0.inp_gate.weight") == GgmlType::Q4_0);
    }
}

TEST_CASE("plain float ftypes, f8_e4m3, --pure and --tensor-type") {
    const auto t = llama_tensors(2, 256, 768, 128, 512, false);
    const auto f16 = plan_types(plan_for(t, QuantFtype::f16, 2));
    CHECK(f16.at("output.weight") == GgmlType::F16);
    CHECK(f16.at("blk.0.attn_norm.weight") == GgmlType::F32);

    const auto f8 = plan_types(plan_for(t, QuantFtype::f8_e4m3, 2));
    CHECK(f8.at("output.weight") == GgmlType::F16);
    CHECK(f8.at("token_embd.weight") == GgmlType::F16);
    CHECK(f8.at("blk.1.ffn_down.weight") == GgmlType::F8_E4M3);
    const auto odd = llama_tensors(1, 48, 96, 48, 64, true);
    CHECK(plan_types(plan_for(odd, QuantFtype::f8_e4m3, 1)).at("blk.0.attn_q.weight") == GgmlType::F16);
    CHECK(ftype_info(QuantFtype::f8_e4m3).file_type == 1000);

    PlanOptions o;
    o.ftype = QuantFtype::q4_k_m;
    o.pure = true;
    const auto pure = plan_types(make_quant_plan(t, ModelFacts{"llama", 2, 8, 8}, o));
    CHECK(pure.at("output.weight") == GgmlType::Q4_K);
    CHECK(pure.at("blk.1.attn_v.weight") == GgmlType::Q4_K);

    o.pure = false;
    o.overrides = {{"attn_v", GgmlType::Q8_0}, {"blk\\.1\\..*", GgmlType::Q5_K}, {"attn_q", GgmlType::F16}};
    const auto ov = plan_types(make_quant_plan(t, ModelFacts{"llama", 2, 8, 8}, o));
    CHECK(ov.at("blk.0.attn_v.weight") == GgmlType::Q8_0);
    CHECK(ov.at("blk.1.attn_v.weight") == GgmlType::Q8_0);   // first match wins
    CHECK(ov.at("blk.1.ffn_up.weight") == GgmlType::Q5_K);
    CHECK(ov.at("blk.0.attn_q.weight") == GgmlType::F16);
    CHECK(ov.at("blk.1.attn_norm.weight") == GgmlType::F32);   // never quantized
    o.overrides = {{"([", GgmlType::Q8_0}};
    CHECK_THROWS_AS(make_quant_plan(t, ModelFacts{"llama", 2, 8, 8}, o), UsageError);
}

TEST_CASE("mxfp4_moe: llama-quantize's MXFP4_MOE (experts MXFP4, the rest Q8_0); mxfp4: every FFN matrix") {
    auto t = llama_tensors(2, 256, 768, 128, 512, false);
    PlanInput experts = tensor("blk.1.ffn_up_exps.weight", 256, 768);
    experts.n_dims = 3;
    experts.ne[2] = 4;
    t.push_back(experts);
    PlanInput router = tensor("blk.1.ffn_gate_inp.weight", 256, 4);
    t.push_back(router);
    PlanInput odd = tensor("blk.1.ffn_down_exps.weight", 48, 256);
    odd.n_dims = 3;
    odd.ne[2] = 4;
    t.push_back(odd);
    PlanOptions o;
    o.ftype = QuantFtype::mxfp4_moe;
    const auto moe = plan_types(make_quant_plan(t, ModelFacts{"llama", 2, 8, 8, 4}, o));
    CHECK(moe.at("blk.1.ffn_up_exps.weight") == GgmlType::MXFP4);
    CHECK(moe.at("blk.1.ffn_down_exps.weight") == GgmlType::F16);   // width 48: no 32-block fits
    CHECK(moe.at("blk.1.ffn_up.weight") == GgmlType::Q8_0);
    CHECK(moe.at("blk.0.attn_v.weight") == GgmlType::Q8_0);
    CHECK(moe.at("output.weight") == GgmlType::Q8_0);
    CHECK(moe.at("token_embd.weight") == GgmlType::Q8_0);
    CHECK(moe.at("blk.1.ffn_gate_inp.weight") == GgmlType::F32);    // the router is never quantized
    CHECK(moe.at("blk.0.ffn_norm.weight") == GgmlType::F32);

    o.ftype = QuantFtype::mxfp4;
    const auto all_ffn = plan_types(make_quant_plan(t, ModelFacts{"llama", 2, 8, 8, 4}, o));
    CHECK(all_ffn.at("blk.1.ffn_up_exps.weight") == GgmlType::MXFP4);
    CHECK(all_ffn.at("blk.0.ffn_gate.weight") == GgmlType::MXFP4);
    CHECK(all_ffn.at("blk.1.ffn_down.weight") == GgmlType::MXFP4);
    CHECK(all_ffn.at("blk.0.attn_q.weight") == GgmlType::Q8_0);
    CHECK(all_ffn.at("output.weight") == GgmlType::Q8_0);
    CHECK(all_ffn.at("blk.1.ffn_gate_inp.weight") == GgmlType::F32);

    o.pure = true;
    CHECK(plan_types(make_quant_plan(t, ModelFacts{"llama", 2, 8, 8, 4}, o)).at("output.weight") == GgmlType::MXFP4);
    CHECK(ftype_info(QuantFtype::mxfp4_moe).file_type == 38);
    CHECK(ftype_from_file_type(38)->ftype == QuantFtype::mxfp4_moe);
    CHECK(ftype_from_name("MXFP4_MOE") == QuantFtype::mxfp4_moe);
}

TEST_CASE("ftype names and ids") {
    CHECK(ftype_from_name("Q4_K_M") == QuantFtype::q4_k_m);
    CHECK_FALSE(ftype_from_name("q4_k").has_value());
    CHECK(ftype_info(QuantFtype::q4_k_m).file_type == 15);
    CHECK(ftype_info(QuantFtype::q8_0).file_type == 7);
    CHECK(ftype_info(QuantFtype::bf16).file_type == 32);
    CHECK(ftype_info(QuantFtype::q3_k_s).file_type == 11);
    CHECK(ftype_from_file_type(17)->ftype == QuantFtype::q5_k_m);
}

TEST_CASE("the plan predicts every tensor type of the shared llama-quantize synth files") {
    if (!test::shared_available()) return;
    std::ifstream f(test::shared_path("models/synth/manifest.json"));
    REQUIRE(f);
    const auto manifest = nlohmann::json::parse(f);
    int checked = 0;
    for (const auto& [file, info] : manifest.items()) {
        const std::string stem = file.substr(0, file.size() - 5);
        const size_t dash = stem.rfind('-');
        const std::string model = stem.substr(0, dash), type = stem.substr(dash + 1);
        const std::optional<QuantFtype> ft = ftype_from_name(type);
        if (!ft || type == "f32") continue;
        const GgufFile src = GgufFile::open(test::shared_path("models/synth/" + model + "-f32.gguf").string());
        std::vector<PlanInput> in;
        for (const GgufTensor& t : src.tensors()) {
            PlanInput p;
            p.name = t.name;
            p.type = t.type;
            p.n_dims = t.n_dims;
            std::copy(t.ne, t.ne + 4, p.ne);
            in.push_back(p);
        }
        const std::string arch = src.get_string("general.architecture");
        PlanOptions o;
        o.ftype = *ft;
        const QuantPlan plan = make_quant_plan(in,
                                               ModelFacts{arch, src.get_int(arch + ".block_count"),
                                                          src.get_int(arch + ".attention.head_count"),
                                                          src.get_int(arch + ".attention.head_count_kv")},
                                               o);
        for (const PlannedTensor& t : plan.tensors) {
            CAPTURE(file);
            CAPTURE(t.name);
            std::string want = info["tensors"][t.name]["type"].get<std::string>();
            std::string got(type_name(t.to));
            std::transform(got.begin(), got.end(), got.begin(), ::toupper);
            CHECK(got == want);
        }
        ++checked;
    }
    CHECK(checked >= 20);
}
