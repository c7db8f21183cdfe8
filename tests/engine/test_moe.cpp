// Mixture of experts (qwen3moe, Mixtral) on the CPU: the router's top-k, the expert metadata's errors, the MoE FFN against
// a scalar reference (dequantized weights, double accumulation) on the tiny synthetic model, and batch invariance
// (a token's logits do not depend on the other tokens of its batch).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/cpu/backend_cpu.h"
#include "engine/model.h"
#include "engine/moe_router.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "quant/reference.h"
#include "tests/moe_layer_check.h"
#include "tests/gguf_rewrite.h"
#include "tests/synth_file.h"
#include "tests/test_support.h"

namespace tern {
namespace {

ModelConfig router_config(int32_t n_expert, int32_t n_used, bool norm, ExpertGating gating = ExpertGating::softmax) {
    ModelConfig c;
    c.n_expert = n_expert;
    c.n_expert_used = n_used;
    c.expert_weights_norm = norm;
    c.expert_gating = gating;
    return c;
}

struct Route {
    std::vector<int32_t> ids;
    std::vector<float> weights;
};

Route route(const std::vector<float>& logits, const ModelConfig& c) {
    Route r{std::vector<int32_t>(static_cast<size_t>(c.n_expert_used)),
            std::vector<float>(static_cast<size_t>(c.n_expert_used))};
    std::vector<float> probs(logits.size());
    route_experts(logits.data(), c, probs.data(), r.ids.data(), r.weights.data());
    return r;
}

std::vector<double> dequantized(const WeightRef& w) {
    std::vector<float> row(static_cast<size_t>(w.n_in()));
    std::vector<double> out;
    for (int64_t r = 0; r < w.n_out(); ++r) {
        dequantize_row(w.type, w.row(r), row.data(), w.n_in());
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

// y = W x in double over W's dequantized rows.
std::vector<double> matvec(const WeightRef& w, const std::vector<double>& x) {
    const std::vector<double> m = dequantized(w);
    std::vector<double> y(static_cast<size_t>(w.n_out()), 0.0);
    for (int64_t r = 0; r < w.n_out(); ++r)
        for (int64_t i = 0; i < w.n_in(); ++i) y[size_t(r)] += m[size_t(r * w.n_in() + i)] * x[size_t(i)];
    return y;
}

// x + the MoE FFN of layer lw over RMSNorm(x) * ffn_norm, all in double. Sets `near_tie` when the k-th and
// (k+1)-th router probabilities are too close for a float computation to be sure to choose the same experts.
std::vector<double> reference_layer_ffn(const ModelConfig& c, const LayerWeights& lw, const float* x, bool& near_tie) {
    const int64_t dim = c.dim;
    std::vector<float> gain(static_cast<size_t>(dim));
    dequantize_row(lw.ffn_norm.type, lw.ffn_norm.data, gain.data(), dim);
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += double(x[d]) * x[d];
    const double scale = 1.0 / std::sqrt(ss / double(dim) + double(c.rms_eps));
    std::vector<double> xn(static_cast<size_t>(dim));
    for (int64_t d = 0; d < dim; ++d) xn[size_t(d)] = x[d] * scale * gain[size_t(d)];

    const std::vector<double> logits = matvec(lw.ffn_gate_inp, xn);
    const double mx = *std::max_element(logits.begin(), logits.end());
    std::vector<double> p(logits.size());
    double sum = 0;
    for (size_t e = 0; e < p.size(); ++e) sum += p[e] = std::exp(logits[e] - mx);
    for (double& v : p) v /= sum;
    std::vector<int32_t> order(p.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[size_t(a)] > p[size_t(b)]; });
    const int32_t k = c.n_expert_used;
    near_tie = k < c.n_expert && p[size_t(order[size_t(k - 1)])] - p[size_t(order[size_t(k)])] < 1e-3;
    double wsum = 0;
    for (int32_t r = 0; r < k; ++r) wsum += p[size_t(order[size_t(r)])];

    std::vector<double> out(x, x + dim);
    for (int32_t r = 0; r < k; ++r) {
        const int32_t e = order[size_t(r)];
        const double w = p[size_t(e)] / wsum;
        const std::vector<double> g = matvec(lw.gate_exps.matrix(e), xn), u = matvec(lw.up_exps.matrix(e), xn);
        std::vector<double> a(g.size());
        for (size_t i = 0; i < g.size(); ++i) a[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
        const std::vector<double> y = matvec(lw.down_exps.matrix(e), a);
        for (int64_t d = 0; d < dim; ++d) out[size_t(d)] += w * y[size_t(d)];
    }
    return out;
}

} // namespace

TEST_CASE("router: softmax top-k, ties to the lower expert id, normalised weights") {
    {
        const Route r = route({0.0f, 3.0f, 1.0f, 3.0f, -2.0f, 2.0f}, router_config(6, 3, true));
        CHECK(r.ids == std::vector<int32_t>{1, 3, 5});
        CHECK(r.weights[0] == r.weights[1]);
        CHECK(r.weights[0] + r.weights[1] + r.weights[2] == doctest::Approx(1.0f));
        CHECK(r.weights[2] / r.weights[0] == doctest::Approx(std::exp(-1.0f)));
    }
    {   // all equal: the first k ids; without normalisation each weight is 1/n
        const Route r = route(std::vector<float>(8, 0.5f), router_config(8, 2, false));
        CHECK(r.ids == std::vector<int32_t>{0, 1});
        CHECK(r.weights[0] == doctest::Approx(0.125f));
    }
    {   // k == n_expert: every expert, most probable first
        const Route r = route({1.0f, 4.0f, 2.0f, 3.0f}, router_config(4, 4, true));
        CHECK(r.ids == std::vector<int32_t>{1, 3, 2, 0});
        CHECK(r.weights[0] + r.weights[1] + r.weights[2] + r.weights[3] == doctest::Approx(1.0f));
    }
    {   // k == 1 normalised: weight 1
        const Route r = route({-1.0f, 0.25f, 0.5f}, router_config(3, 1, true));
        CHECK(r.ids == std::vector<int32_t>{2});
        CHECK(r.weights[0] == 1.0f);
    }
    {   // a NaN logit is never chosen over numbers; -inf is chosen last
        const Route r = route({-INFINITY, NAN, 1.0f, 0.0f}, router_config(4, 3, false, ExpertGating::sigmoid));
        CHECK(r.ids == std::vector<int32_t>{2, 3, 0});
        CHECK(r.weights[0] == doctest::Approx(1.0f / (1.0f + std::exp(-1.0f))));
        CHECK(r.weights[1] == doctest::Approx(0.5f));
        CHECK(r.weights[2] == 0.0f);
    }
    {   // a huge logit: softmax saturates without overflow
        const Route r = route({1e30f, 0.0f, -1e30f}, router_config(3, 2, true));
        CHECK(r.ids == std::vector<int32_t>{0, 1});
        CHECK(r.weights[0] == 1.0f);
        CHECK(r.weights[1] == 0.0f);
    }
}

TEST_CASE("qwen3moe metadata: read, and one-line errors naming the file and key") {
    test::TempDir dir;
    const std::string good = synth_file(dir, "tiny-qwen3moe", "f16");
    const Model m = load_model(good);
    CHECK(m.config.arch == Arch::qwen3moe);
    CHECK(m.config.qk_norm);
    CHECK(m.config.rope_style == RopeStyle::neox);
    CHECK(m.config.n_expert == 8);
    CHECK(m.config.n_expert_used == 2);
    CHECK(m.config.expert_ffn_dim == 256);
    CHECK(m.config.expert_weights_norm);
    CHECK(m.config.expert_gating == ExpertGating::softmax);
    CHECK(m.config.layers[1].ffn_dim == 256);
    CHECK(m.weights.layers[1].gate_exps.n_mats == 8);
    CHECK(!m.weights.layers[1].w_gate.present());
    // Expert e's matrix is its contiguous slice of the stacked tensor.
    const WeightRef& up = m.weights.layers[0].up_exps;
    CHECK(up.matrix(3).data == up.data + 3 * 256 * up.row_size());

    auto edited = [&](const std::string& name, const std::function<void(GgufWriter&)>& edit) {
        const std::string msg = test::load_error(test::rewrite_zeroing(dir, good, name, edit));
        CHECK(msg.find(name) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);
        return msg;
    };
    CHECK(edited("no-count.gguf", [](GgufWriter& w) { w.remove("qwen3moe.expert_count"); })
              .find("qwen3moe.expert_count") != std::string::npos);
    CHECK(edited("zero-used.gguf", [](GgufWriter& w) { w.set("qwen3moe.expert_used_count", GgufValue::make_u32(0)); })
              .find("metadata qwen3moe.expert_used_count: value 0 is out of range (expected 1..8)") != std::string::npos);
    CHECK(edited("many-used.gguf", [](GgufWriter& w) { w.set("qwen3moe.expert_used_count", GgufValue::make_u32(9)); })
              .find("value 9 is out of range (expected 1..8)") != std::string::npos);
    CHECK(edited("huge.gguf", [](GgufWriter& w) { w.set("qwen3moe.expert_count", GgufValue::make_u32(5000)); })
              .find("metadata qwen3moe.expert_count: value 5000 is out of range (expected 1..1024)") != std::string::npos);
    CHECK(edited("shared.gguf", [](GgufWriter& w) { w.set("qwen3moe.expert_shared_count", GgufValue::make_u32(1)); })
              .find("qwen3moe.expert_shared_count") != std::string::npos);
    // Fewer experts in the metadata than in the tensors: the shape check names the tensor and the dimension.
    CHECK(edited("seven.gguf", [](GgufWriter& w) { w.set("qwen3moe.expert_count", GgufValue::make_u32(7)); })
              .find("tensor blk.0.ffn_gate_inp.weight has shape") != std::string::npos);
    CHECK(edited("width.gguf",
                 [](GgufWriter& w) { w.set("qwen3moe.expert_feed_forward_length", GgufValue::make_u32(128)); })
              .find("ffn_gate_exps.weight has shape [256, 256, 8] but expected [256, 128, 8]") != std::string::npos);
    // Without the expert width: llama.cpp's fallback, feed_forward_length / expert_used_count (768 / 2 = 384).
    CHECK(edited("derived.gguf", [](GgufWriter& w) { w.remove("qwen3moe.expert_feed_forward_length"); })
              .find("but expected [256, 384, 8]") != std::string::npos);
    // The routing keys llama.cpp defines: a gating function outside the format's values, or another than the
    // architecture's, and a weight scale other than 1 (qwen3moe has none) are refused rather than ignored.
    const auto gating = [&](const std::string& name, uint32_t v) {
        return edited(name, [v](GgufWriter& w) { w.set("qwen3moe.expert_gating_func", GgufValue::make_u32(v)); });
    };
    CHECK(gating("gating99.gguf", 99)
              .ends_with(": metadata qwen3moe.expert_gating_func: value 99 is not a gating function (the format "
                         "defines 0 none, 1 "
                         "softmax, 2 sigmoid, 3 softmax_weight; qwen3moe routes by 1 softmax)"));
    CHECK(gating("gating2.gguf", 2)
              .ends_with(": metadata qwen3moe.expert_gating_func: value 2 (sigmoid) is not supported: qwen3moe routes "
                         "its experts by 1 "
                         "softmax"));
    CHECK(gating("gating3.gguf", 3).find("value 3 (softmax_weight) is not supported") != std::string::npos);
    CHECK(test::load_error(test::rewrite_zeroing(dir, good, "gating1.gguf", [](GgufWriter& w) {
              w.set("qwen3moe.expert_gating_func", GgufValue::make_u32(1));
          })).empty());
    CHECK(test::load_error(test::rewrite_zeroing(dir, good, "gating0.gguf", [](GgufWriter& w) {
              w.set("qwen3moe.expert_gating_func", GgufValue::make_u32(0));
          })).empty());
    CHECK(edited("scale-nan.gguf",
                 [](GgufWriter& w) { w.set("qwen3moe.expert_weights_scale", GgufValue::make_f32(NAN)); })
              .ends_with(": metadata qwen3moe.expert_weights_scale: value nan is out of range (expected a finite "
                         "number > 0: it multiplies the chosen experts' weights)"));
    CHECK(
        edited("scale2.gguf", [](GgufWriter& w) { w.set("qwen3moe.expert_weights_scale", GgufValue::make_f32(2.5f)); })
            .ends_with(": metadata qwen3moe.expert_weights_scale: value 2.5 is not supported: qwen3moe weights its "
                       "experts without a scale (1)"));
    // A NaN in a router row (every token's routing would be NaN): refused at load.
    CHECK(
        test::load_error(test::rewrite_with_value(dir, good, "router-nan.gguf", "blk.1.ffn_gate_inp.weight", 700, NAN))
            .ends_with("router-nan.gguf: tensor blk.1.ffn_gate_inp.weight: element 700 is nan (a norm, bias, sink, "
                       "router or rope factor must hold finite values: a damaged or wrongly converted file)"));
}

TEST_CASE("mixtral: a llama with experts is routed like qwen3moe, its experts sized by feed_forward_length") {
    test::TempDir dir;
    const std::string good = synth_file(dir, "tiny-mixtral", "f16");
    const Model m = load_model(good);
    CHECK(m.config.arch == Arch::llama);
    CHECK(m.config.rope_style == RopeStyle::normal);
    CHECK(!m.config.qk_norm);
    CHECK(m.config.n_expert == 8);
    CHECK(m.config.n_expert_used == 2);
    CHECK(m.config.expert_ffn_dim == 256);
    CHECK(m.config.expert_weights_norm);
    CHECK(m.config.expert_gating == ExpertGating::softmax);
    CHECK(m.config.expert_weights_scale == 1.0f);
    CHECK(!m.config.tied_output);
    CHECK(m.weights.layers[0].down_exps.n_mats == 8);
    CHECK(!m.weights.layers[0].w_up.present());

    auto edited = [&](const std::string& name, const std::function<void(GgufWriter&)>& edit) {
        const std::string msg = test::load_error(test::rewrite_zeroing(dir, good, name, edit));
        CHECK(msg.find(name) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);
        return msg;
    };
    // llama.cpp reads no expert width key for llama: a different one changes nothing.
    const std::string other_width = test::rewrite_zeroing(dir, good, "other-width.gguf", [](GgufWriter& w) {
        w.set("llama.expert_feed_forward_length", GgufValue::make_u32(128));
    });
    CHECK(load_model(other_width).config.expert_ffn_dim == 256);
    CHECK(edited("width.gguf", [](GgufWriter& w) { w.set("llama.feed_forward_length", GgufValue::make_u32(512)); })
              .find("ffn_gate_exps.weight has shape [256, 256, 8] but expected [256, 512, 8]") != std::string::npos);
    CHECK(edited("no-used.gguf", [](GgufWriter& w) { w.remove("llama.expert_used_count"); })
              .find("llama.expert_used_count") != std::string::npos);
    CHECK(edited("many-used.gguf", [](GgufWriter& w) { w.set("llama.expert_used_count", GgufValue::make_u32(9)); })
              .find("metadata llama.expert_used_count: value 9 is out of range (expected 1..8)") != std::string::npos);
    CHECK(edited("shared.gguf", [](GgufWriter& w) { w.set("llama.expert_shared_count", GgufValue::make_u32(1)); })
              .find("metadata llama.expert_shared_count: value 1: shared experts are not supported yet") !=
          std::string::npos);
    CHECK(edited("per-layer.gguf",
                 [](GgufWriter& w) {
                     w.set("llama.feed_forward_length", GgufValue::make_i32_array({256, 512}));
                 })
              .find("metadata llama.feed_forward_length: differs between layers (256 and 512)") != std::string::npos);
    // expert_count 0: a dense llama, which then needs the dense tensors.
    CHECK(edited("dense.gguf", [](GgufWriter& w) { w.set("llama.expert_count", GgufValue::make_u32(0)); })
              .find("tensor blk.0.ffn_gate.weight is missing") != std::string::npos);
}

// One layer of the model with its attention output zeroed (so the layer adds only its FFN), run as a slice from
// a given residual stream, against the scalar reference.
TEST_CASE("the MoE FFN agrees with a scalar reference (dequantized weights, double accumulation)") {
    test::TempDir dir;
    for (const std::string shape : {"tiny-qwen3moe", "tiny-mixtral"})
    for (const char* type : {"f16", "q8_0", "q4_k_m"}) {
        CAPTURE(shape);
        CAPTURE(type);
        const std::string path =
            test::rewrite_zeroing(dir, synth_file(dir, shape, type), shape + "-zero-attn-" + type + ".gguf",
                                  [](GgufWriter&) {},
                                  [](const std::string& n) { return n.find("attn_output") != std::string::npos; });
        test::check_moe_layers(load_model(path), 7, reference_layer_ffn);
    }
}

TEST_CASE("batch invariance: a token's logits do not depend on the rest of its batch") {
    test::TempDir dir;
    for (const std::string shape : {"tiny-qwen3moe", "tiny-mixtral"})
    for (const char* type : {"q4_k_m", "f16"}) {
        CAPTURE(shape);
        CAPTURE(type);
        const Model m = load_model(synth_file(dir, shape, type));
        const int32_t vocab = m.config.vocab;
        const std::vector<int32_t> a = {5, 77, 301, 42, 9, 120}, other = {11, 12, 400, 401, 250, 3, 99, 8, 17};
        for (const int threads : {1, 2}) {
            CAPTURE(threads);
            CpuOptions o;
            o.n_threads = threads;
            CpuBackend b(o);
            b.load(m.config, m.weights, RunOptions{64, KvType::f16, 4 * 256});
            // Alone, every row kept.
            ForwardBatch alone;
            alone.tokens = a;
            alone.wanted = LogitsWanted::all;
            b.forward(alone);
            std::vector<float> ref;
            for (size_t i = 0; i < a.size(); ++i) {
                const auto row = b.logits(int(i));
                ref.insert(ref.end(), row.begin(), row.end());
            }
            // The same tokens as sequence 1 of a batch, after another sequence's tokens.
            b.seq_create(1);
            b.seq_create(2);
            std::vector<int32_t> both = other;
            both.insert(both.end(), a.begin(), a.end());
            const std::vector<SequenceSpan> spans = {{2, int32_t(other.size()), LogitsWanted::last},
                                                     {1, int32_t(a.size()), LogitsWanted::all}};
            ForwardBatch mixed;
            mixed.tokens = both;
            mixed.spans = spans;
            b.forward(mixed);
            for (size_t i = 0; i < a.size(); ++i) {
                CAPTURE(i);
                const auto row = b.logits(int(1 + i));
                CHECK(std::equal(row.begin(), row.end(), ref.begin() + std::ptrdiff_t(i) * vocab));
            }
            // Decode: sequence 3 fed one token at a time gives the same rows as the prefill.
            b.seq_create(3);
            for (size_t i = 0; i < a.size(); ++i) {
                CAPTURE(i);
                const SequenceSpan one{3, 1, LogitsWanted::last};
                ForwardBatch step;
                step.tokens = std::span(a).subspan(i, 1);
                step.spans = std::span(&one, 1);
                b.forward(step);
                const auto row = b.logits(0);
                CHECK(std::equal(row.begin(), row.end(), ref.begin() + std::ptrdiff_t(i) * vocab));
            }
        }
    }
}

} // namespace tern

#include "quant/plan.h"

namespace tern {

TEST_CASE("quantization plan of an 8-expert model: llama-quantize's expert rules") {
    std::vector<PlanInput> t;
    auto add = [&](const std::string& name, int64_t ne0, int64_t ne1, int64_t ne2 = 1) {
        PlanInput p;
        p.name = name;
        p.n_dims = ne2 > 1 ? 3 : 2;
        p.ne[0] = ne0;
        p.ne[1] = ne1;
        p.ne[2] = ne2;
        t.push_back(p);
    };
    add("token_embd.weight", 256, 512);
    add("output.weight", 256, 512);
    for (int l = 0; l < 8; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        for (const char* n : {"attn_q", "attn_k", "attn_v", "attn_output"}) add(p + n + ".weight", 256, 256);
        add(p + "ffn_gate_inp.weight", 256, 8);
        add(p + "ffn_gate_exps.weight", 256, 256, 8);
        add(p + "ffn_up_exps.weight", 256, 256, 8);
        add(p + "ffn_down_exps.weight", 256, 256, 8);
    }
    PlanOptions o;
    o.ftype = QuantFtype::q4_k_m;
    const QuantPlan plan = make_quant_plan(t, ModelFacts{"qwen3moe", 8, 4, 2, 8}, o);
    for (const PlannedTensor& p : plan.tensors) {
        CAPTURE(p.name);
        const std::string& n = p.name;
        if (n.find("ffn_gate_inp") != std::string::npos) CHECK(p.to == GgmlType::F32);   // the router stays f32
        else if (n.find("attn_k.") != std::string::npos || n.find("attn_v.") != std::string::npos) CHECK(p.to == GgmlType::Q8_0);
        else if (n.find("attn_output") != std::string::npos) CHECK(p.to == GgmlType::Q5_K);
        else if (n.find("ffn_down_exps") != std::string::npos) {
            const int layer = n[4] - '0';   // more_bits(layer, 8): 0, 3, 6, 7
            CHECK(p.to == (more_bits(layer, 8) ? GgmlType::Q6_K : GgmlType::Q4_K));
        } else if (n.find("_exps") != std::string::npos || n.find("attn_q") != std::string::npos) CHECK(p.to == GgmlType::Q4_K);
    }
}

} // namespace tern

namespace tern {
namespace {

TEST_CASE("a selection bias ranks experts by probability + bias; the weights stay the unbiased probabilities") {
    ModelConfig c = router_config(4, 2, true, ExpertGating::sigmoid);
    c.expert_weights_scale = 2.5f;
    // sigmoid: 0.5, 0.731, 0.269, 0.881. Unbiased, experts 3 and 1 win; the bias lifts expert 2 above both.
    const std::vector<float> logits = {0.0f, 1.0f, -1.0f, 2.0f};
    const std::vector<float> bias = {0.0f, 0.0f, 0.7f, 0.0f};
    std::vector<float> probs(8), weights(2);
    std::vector<int32_t> ids(2);
    route_experts(logits.data(), c, probs.data(), ids.data(), weights.data(), bias.data());
    CHECK(ids == std::vector<int32_t>{2, 3});   // 0.969 and 0.881
    const float p2 = 1.0f / (1.0f + std::exp(1.0f)), p3 = 1.0f / (1.0f + std::exp(-2.0f));
    CHECK(weights[0] == doctest::Approx(2.5f * p2 / (p2 + p3)));
    CHECK(weights[1] == doctest::Approx(2.5f * p3 / (p2 + p3)));
    route_experts(logits.data(), c, probs.data(), ids.data(), weights.data());
    CHECK(ids == std::vector<int32_t>{3, 1});
}

TEST_CASE("glm4moe: leading dense layers, shared experts, biased sigmoid routing, next-token-prediction layers") {
    test::TempDir dir;
    const std::string good = synth_file(dir, "tiny-glm4moe", "f16");
    const Model m = load_model(good);
    const ModelConfig& c = m.config;
    CHECK(c.arch == Arch::glm4moe);
    CHECK(c.rope_style == RopeStyle::neox);
    CHECK(c.qkv_bias);
    CHECK_FALSE(c.qk_norm);
    CHECK(c.ffn_norm_post_attention);
    CHECK(c.n_rot == 32);
    CHECK(c.n_expert == 8);
    CHECK(c.n_expert_used == 2);
    CHECK(c.expert_gating == ExpertGating::sigmoid);
    CHECK(c.expert_weights_norm);
    CHECK(c.expert_weights_scale == 2.5f);
    CHECK(c.expert_probs_bias);
    CHECK(c.n_expert_shared == 1);
    CHECK(c.expert_shared_ffn_dim == 256);
    CHECK(c.n_dense_lead == 1);
    // block_count 4: three decoder layers and the next-token-prediction one.
    REQUIRE(c.n_layers == 3);
    REQUIRE(c.nextn_layers.size() == 1);
    CHECK_FALSE(c.layers[0].moe);
    CHECK(c.layers[0].ffn_dim == 768);
    CHECK(c.layers[1].moe);
    CHECK(c.layers[1].ffn_dim == 256);
    CHECK(c.nextn_layers[0].nextn);
    REQUIRE(m.weights.layers.size() == 3);
    CHECK(m.weights.layers[0].w_gate.present());
    CHECK_FALSE(m.weights.layers[0].ffn_gate_inp.present());
    CHECK(m.weights.layers[2].gate_exps.n_mats == 8);
    CHECK(m.weights.layers[2].exp_probs_b.present());
    CHECK(m.weights.layers[2].down_shexp.n_in() == 256);
    CHECK(m.weights.layers[2].ffn_norm.name == "blk.2.post_attention_norm.weight");
    REQUIRE(m.weights.nextn_layers.size() == 1);
    CHECK(m.weights.nextn_layers[0].nextn_eh_proj.n_in() == 512);
    CHECK(m.weights.nextn_layers[0].gate_exps.present());

    // The next-token-prediction layer is checked as the decoder's are: a NaN in its norm is refused at load.
    CHECK(test::load_error(test::rewrite_with_value(dir, good, "nextn-nan.gguf", "blk.3.nextn.enorm.weight", 5, NAN))
              .find("tensor blk.3.nextn.enorm.weight: element 5 is nan") != std::string::npos);
    // expert_weights_scale 0 is llama.cpp's "none"; a negative one is refused.
    auto edited = [&](const std::string& name, const std::function<void(GgufWriter&)>& edit) {
        return test::rewrite_zeroing(dir, good, name, edit);
    };
    CHECK(load_model(edited("scale0.gguf", [](GgufWriter& w) {
              w.set("glm4moe.expert_weights_scale", GgufValue::make_f32(0.0f));
          })).config.expert_weights_scale == 1.0f);
    CHECK(test::load_error(edited("scale-neg.gguf", [](GgufWriter& w) {
              w.set("glm4moe.expert_weights_scale", GgufValue::make_f32(-1.0f));
          })).find("glm4moe.expert_weights_scale: value -1 is out of range") != std::string::npos);
    // The counts must leave a decoder: a next-token-prediction layer count of block_count, more leading dense
    // layers than the decoder has, are refused in one line naming the key.
    CHECK(test::load_error(edited("nextn4.gguf", [](GgufWriter& w) {
              w.set("glm4moe.nextn_predict_layers", GgufValue::make_u32(4));
          })).find("glm4moe.nextn_predict_layers: value 4 is out of range (expected 0..3)") != std::string::npos);
    CHECK(test::load_error(edited("dense4.gguf", [](GgufWriter& w) {
              w.set("glm4moe.leading_dense_block_count", GgufValue::make_u32(4));
          })).find("glm4moe.leading_dense_block_count: value 4 is out of range (expected 0..3)") != std::string::npos);
    // The file without its next-token-prediction layer's tensors (a split conversion's decoder part) loads.
    const std::string trunk = test::rewrite_zeroing(
        dir, good, "trunk.gguf", [](GgufWriter&) {}, {},
        [](const std::string& name) { return name.rfind("blk.3.", 0) == 0; });
    CHECK(load_model(trunk).weights.nextn_layers.empty());
    // The CPU runs it: finite logits on a short prompt.
    CpuBackend cpu;
    cpu.load(m.config, m.weights, RunOptions{64, KvType::f32});
    const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
    cpu.forward({tokens, 0, LogitsWanted::last});
    for (const float v : cpu.logits(0)) REQUIRE(std::isfinite(v));
}

} // namespace
} // namespace tern
