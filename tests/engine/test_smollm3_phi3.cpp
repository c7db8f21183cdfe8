// The smollm3 and phi3 families: SmolLM3's NoPE layers (every 4th layer leaves q and k unrotated) and phi3's fused
// tensors (attn_qkv split into q/k/v, ffn_up into gate/up, as views of the file's rows), partial rotary dims, the
// sliding window llama.cpp switches off, and the one-line refusals. tests/families_reference.py checks their
// greedy ids against llama.cpp; these check the pieces.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/backend_factory.h"
#include "engine/cpu/layer_rope.h"
#include "engine/model.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "tests/gguf_rewrite.h"
#include "tests/synth_file.h"
#include "tests/test_support.h"

namespace tern {
namespace {

// The logits of every position of `tokens` in one batch on the CPU backend.
std::vector<float> all_logits(const Model& m, const std::vector<int32_t>& tokens) {
    auto backend = make_backend("cpu", CpuOptions{1});
    RunOptions run;
    run.n_ctx = 64;
    backend->load(m.config, m.weights, run);
    backend->forward({tokens, 0, LogitsWanted::all});
    std::vector<float> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const auto row = backend->logits(static_cast<int>(i));
        out.insert(out.end(), row.begin(), row.end());
    }
    return out;
}

} // namespace

TEST_CASE("smollm3: layers 3, 7, 11, ... skip RoPE, and such a layer's rope changes nothing") {
    test::TempDir dir;
    const Model m = load_model(synth_file(dir, "tiny-smollm3", "f16"));
    CHECK(m.config.arch == Arch::smollm3);
    CHECK(m.config.rope_style == RopeStyle::normal);
    CHECK(m.config.tied_output);
    REQUIRE(m.config.n_layers == 4);
    for (int32_t l = 0; l < 4; ++l) {
        CAPTURE(l);
        CHECK(m.config.layers[size_t(l)].no_rope == (l == 3));
    }
    // The forward and the context shift both take a layer's rope from layer_rope.
    std::mt19937 rng(3);
    std::normal_distribution<float> dist;
    std::vector<float> x(size_t(m.config.head_dim));
    for (float& v : x) v = dist(rng);
    for (const int32_t l : {0, 3}) {
        CAPTURE(l);
        const LayerRope rope = layer_rope(m.config, l, nullptr);
        std::vector<float> y = x;
        rope.apply(y.data(), 17);
        CHECK((y == x) == (l == 3));
        CHECK(rope.rotation(-5).n_rot == (l == 3 ? 0 : m.config.n_rot));
    }
}

TEST_CASE("phi3: fused q/k/v and gate/up as views of their rows, partial rotary, no sliding window") {
    test::TempDir dir;
    const std::string good = synth_file(dir, "tiny-phi3", "q4_k_m");
    const Model m = load_model(good);
    const ModelConfig& c = m.config;
    CHECK(c.arch == Arch::phi3);
    CHECK(c.rope_style == RopeStyle::neox);
    CHECK(c.head_dim == 64);
    CHECK(c.n_rot == 48);
    CHECK(c.ffn_gate_up_fused);
    CHECK(c.tied_output);
    const GgufTensor& qkv = m.file.tensor("blk.1.attn_qkv.weight");
    const GgufTensor& up = m.file.tensor("blk.1.ffn_up.weight");
    const LayerWeights& lw = m.weights.layers[1];
    const int64_t q_dim = 4 * 64, kv_dim = 2 * 64;
    CHECK(lw.wq.data == qkv.data);
    CHECK(lw.wk.data == qkv.data + q_dim * qkv.row_size());
    CHECK(lw.wv.data == qkv.data + (q_dim + kv_dim) * qkv.row_size());
    CHECK(lw.wq.n_out() == q_dim);
    CHECK(lw.wk.n_out() == kv_dim);
    CHECK(lw.wv.n_out() == kv_dim);
    CHECK(lw.w_gate.data == up.data);
    CHECK(lw.w_up.data == up.data + 768 * up.row_size());
    CHECK(lw.w_up.n_out() == 768);
    CHECK(lw.wq.type == qkv.type);

    // The same weights as separate attn_q/k/v tensors (llama.cpp accepts either) give the same logits.
    const std::string split = test::rewrite_gguf(dir, good, "split.gguf", [](GgufWriter&) {},
                                                 [](GgufWriter& w, const GgufTensor& t) {
        if (t.name.find("attn_qkv") == std::string::npos) return false;
        const std::string p = t.name.substr(0, t.name.find("attn_qkv"));
        const size_t row = t.row_size();
        const int64_t rows[3] = {4 * 64, 2 * 64, 2 * 64};
        const char* names[3] = {"attn_q.weight", "attn_k.weight", "attn_v.weight"};
        size_t at = 0;
        for (int i = 0; i < 3; ++i) {
            w.add_tensor(p + names[i], t.type, {t.ne[0], rows[i]},
                         std::span<const uint8_t>(t.data + at, size_t(rows[i]) * row));
            at += size_t(rows[i]) * row;
        }
        return true;
    });
    const std::vector<int32_t> tokens = {1, 40, 300, 301, 7, 99, 120, 5};
    CHECK(all_logits(load_model(split), tokens) == all_logits(m, tokens));

    // llama.cpp reads phi3's attention.sliding_window and switches it off: every layer stays global.
    const std::string windowed = test::rewrite_gguf(dir, good, "window.gguf", [](GgufWriter& w) {
        w.set("phi3.attention.sliding_window", GgufValue::make_u32(4));
    });
    const Model mw = load_model(windowed);
    for (const LayerConfig& lc : mw.config.layers) CHECK(lc.sliding_window == 0);
    CHECK(all_logits(mw, tokens) == all_logits(m, tokens));
}

TEST_CASE("phi3: LongRoPE factors by presence; what it cannot run or read is refused in one line") {
    test::TempDir dir;
    const std::string good = synth_file(dir, "tiny-phi3", "f16");
    auto refused = [&](const std::string& name, const test::TensorReplace& replace) {
        const std::string msg = test::load_error(test::rewrite_gguf(dir, good, name, [](GgufWriter&) {}, replace));
        CHECK(msg.find(name) != std::string::npos);
        CHECK(msg.find('\n') == std::string::npos);
        return msg;
    };
    // LongRoPE factors: phi3 files carry them without rope.scaling.type (llama.cpp takes them by presence), one
    // per rotated pair (n_rot/2 = 24 here, not head_dim/2).
    static const std::vector<float> factors(32, 1.0f);
    auto with_factors = [&](int64_t n) {
        return [&, n](GgufWriter& w, const GgufTensor& t) {
            if (t.name != "output_norm.weight") return false;
            w.add_tensor(t.name, t.type, {t.ne[0]}, std::span<const uint8_t>(t.data, t.n_bytes));
            w.add_tensor("rope_factors_long.weight", GgmlType::F32, {n},
                         std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(factors.data()), size_t(n) * 4));
            return true;
        };
    };
    const Model lr = load_model(test::rewrite_gguf(dir, good, "longrope.gguf", [](GgufWriter&) {}, with_factors(24)));
    CHECK(lr.config.rope_longrope);
    CHECK(lr.weights.rope_factors_long.present());
    CHECK(!lr.weights.rope_factors_short.present());
    CHECK(refused("head-factors.gguf", with_factors(32))
              .find("tensor rope_factors_long.weight has shape [32] but expected [24] [n_rot/2]") != std::string::npos);
    static const std::vector<float> bias(512, 0.0f);
    CHECK(refused("qkv-bias.gguf",
                  [&](GgufWriter& w, const GgufTensor& t) {
                      if (t.name != "blk.0.attn_qkv.weight") return false;
                      w.add_tensor(t.name, t.type, {t.ne[0], t.ne[1]}, std::span<const uint8_t>(t.data, t.n_bytes));
                      w.add_tensor("blk.0.attn_qkv.bias", GgmlType::F32, {512},
                                   std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bias.data()), 512 * 4));
                      return true;
                  })
              .find("tensor blk.0.attn_qkv.bias: a fused q/k/v bias is not supported") != std::string::npos);
    // A gate/up tensor of the dense width (no gate rows): the shape error names the fused layout.
    CHECK(refused("narrow-up.gguf",
                  [](GgufWriter& w, const GgufTensor& t) {
                      if (t.name != "blk.0.ffn_up.weight") return false;
                      w.add_tensor(t.name, t.type, {t.ne[0], t.ne[1] / 2}, std::span<const uint8_t>(t.data, t.n_bytes / 2));
                      return true;
                  })
              .find("tensor blk.0.ffn_up.weight has shape [256, 768] but expected [256, 1536] [dim, 2*ffn_dim]") !=
          std::string::npos);
}

} // namespace tern
