// gpt-oss on the CPU: its router (top k by logit, then a softmax over those k), its clamped SwiGLU, its metadata
// and tensors (sinks, biases, windows on the even layers) with their one-line errors, and its MoE FFN (router and
// expert biases) against a scalar reference on the tiny synthetic model. The attention sinks' kernels are checked in
// test_kernels_attention.cpp; the whole model against llama.cpp in tests/families_reference.py.
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
#include "engine/tools/synth_shapes.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "kernels/cpu/ops.h"
#include "quant/plan.h"
#include "quant/reference.h"
#include "tests/kernel_test_data.h"
#include "tests/moe_layer_check.h"
#include "tests/gguf_rewrite.h"
#include "tests/synth_file.h"
#include "tests/test_support.h"

namespace tern {
namespace {

std::vector<double> dequantized_rows(const WeightRef& w) {
    std::vector<float> row(static_cast<size_t>(w.n_in()));
    std::vector<double> out;
    for (int64_t r = 0; r < w.n_out(); ++r) {
        dequantize_row(w.type, w.row(r), row.data(), w.n_in());
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

// y = W x (+ row `bias_row` of `bias` when present) in double.
std::vector<double> matvec(const WeightRef& w, const std::vector<double>& x, const WeightRef& bias = {},
                           int64_t bias_row = 0) {
    const std::vector<double> m = dequantized_rows(w);
    std::vector<double> y(static_cast<size_t>(w.n_out()), 0.0);
    for (int64_t r = 0; r < w.n_out(); ++r)
        for (int64_t i = 0; i < w.n_in(); ++i) y[size_t(r)] += m[size_t(r * w.n_in() + i)] * x[size_t(i)];
    if (bias.present()) {
        std::vector<float> b(static_cast<size_t>(bias.n_in()));
        dequantize_row(bias.type, bias.row(bias_row), b.data(), bias.n_in());
        for (size_t r = 0; r < y.size(); ++r) y[r] += b[r];
    }
    return y;
}

double swiglu_oai_reference(double g, double u) {
    g = std::min(g, 7.0);
    u = std::clamp(u, -7.0, 7.0);
    return g / (1.0 + std::exp(-1.702 * g)) * (u + 1.0);
}

// x + gpt-oss's MoE FFN over RMSNorm(x) * post_attention_norm, in double: biased router logits, the top k by logit,
// a softmax over those k, each expert's biased gate/up, the clamped SwiGLU, its biased down. Sets `near_tie` when
// the k-th and (k+1)-th logits are too close for a float computation to be sure to choose the same experts.
std::vector<double> reference_layer_ffn(const ModelConfig& c, const LayerWeights& lw, const float* x, bool& near_tie) {
    const int64_t dim = c.dim;
    std::vector<float> gain(static_cast<size_t>(dim));
    dequantize_row(lw.ffn_norm.type, lw.ffn_norm.data, gain.data(), dim);
    double ss = 0;
    for (int64_t d = 0; d < dim; ++d) ss += double(x[d]) * x[d];
    const double scale = 1.0 / std::sqrt(ss / double(dim) + double(c.rms_eps));
    std::vector<double> xn(static_cast<size_t>(dim));
    for (int64_t d = 0; d < dim; ++d) xn[size_t(d)] = x[d] * scale * gain[size_t(d)];

    const std::vector<double> logits = matvec(lw.ffn_gate_inp, xn, lw.ffn_gate_inp_b);
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
    const int32_t k = c.n_expert_used;
    near_tie = k < c.n_expert && logits[size_t(order[size_t(k - 1)])] - logits[size_t(order[size_t(k)])] < 1e-3;
    double wsum = 0;
    const double top = logits[size_t(order[0])];
    for (int32_t r = 0; r < k; ++r) wsum += std::exp(logits[size_t(order[size_t(r)])] - top);

    std::vector<double> out(x, x + dim);
    for (int32_t r = 0; r < k; ++r) {
        const int32_t e = order[size_t(r)];
        const double w = std::exp(logits[size_t(e)] - top) / wsum;
        const std::vector<double> g = matvec(lw.gate_exps.matrix(e), xn, lw.gate_exps_b, e);
        const std::vector<double> u = matvec(lw.up_exps.matrix(e), xn, lw.up_exps_b, e);
        std::vector<double> a(g.size());
        for (size_t i = 0; i < g.size(); ++i) a[i] = swiglu_oai_reference(g[i], u[i]);
        const std::vector<double> y = matvec(lw.down_exps.matrix(e), a, lw.down_exps_b, e);
        for (int64_t d = 0; d < dim; ++d) out[size_t(d)] += w * y[size_t(d)];
    }
    return out;
}

} // namespace

TEST_CASE("router softmax_weight: the top k by logit, then a softmax over those k only") {
    ModelConfig c;
    c.n_expert = 6;
    c.n_expert_used = 3;
    c.expert_gating = ExpertGating::softmax_weight;
    const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 2.0f, 3.0f, 1.0f};
    std::vector<float> probs(6), weights(3);
    std::vector<int32_t> ids(3);
    route_experts(logits.data(), c, probs.data(), ids.data(), weights.data());
    CHECK(ids == std::vector<int32_t>{1, 4, 3});   // the tie 3.0 / 3.0 to the lower id
    const double z = 2.0 + std::exp(-1.0);
    CHECK(weights[0] == doctest::Approx(1.0 / z).epsilon(1e-6));
    CHECK(weights[1] == doctest::Approx(1.0 / z).epsilon(1e-6));
    CHECK(weights[2] == doctest::Approx(std::exp(-1.0) / z).epsilon(1e-6));
    // Not the softmax over all experts' (which would give expert 1 e^3 / sum over 6, about 0.38).
    CHECK(weights[0] > 0.4f);
    // Large logits do not overflow: the softmax subtracts the largest chosen one.
    const std::vector<float> big = {1000.0f, 999.0f, -5.0f, 0.0f, 998.0f, 1.0f};
    route_experts(big.data(), c, probs.data(), ids.data(), weights.data());
    CHECK(ids == std::vector<int32_t>{0, 1, 4});
    CHECK(std::isfinite(weights[0]));
    CHECK(weights[0] + weights[1] + weights[2] == doctest::Approx(1.0f));
}

TEST_CASE("swiglu_oai: gate clamped above at the limit, up clamped both ways, sigmoid(alpha g) * (u + 1)") {
    const std::vector<float> gate = {-10.0f, -1.0f, 0.0f, 0.5f, 3.0f, 6.9f, 7.0f, 8.0f, 100.0f, 2.0f, -3.0f};
    const std::vector<float> up = {0.0f, 2.0f, 5.0f, -0.5f, 9.0f, -9.0f, 1.0f, 1.0f, -1.0f, -7.5f, 7.5f};
    std::vector<float> y(gate.size());
    swiglu_oai_f32(gate.data(), up.data(), y.data(), int64_t(gate.size()), 1.702f, 7.0f);
    for (size_t i = 0; i < gate.size(); ++i) {
        CAPTURE(i);
        CHECK(y[i] == doctest::Approx(swiglu_oai_reference(gate[i], up[i])).epsilon(1e-6));
    }
    // The clamps: a gate above 7 acts as 7; an up beyond +-7 acts as +-7 (so -8 gives (1 - 7) = -6 times the gate).
    CHECK(y[7] == y[6]);
    CHECK(y[8] == 0.0f);   // up = -1 zeroes it, however large the gate
    CHECK(y[4] == doctest::Approx(3.0 / (1.0 + std::exp(-1.702 * 3.0)) * 8.0).epsilon(1e-6));
    // Many elements over threads: the same bits as one thread.
    const auto g = test::random_normal(5000, 3, 5.0f), u = test::random_normal(5000, 4, 5.0f);
    std::vector<float> one(5000), two(5000);
    swiglu_oai_f32(g.data(), u.data(), one.data(), 5000, 1.702f, 7.0f, 1);
    swiglu_oai_f32(g.data(), u.data(), two.data(), 5000, 1.702f, 7.0f, 2);
    CHECK(one == two);
}

TEST_CASE("gpt-oss metadata and tensors: read, and one-line errors naming the file and key or tensor") {
    test::TempDir dir;
    const std::string good = synth_file(dir, "tiny-gpt-oss", "f16");
    const Model m = load_model(good);
    const ModelConfig& c = m.config;
    CHECK(c.arch == Arch::gpt_oss);
    CHECK(c.rope_style == RopeStyle::neox);
    CHECK(c.ffn_act == FfnActivation::swiglu_oai);
    CHECK(c.expert_gating == ExpertGating::softmax_weight);
    CHECK_FALSE(c.expert_weights_norm);
    CHECK(c.attn_sinks);
    CHECK(c.expert_bias);
    CHECK(c.ffn_norm_post_attention);
    CHECK_FALSE(c.post_norms);
    CHECK(c.n_expert == 8);
    CHECK(c.n_expert_used == 4);
    CHECK(c.attn_scale == doctest::Approx(0.125f));
    REQUIRE(c.n_layers == 4);
    for (int32_t l = 0; l < 4; ++l) {
        const LayerConfig& lc = c.layers[size_t(l)];
        CHECK(lc.sliding_window == (l % 2 == 0 ? 16 : 0));
        // YaRN, factor 32 over 64 tokens, on every layer (the windowed ones too, as llama.cpp does).
        CHECK(lc.rope_freq_scale == doctest::Approx(1.0f / 32.0f));
        CHECK(lc.yarn_ext_factor == 1.0f);
        CHECK(lc.rope_mscale == doctest::Approx(1.0f + 0.1f * std::log(32.0f)));
    }
    CHECK(c.rope_n_ctx_orig == 64);
    const LayerWeights& lw = m.weights.layers[1];
    CHECK(lw.attn_sinks.present());
    CHECK(lw.attn_sinks.n_in() == 4);
    CHECK(lw.ffn_norm.name == "blk.1.post_attention_norm.weight");
    CHECK(lw.bq.present());
    CHECK(lw.bo.present());
    CHECK(lw.ffn_gate_inp_b.n_in() == 8);
    CHECK(lw.gate_exps_b.n_in() == 256);
    CHECK(lw.gate_exps_b.n_out() == 8);
    CHECK(lw.down_exps_b.n_in() == 256);

    auto edited = [&](const std::string& name, const std::function<void(GgufWriter&)>& edit,
                      const std::function<bool(const std::string&)>& drop = {}) {
        const std::string msg = test::load_error(test::rewrite_zeroing(dir, good, name, edit, {}, drop));
        CHECK(msg.find(name) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);
        return msg;
    };
    const auto keep = [](GgufWriter&) {};
    CHECK(edited("no-window.gguf", [](GgufWriter& w) { w.remove("gpt-oss.attention.sliding_window"); })
              .find("gpt-oss.attention.sliding_window") != std::string::npos);
    CHECK(edited("pattern.gguf",
                 [](GgufWriter& w) { w.set("gpt-oss.attention.sliding_window_pattern", GgufValue::make_u32(3)); })
              .find("metadata gpt-oss.attention.sliding_window_pattern: only the pattern 2") != std::string::npos);
    CHECK(edited("swa-base.gguf",
                 [](GgufWriter& w) { w.set("gpt-oss.rope.freq_base_swa", GgufValue::make_f32(10000.0f)); })
              .find("gpt-oss.rope.freq_base_swa") != std::string::npos);
    CHECK(edited("no-sinks.gguf", keep, [](const std::string& n) { return n == "blk.2.attn_sinks.weight"; })
              .find("tensor blk.2.attn_sinks.weight is missing") != std::string::npos);
    CHECK(edited("no-router-bias.gguf", keep, [](const std::string& n) { return n == "blk.0.ffn_gate_inp.bias"; })
              .find("tensor blk.0.ffn_gate_inp.bias is missing") != std::string::npos);
    CHECK(edited("no-down-bias.gguf", keep, [](const std::string& n) { return n == "blk.3.ffn_down_exps.bias"; })
              .find("tensor blk.3.ffn_down_exps.bias is missing (expected shape [256, 8]") != std::string::npos);
    CHECK(edited("no-post-norm.gguf", keep,
                 [](const std::string& n) { return n == "blk.1.post_attention_norm.weight"; })
              .find("tensor blk.1.post_attention_norm.weight is missing") != std::string::npos);
    CHECK(edited("gating.gguf", [](GgufWriter& w) { w.set("gpt-oss.expert_gating_func", GgufValue::make_u32(1)); })
              .find("metadata gpt-oss.expert_gating_func: value 1 (softmax) is not supported: gpt-oss routes its "
                    "experts by 3 softmax_weight") != std::string::npos);

    // A NaN or inf in a sink, the router, its bias or an expert's bias row: refused at load, naming the tensor.
    const std::string tail = " (a norm, bias, sink, router or rope factor must hold finite values: a damaged or "
                             "wrongly converted file)";
    const auto poked = [&](const std::string& tensor, int64_t index, float v) {
        const std::string path = test::rewrite_with_value(dir, good, "poked.gguf", tensor, index, v);
        const std::string msg = test::load_error(path);
        CHECK(msg.rfind(path + ": ", 0) == 0);
        return msg.substr(std::min(msg.size(), path.size() + 2));
    };
    CHECK(poked("blk.2.attn_sinks.weight", 3, NAN) == "tensor blk.2.attn_sinks.weight: element 3 is nan" + tail);
    CHECK(poked("blk.0.attn_sinks.weight", 0, INFINITY) == "tensor blk.0.attn_sinks.weight: element 0 is inf" + tail);
    CHECK(poked("blk.1.ffn_gate_inp.weight", 100, -INFINITY) ==
          "tensor blk.1.ffn_gate_inp.weight: element 100 is -inf" + tail);
    CHECK(poked("blk.3.ffn_gate_inp.bias", 7, NAN) == "tensor blk.3.ffn_gate_inp.bias: element 7 is nan" + tail);
    CHECK(poked("blk.0.ffn_down_exps.bias", 2000, NAN) ==
          "tensor blk.0.ffn_down_exps.bias: element 2000 is nan" + tail);
    CHECK(poked("blk.0.ffn_up_exps.bias", 5, NAN) == "tensor blk.0.ffn_up_exps.bias: element 5 is nan" + tail);
    CHECK(poked("blk.1.attn_output.bias", 9, NAN) == "tensor blk.1.attn_output.bias: element 9 is nan" + tail);
}

// One layer with its attention output and its bias zeroed (so the layer adds only its FFN), run as a slice from a
// given residual stream, against the scalar reference.
TEST_CASE("gpt-oss's MoE FFN (router and expert biases, clamped SwiGLU) agrees with a scalar reference") {
    test::TempDir dir;
    for (const char* type : {"f32", "q8_0", "q4_k_m"}) {
        CAPTURE(type);
        const std::string path =
            test::rewrite_zeroing(dir, synth_file(dir, "tiny-gpt-oss", type), std::string("zero-attn-") + type + ".gguf",
                                  [](GgufWriter&) {},
                                  [](const std::string& n) { return n.find("attn_output") != std::string::npos; });
        test::check_moe_layers(load_model(path), 11, reference_layer_ffn);
    }
}

TEST_CASE("synth shapes: tiny-gpt-oss's tensors, and gpt-oss-20b's 2880-wide inputs falling back from k-quants") {
    const SynthShape* tiny = find_synth_shape("tiny-gpt-oss");
    REQUIRE(tiny != nullptr);
    CHECK(tiny->dim % 256 == 0);
    CHECK(tiny->expert_ffn_dim % 256 == 0);
    CHECK(tiny->sliding_window < 32);   // a 32-token comparison leaves the window
    const SynthShape* big = find_synth_shape("gpt-oss-20b");
    REQUIRE(big != nullptr);
    CHECK(big->dim == 2880);
    CHECK(big->n_layers == 24);
    CHECK(big->n_heads == 64);
    CHECK(big->head_dim == 64);
    CHECK(big->n_kv_heads == 8);
    CHECK(big->n_expert == 32);
    CHECK(big->n_expert_used == 4);
    CHECK(big->expert_ffn_dim == 2880);
    CHECK(big->sliding_window == 128);
    CHECK(big->vocab == 201088);

    // q4_k_m over gpt-oss-20b's layer 0 (the plan alone; the file would be 12 GB): every 2880-wide input leaves the
    // 256-element k-quants for a 32-element format, the 4096-wide attn_output keeps its k-quant.
    std::vector<PlanInput> inputs;
    auto add = [&](const std::string& name, int64_t ne0, int64_t ne1, int64_t ne2 = 1) {
        PlanInput p;
        p.name = name;
        p.type = GgmlType::F32;
        p.n_dims = ne2 > 1 ? 3 : 2;
        p.ne[0] = ne0;
        p.ne[1] = ne1;
        p.ne[2] = ne2;
        inputs.push_back(p);
    };
    add("token_embd.weight", 2880, 201088);
    add("output.weight", 2880, 201088);
    add("blk.0.attn_q.weight", 2880, 4096);
    add("blk.0.attn_output.weight", 4096, 2880);
    add("blk.0.ffn_gate_exps.weight", 2880, 2880, 32);
    add("blk.0.ffn_down_exps.weight", 2880, 2880, 32);
    ModelFacts facts;
    facts.arch = "gpt-oss";
    facts.n_layer = 24;
    facts.n_head = 64;
    facts.n_head_kv = 8;
    facts.n_expert = 32;
    PlanOptions po;
    po.ftype = *ftype_from_name("q4_k_m");
    const QuantPlan plan = make_quant_plan(inputs, facts, po);
    for (const PlannedTensor& t : plan.tensors) {
        CAPTURE(t.name);
        CHECK(t.ne[0] % block_elems(t.to) == 0);
        if (t.ne[0] == 2880) CHECK(block_elems(t.to) == 32);
        if (t.name == "blk.0.attn_output.weight") CHECK(t.to == GgmlType::Q4_K);
    }
}

} // namespace tern
