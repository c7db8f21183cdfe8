// ModelConfig / ModelWeights from metadata: the architecture table, gemma3's layer pattern, per-layer
// arrays, precise errors; the backend factory and KV type names.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/finite.h"
#include "engine/backend_factory.h"
#include "engine/cpu/backend_cpu.h"
#include "engine/families.h"
#include "engine/load_errors.h"
#include "engine/memory_budget.h"
#include "engine/model.h"
#include "engine/tools/synth.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "kernels/gpu_info.h"
#include "tests/gguf_rewrite.h"
#include "tests/test_support.h"

namespace tern {
namespace {

// A tiny synthetic model of any architecture: f32 tensors, zero weights (only shapes matter here).
struct TinySpec {
    std::string arch = "llama";
    int64_t dim = 32, n_layers = 2, n_heads = 4, n_kv_heads = 2, head_dim = 8, ffn = 64, vocab = 16;
    bool qkv_bias = false, qk_norm = false, post_norms = false, tied = false;
};

std::vector<uint8_t> g_zeros(1 << 20, 0);
bool g_random_weights = false; // zeros (shape tests) or N(0, 0.5) values (forward tests)

const std::vector<float>& random_pool() {
    static const std::vector<float> pool = [] {
        std::mt19937 rng(42);
        std::normal_distribution<float> dist(0.0f, 0.5f);
        std::vector<float> v(1 << 18);
        for (float& x : v)
            x = dist(rng);
        return v;
    }();
    return pool;
}

void add(GgufWriter& w, const std::string& name, std::vector<int64_t> ne) {
    int64_t n = 1;
    for (int64_t d : ne)
        n *= d;
    if (!g_random_weights) {
        w.add_tensor(name, GgmlType::F32, std::move(ne), std::span<const uint8_t>(g_zeros.data(), size_t(n) * 4));
        return;
    }
    // Each tensor a different slice of the pool, so no two weights are equal.
    const size_t offset = std::hash<std::string>{}(name) % (random_pool().size() - size_t(n));
    w.add_tensor(
        name, GgmlType::F32, std::move(ne),
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(random_pool().data() + offset), size_t(n) * 4));
}

GgufWriter tiny_writer(const TinySpec& s) {
    GgufWriter w;
    const std::string a = s.arch;
    w.set("general.architecture", GgufValue::make_string(a));
    w.set(a + ".context_length", GgufValue::make_u32(256));
    w.set(a + ".embedding_length", GgufValue::make_u32(uint32_t(s.dim)));
    w.set(a + ".block_count", GgufValue::make_u32(uint32_t(s.n_layers)));
    w.set(a + ".feed_forward_length", GgufValue::make_u32(uint32_t(s.ffn)));
    w.set(a + ".attention.head_count", GgufValue::make_u32(uint32_t(s.n_heads)));
    w.set(a + ".attention.head_count_kv", GgufValue::make_u32(uint32_t(s.n_kv_heads)));
    w.set(a + ".attention.key_length", GgufValue::make_u32(uint32_t(s.head_dim)));
    w.set(a + ".attention.value_length", GgufValue::make_u32(uint32_t(s.head_dim)));
    w.set(a + ".attention.layer_norm_rms_epsilon", GgufValue::make_f32(1e-6f));
    add(w, "token_embd.weight", {s.dim, s.vocab});
    add(w, "output_norm.weight", {s.dim});
    if (!s.tied) add(w, "output.weight", {s.dim, s.vocab});
    for (int64_t l = 0; l < s.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        add(w, p + "attn_norm.weight", {s.dim});
        add(w, p + "attn_q.weight", {s.dim, s.n_heads * s.head_dim});
        add(w, p + "attn_k.weight", {s.dim, s.n_kv_heads * s.head_dim});
        add(w, p + "attn_v.weight", {s.dim, s.n_kv_heads * s.head_dim});
        if (s.qkv_bias) {
            add(w, p + "attn_q.bias", {s.n_heads * s.head_dim});
            add(w, p + "attn_k.bias", {s.n_kv_heads * s.head_dim});
            add(w, p + "attn_v.bias", {s.n_kv_heads * s.head_dim});
        }
        if (s.qk_norm) {
            add(w, p + "attn_q_norm.weight", {s.head_dim});
            add(w, p + "attn_k_norm.weight", {s.head_dim});
        }
        add(w, p + "attn_output.weight", {s.n_heads * s.head_dim, s.dim});
        add(w, p + "ffn_norm.weight", {s.dim});
        add(w, p + "ffn_gate.weight", {s.dim, s.ffn});
        add(w, p + "ffn_up.weight", {s.dim, s.ffn});
        add(w, p + "ffn_down.weight", {s.ffn, s.dim});
        if (s.post_norms) {
            add(w, p + "post_attention_norm.weight", {s.dim});
            add(w, p + "post_ffw_norm.weight", {s.dim});
        }
    }
    return w;
}

std::string write_tiny(const test::TempDir& dir, const GgufWriter& w, const std::string& name = "m.gguf") {
    const std::string path = (dir / name).string();
    w.write(path);
    return path;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const TernError& e) {
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("an unsupported architecture is an InputError that lists the supported ones") {
    test::TempDir dir;
    TinySpec s;
    s.arch = "mamba";
    const std::string path = write_tiny(dir, tiny_writer(s));
    try {
        load_model(path);
        FAIL("no error");
    } catch (const InputError& e) {
        const std::string msg = e.what();
        CHECK(msg.find("mamba") != std::string::npos);
        CHECK(msg.find("llama, qwen2, qwen3, gemma2, gemma3") != std::string::npos);
        CHECK(e.code() == ExitCode::bad_input);
    }
}

TEST_CASE("gemma3: local/global layer pattern, rope bases, scaling, norms and flags") {
    test::TempDir dir;
    TinySpec s;
    s.arch = "gemma3";
    s.n_layers = 12;
    s.qk_norm = s.post_norms = s.tied = true;
    s.head_dim = 16; // n_heads * head_dim != dim, as in real gemmas
    GgufWriter w = tiny_writer(s);
    w.set("gemma3.attention.sliding_window", GgufValue::make_u32(512));
    w.set("gemma3.rope.freq_base", GgufValue::make_f32(1e6f));
    w.set("gemma3.rope.scaling.type", GgufValue::make_string("linear"));
    w.set("gemma3.rope.scaling.factor", GgufValue::make_f32(8.0f));
    const Model m = load_model(write_tiny(dir, w));
    const ModelConfig& c = m.config;
    CHECK(c.arch == Arch::gemma3);
    CHECK(c.rope_style == RopeStyle::neox);
    CHECK(c.qk_norm);
    CHECK(c.post_norms);
    CHECK(c.ffn_act == FfnActivation::gelu_tanh);
    CHECK(c.tied_output);
    CHECK(c.embed_scale == doctest::Approx(std::sqrt(32.0f)));
    CHECK(c.attn_scale == doctest::Approx(1.0f / 4.0f));
    CHECK(c.attn_softcap == 0.0f);
    CHECK(c.final_softcap == 0.0f);
    for (int l = 0; l < 12; ++l) {
        CAPTURE(l);
        const LayerConfig& lc = c.layers[size_t(l)];
        const bool local = l % 6 < 5;
        CHECK(lc.sliding_window == (local ? 512 : 0));
        CHECK(lc.rope_base == (local ? 10000.0f : 1e6f));
        CHECK(lc.rope_freq_scale == (local ? 1.0f : 0.125f));
    }
    CHECK(m.weights.output.data == m.weights.token_embd.data);
    CHECK(m.weights.layers[3].q_norm.present());
}

TEST_CASE("gemma2 soft-caps and alternating windows; qwen2 biases; per-layer head counts") {
    test::TempDir dir;
    {
        TinySpec s;
        s.arch = "gemma2";
        s.post_norms = s.tied = true;
        const ModelConfig c = load_model(write_tiny(dir, tiny_writer(s), "g2.gguf")).config;
        CHECK(c.attn_softcap == 50.0f);
        CHECK(c.final_softcap == 30.0f);
        CHECK(c.layers[0].sliding_window == 4096);
        CHECK(c.layers[1].sliding_window == 0);
    }
    {
        TinySpec s;
        s.arch = "qwen2";
        s.qkv_bias = true;
        const Model m = load_model(write_tiny(dir, tiny_writer(s), "q2.gguf"));
        CHECK(m.config.qkv_bias);
        CHECK(m.config.rope_style == RopeStyle::neox);
        CHECK(m.weights.layers[1].bk.present());
        // The biases are required for qwen2.
        TinySpec nb;
        nb.arch = "qwen2";
        const std::string msg = error_of([&] { load_model(write_tiny(dir, tiny_writer(nb), "q2nb.gguf")); });
        CHECK(msg.find("blk.0.attn_q.bias is missing") != std::string::npos);
    }
    {
        TinySpec s;
        s.n_layers = 3;
        GgufWriter w = tiny_writer(s);
        w.set("llama.attention.head_count_kv", GgufValue::make_i32_array({2, 2, 2}));
        const ModelConfig c = load_model(write_tiny(dir, w, "pl.gguf")).config;
        CHECK(c.layers.size() == 3);
        CHECK(c.layers[2].n_kv_heads == 2);
        CHECK(c.uniform_kv_heads());
        CHECK(c.head_dim == 8);
        CHECK(c.n_rot == 8);
    }
}

TEST_CASE("YaRN rope scaling: the correction range, mscale and defaults from the rope.scaling keys") {
    test::TempDir dir;
    TinySpec s;
    s.head_dim = 64;
    s.n_heads = 2;
    s.n_kv_heads = 1;
    s.dim = 128;
    {
        // factor 4, original context 4096, base 10000, n_rot 64, default betas 32 / 1:
        // 64 ln(4096 / (32 * 2 pi)) / (2 ln 10000) = 10.47 -> floor 10; 64 ln(4096 / 2 pi) / (2 ln 10000) = 22.5 -> 23.
        GgufWriter w = tiny_writer(s);
        w.set("llama.rope.scaling.type", GgufValue::make_string("yarn"));
        w.set("llama.rope.scaling.factor", GgufValue::make_f32(4.0f));
        w.set("llama.rope.scaling.original_context_length", GgufValue::make_u32(4096));
        const ModelConfig c = load_model(write_tiny(dir, w, "yarn.gguf")).config;
        CHECK(c.rope_n_ctx_orig == 4096);
        for (const LayerConfig& lc : c.layers) {
            CHECK(lc.rope_freq_scale == 0.25f);
            CHECK(lc.yarn_ext_factor == 1.0f);
            CHECK(lc.yarn_corr_low == 10.0f);
            CHECK(lc.yarn_corr_high == 23.0f);
            CHECK(lc.rope_mscale == doctest::Approx(1.0 + 0.1 * std::log(4.0)).epsilon(1e-6));
        }
    }
    {
        // Explicit betas, a log multiplier equal to 1 (Ministral 3: mscale / mscale_all_dims = 1) and an
        // attention factor; the original context falls back to context_length (256 in the tiny spec).
        GgufWriter w = tiny_writer(s);
        w.set("llama.rope.scaling.type", GgufValue::make_string("yarn"));
        w.set("llama.rope.scaling.factor", GgufValue::make_f32(16.0f));
        w.set("llama.rope.scaling.yarn_beta_fast", GgufValue::make_f32(16.0f));
        w.set("llama.rope.scaling.yarn_beta_slow", GgufValue::make_f32(2.0f));
        w.set("llama.rope.scaling.yarn_log_multiplier", GgufValue::make_f32(1.0f));
        w.set("llama.rope.scaling.attn_factor", GgufValue::make_f32(0.5f));
        const ModelConfig c = load_model(write_tiny(dir, w, "yarn2.gguf")).config;
        CHECK(c.rope_n_ctx_orig == c.n_ctx_train);
        const double lo = 64.0 * std::log(double(c.n_ctx_train) / (16.0 * 2.0 * M_PI)) / (2.0 * std::log(10000.0));
        const double hi = 64.0 * std::log(double(c.n_ctx_train) / (2.0 * 2.0 * M_PI)) / (2.0 * std::log(10000.0));
        CHECK(c.layers[0].yarn_corr_low == float(std::max(0.0, std::floor(lo))));
        CHECK(c.layers[0].yarn_corr_high == float(std::min(63.0, std::ceil(hi))));
        CHECK(c.layers[0].rope_mscale == doctest::Approx(0.5).epsilon(1e-6));
    }
    {
        // Linear scaling keeps YaRN off.
        GgufWriter w = tiny_writer(s);
        w.set("llama.rope.scaling.type", GgufValue::make_string("linear"));
        w.set("llama.rope.scaling.factor", GgufValue::make_f32(4.0f));
        const ModelConfig c = load_model(write_tiny(dir, w, "lin.gguf")).config;
        CHECK(c.layers[0].yarn_ext_factor == 0.0f);
        CHECK(c.layers[0].rope_mscale == 1.0f);
    }
}

namespace {

// A llama with random weights and, per `mode`, LongRoPE (long / short factor tensors, original context 64,
// attention factor 1.25) or plain rope with those factors as rope_freqs.weight and the same attention factor.
enum class RopeFactorsMode { longrope, freqs_long, freqs_short };

std::string factor_model(const test::TempDir& dir, RopeFactorsMode mode, const std::string& name) {
    static std::vector<float> long_f, short_f;
    long_f.clear();
    short_f.clear();
    for (int i = 0; i < 4; ++i) {   // head_dim 8: 4 pairs
        long_f.push_back(1.0f + 3.0f * float(i));
        short_f.push_back(1.0f + 0.25f * float(i));
    }
    const auto bytes = [](const std::vector<float>& v) {
        return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float));
    };
    g_random_weights = true;
    TinySpec s;
    GgufWriter w = tiny_writer(s);
    g_random_weights = false;
    w.set("llama.rope.scaling.attn_factor", GgufValue::make_f32(1.25f));
    if (mode == RopeFactorsMode::longrope) {
        w.set("llama.rope.scaling.type", GgufValue::make_string("longrope"));
        w.set("llama.rope.scaling.original_context_length", GgufValue::make_u32(64));
        w.add_tensor("rope_factors_long.weight", GgmlType::F32, {4}, bytes(long_f));
        w.add_tensor("rope_factors_short.weight", GgmlType::F32, {4}, bytes(short_f));
    } else {
        w.add_tensor("rope_freqs.weight", GgmlType::F32, {4}, bytes(mode == RopeFactorsMode::freqs_long ? long_f : short_f));
    }
    return write_tiny(dir, w, name);
}

std::vector<float> all_logits(const Model& m, int32_t n_ctx, const std::vector<int32_t>& tokens) {
    CpuBackend b(CpuOptions{1});
    b.load(m.config, m.weights, RunOptions{n_ctx, KvType::f32});
    b.forward(ForwardBatch{tokens, 0, LogitsWanted::all});
    std::vector<float> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const std::span<const float> l = b.logits(int64_t(i));
        out.insert(out.end(), l.begin(), l.end());
    }
    return out;
}

} // namespace

TEST_CASE("LongRoPE: the long factors past the original context, the short ones within it, the attention factor") {
    test::TempDir dir;
    const Model lr = load_model(factor_model(dir, RopeFactorsMode::longrope, "lr.gguf"));
    const ModelConfig& c = lr.config;
    CHECK(c.rope_longrope);
    CHECK(c.rope_n_ctx_orig == 64);
    CHECK_FALSE(c.rope_long_factors(64));
    CHECK(c.rope_long_factors(65));
    CHECK(c.layers[0].rope_mscale == 1.25f);
    CHECK(c.layers[0].yarn_ext_factor == 0.0f);
    CHECK(&rope_factors_for(lr.weights, c, 64) == &lr.weights.rope_factors_short);
    CHECK(&rope_factors_for(lr.weights, c, 65) == &lr.weights.rope_factors_long);

    // The forward with LongRoPE equals, bit for bit, the forward of the same weights with the chosen factors
    // given as rope_freqs.weight (whose division of the angles the rope kernel tests check).
    const Model fl = load_model(factor_model(dir, RopeFactorsMode::freqs_long, "fl.gguf"));
    const Model fs = load_model(factor_model(dir, RopeFactorsMode::freqs_short, "fs.gguf"));
    const std::vector<int32_t> tokens = {3, 7, 1, 12, 5, 9, 2, 14, 6, 11};
    const std::vector<float> long_ctx = all_logits(lr, 128, tokens), short_ctx = all_logits(lr, 32, tokens);
    CHECK(long_ctx == all_logits(fl, 128, tokens));
    CHECK(short_ctx == all_logits(fs, 32, tokens));
    CHECK(long_ctx != short_ctx);   // the two factor sets do differ here

    // rope_freqs.weight with longrope is refused (llama.cpp never reads both).
    {
        g_random_weights = false;
        TinySpec s;
        GgufWriter w = tiny_writer(s);
        w.set("llama.rope.scaling.type", GgufValue::make_string("longrope"));
        add(w, "rope_freqs.weight", {4});
        const std::string msg = error_of([&] { load_model(write_tiny(dir, w, "both.gguf")); });
        CHECK(msg.find("both.gguf") != std::string::npos);
        CHECK(msg.find("rope_freqs.weight cannot go with rope.scaling.type longrope") != std::string::npos);
    }
}

TEST_CASE("mistral3: llama layers, YaRN keys and the attention temperature of q past the original context") {
    test::TempDir dir;
    g_random_weights = true;
    TinySpec s;
    s.arch = "mistral3";
    s.n_layers = 1;
    s.tied = true;
    GgufWriter w = tiny_writer(s);
    g_random_weights = false;
    w.set("mistral3.rope.scaling.type", GgufValue::make_string("yarn"));
    w.set("mistral3.rope.scaling.factor", GgufValue::make_f32(16.0f));
    w.set("mistral3.rope.scaling.original_context_length", GgufValue::make_u32(4));
    w.set("mistral3.rope.scaling.yarn_beta_fast", GgufValue::make_f32(32.0f));
    w.set("mistral3.rope.scaling.yarn_beta_slow", GgufValue::make_f32(1.0f));
    w.set("mistral3.rope.scaling.yarn_log_multiplier", GgufValue::make_f32(1.0f));
    w.set("mistral3.attention.temperature_scale", GgufValue::make_f32(0.1f));
    const Model m = load_model(write_tiny(dir, w, "m3.gguf"));
    const ModelConfig& c = m.config;
    CHECK(c.arch == Arch::mistral3);
    CHECK(c.rope_style == RopeStyle::normal);
    CHECK_FALSE(c.qk_norm);
    CHECK(c.tied_output);
    CHECK(c.layers[0].yarn_ext_factor == 1.0f);
    // yarn_log_multiplier 1 = mscale_all_dim 1: the attention factor cancels to 1.
    CHECK(c.layers[0].rope_mscale == doctest::Approx(1.0f).epsilon(1e-6));
    CHECK(c.attn_temp_scale == 0.1f);
    CHECK(c.attn_temp_floor == 4);
    // 1 + 0.1 ln(floor(p / 4) + 1)
    CHECK(c.attn_temperature(0) == 1.0f);
    CHECK(c.attn_temperature(3) == 1.0f);
    CHECK(c.attn_temperature(4) == doctest::Approx(1.0 + 0.1 * std::log(2.0)));
    CHECK(c.attn_temperature(7) == doctest::Approx(1.0 + 0.1 * std::log(2.0)));
    CHECK(c.attn_temperature(12) == doctest::Approx(1.0 + 0.1 * std::log(4.0)));

    // One layer: the last token's logits (position 5, temperature t) equal those of the same model without the
    // temperature but with its attention scale multiplied by t, up to rounding; without either they differ.
    const std::vector<int32_t> tokens = {3, 7, 1, 12, 5, 9};
    const auto last_logits = [&](const ModelConfig& config) {
        CpuBackend b(CpuOptions{1});
        b.load(config, m.weights, RunOptions{32, KvType::f32});
        b.forward(ForwardBatch{tokens, 0, LogitsWanted::last});
        const std::span<const float> l = b.logits(0);
        return std::vector<float>(l.begin(), l.end());
    };
    const float t = c.attn_temperature(5);
    ModelConfig scaled = c, plain = c;
    scaled.attn_temp_scale = plain.attn_temp_scale = 0.0f;
    scaled.attn_scale *= t;
    const std::vector<float> got = last_logits(c), want = last_logits(scaled), without = last_logits(plain);
    double d_scaled = 0.0, d_plain = 0.0;
    for (size_t v = 0; v < got.size(); ++v) {
        d_scaled = std::max(d_scaled, double(std::fabs(got[v] - want[v])));
        d_plain = std::max(d_plain, double(std::fabs(got[v] - without[v])));
    }
    CHECK(d_scaled < 1e-4);
    CHECK(d_plain > 1e-3);
    MESSAGE("temperature " << t << ": max |Δ| vs the scaled attention " << d_scaled << ", vs none " << d_plain);

    // A mixture-of-experts mistral3 is refused in one line.
    {
        TinySpec e;
        e.arch = "mistral3";
        GgufWriter we = tiny_writer(e);
        we.set("mistral3.expert_count", GgufValue::make_u32(8));
        const std::string msg = error_of([&] { load_model(write_tiny(dir, we, "m3moe.gguf")); });
        CHECK(msg.find("mistral3.expert_count") != std::string::npos);
    }
}

TEST_CASE("missing and mis-shaped tensors, unsupported rope scaling: precise errors") {
    test::TempDir dir;
    TinySpec s;
    {
        GgufWriter w = tiny_writer(s);
        w.set("llama.rope.scaling.type", GgufValue::make_string("dynamic"));
        const std::string msg = error_of([&] { load_model(write_tiny(dir, w, "dyn.gguf")); });
        CHECK(msg.find("llama.rope.scaling.type") != std::string::npos);
        CHECK(msg.find("'dynamic' is not supported") != std::string::npos);
    }
    {
        GgufWriter w = tiny_writer(s);
        w.set("llama.rope.scaling.type", GgufValue::make_string("yarn"));
        w.set("llama.rope.scaling.yarn_beta_fast", GgufValue::make_f32(-1.0f));
        const std::string msg = error_of([&] { load_model(write_tiny(dir, w, "yarnbeta.gguf")); });
        CHECK(msg.find("yarnbeta.gguf") != std::string::npos);
        CHECK(msg.find("llama.rope.scaling.yarn_beta_fast") != std::string::npos);
    }
    {
        TinySpec bad = s;
        bad.n_kv_heads = 4; // the tensors say 4 KV heads ...
        GgufWriter w = tiny_writer(bad);
        w.set("llama.attention.head_count_kv", GgufValue::make_u32(2)); // ... the metadata says 2
        const std::string msg = error_of([&] { load_model(write_tiny(dir, w, "shape.gguf")); });
        CHECK(msg.find("tensor blk.0.attn_k.weight has shape [32, 32] but expected [32, 16] "
                       "[dim, n_kv_heads*head_dim]") != std::string::npos);
    }
    {
        GgufWriter w = tiny_writer(s);
        w.set("llama.attention.head_count_kv", GgufValue::make_u32(3));
        const std::string msg = error_of([&] { load_model(write_tiny(dir, w, "gqa.gguf")); });
        CHECK(msg.find("3 KV heads do not divide 4 query heads") != std::string::npos);
    }
}

TEST_CASE("configs of the shared model files") {
    if (!test::shared_available()) return;
    const ModelConfig st = load_model(test::shared_path("models/gguf/stories260K-f32.gguf").string()).config;
    CHECK(st.arch == Arch::llama);
    CHECK(st.dim == 64);
    CHECK(st.n_layers == 5);
    CHECK(st.layers[0].n_heads == 8);
    CHECK(st.layers[0].n_kv_heads == 4);
    CHECK(st.head_dim == 8);
    CHECK(st.vocab == 512);
    CHECK(st.rope_style == RopeStyle::normal);
    CHECK_FALSE(st.tied_output);
    const ModelConfig tied = load_model(test::shared_path("models/synth/synth-k256-tied-q8_0.gguf").string()).config;
    CHECK(tied.tied_output);
    const ModelConfig qw = load_model(test::shared_path("models/synth/synth-qwen2-k256-f32.gguf").string()).config;
    CHECK(qw.arch == Arch::qwen2);
    CHECK(qw.layers[0].rope_base == 1e6f);
    CHECK(qw.qkv_bias);
}

TEST_CASE("sliding-window attention: a 1-layer local model only sees the last `window` tokens") {
    // RoPE scores depend only on q - k, so with one local layer of window W the logits at position p
    // equal those of the W tokens ending at p evaluated from position 0 (up to f32 rounding).
    test::TempDir dir;
    g_random_weights = true;
    TinySpec s;
    s.arch = "gemma3";
    s.n_layers = 1; // layer 0 is local (0 % 6 < 5)
    s.qk_norm = s.post_norms = s.tied = true;
    GgufWriter w = tiny_writer(s);
    const int32_t window = 4;
    w.set("gemma3.attention.sliding_window", GgufValue::make_u32(window));
    const Model m = load_model(write_tiny(dir, w));
    g_random_weights = false;
    REQUIRE(m.config.layers[0].sliding_window == window);

    const std::vector<int32_t> tokens = {3, 7, 1, 12, 5, 9, 2, 14, 6, 11, 0, 8};
    const int64_t vocab = m.config.vocab;
    CpuBackend full(CpuOptions{1});
    full.load(m.config, m.weights, RunOptions{32, KvType::f32});
    full.forward(ForwardBatch{tokens, 0, LogitsWanted::all});
    double max_d = 0.0, max_windowless = 0.0;
    for (int32_t p = window - 1; p < static_cast<int32_t>(tokens.size()); ++p) {
        CpuBackend part(CpuOptions{1});
        part.load(m.config, m.weights, RunOptions{32, KvType::f32});
        part.forward(
            ForwardBatch{std::span(tokens).subspan(size_t(p - window + 1), size_t(window)), 0, LogitsWanted::last});
        for (int64_t v = 0; v < vocab; ++v)
            max_d = std::max(max_d, double(std::abs(full.logits(p)[size_t(v)] - part.logits(0)[size_t(v)])));
    }
    CHECK(max_d < 1e-3);

    // Without the window the same comparison fails: the check has power.
    ModelConfig global = m.config;
    global.layers[0].sliding_window = 0;
    CpuBackend g(CpuOptions{1});
    g.load(global, m.weights, RunOptions{32, KvType::f32});
    g.forward(ForwardBatch{tokens, 0, LogitsWanted::all});
    for (int64_t v = 0; v < vocab; ++v)
        max_windowless =
            std::max(max_windowless, double(std::abs(g.logits(11)[size_t(v)] - full.logits(11)[size_t(v)])));
    CHECK(max_windowless > 1e-2);
    MESSAGE("window 4: max |Δ| vs the last-4-tokens forward " << max_d << "; without the window " << max_windowless);
}

namespace {

// The one line loading `w` (written as dir/name) fails with, without its "<path>: " head; "" when it loads.
std::string meta_error(const test::TempDir& dir, const GgufWriter& w, const std::string& name) {
    const std::string path = write_tiny(dir, w, name);
    const std::string msg = error_of([&] { load_model(path); });
    CHECK(msg.find('\n') == std::string::npos);
    if (msg.empty()) return "";
    if (msg.rfind(path + ": ", 0) != 0) return "(not naming " + path + ") " + msg;
    return msg.substr(path.size() + 2);
}

} // namespace

TEST_CASE("metadata floats are finite and in their meaning's range, else one line naming the key, value and range") {
    test::TempDir dir;
    TinySpec gemma2;
    gemma2.arch = "gemma2";
    gemma2.post_norms = gemma2.tied = true;
    const std::string softcap_range = "(expected a finite number > 0: c * tanh(x / c) caps scores and logits at +-c)";
    for (const float v : {INFINITY, -INFINITY, NAN, 0.0f, -30.0f}) {
        CAPTURE(v);
        GgufWriter w = tiny_writer(gemma2);
        w.set("gemma2.final_logit_softcapping", GgufValue::make_f32(v));
        CHECK(meta_error(dir, w, "final-cap.gguf") ==
              "metadata gemma2.final_logit_softcapping: value " + float_text(v) + " is out of range " + softcap_range);
        GgufWriter a = tiny_writer(gemma2);
        a.set("gemma2.attn_logit_softcapping", GgufValue::make_f32(v));
        CHECK(meta_error(dir, a, "attn-cap.gguf") ==
              "metadata gemma2.attn_logit_softcapping: value " + float_text(v) + " is out of range " + softcap_range);
    }
    { // A sliding window of 1 (each token alone), or 0.
        TinySpec g3 = gemma2;
        g3.arch = "gemma3";
        g3.qk_norm = true;
        for (const uint32_t v : {1u, 0u}) {
            GgufWriter w = tiny_writer(g3);
            w.set("gemma3.attention.sliding_window", GgufValue::make_u32(v));
            CHECK(meta_error(dir, w, "window.gguf") == "metadata gemma3.attention.sliding_window: value " +
                                                           std::to_string(v) +
                                                           " is out of range (expected 2..1073741824)");
        }
        GgufWriter w = tiny_writer(gemma2);
        w.set("gemma2.attention.sliding_window", GgufValue::make_u32(1));
        CHECK(meta_error(dir, w, "window2.gguf") ==
              "metadata gemma2.attention.sliding_window: value 1 is out of range (expected 2..1073741824)");
        w.set("gemma2.attention.sliding_window", GgufValue::make_u32(2)); // the smallest window accepted
        CHECK(meta_error(dir, w, "window2.gguf") == "");
    }

    const TinySpec llama;
    const auto with = [&](const std::vector<std::pair<std::string, GgufValue>>& keys) {
        GgufWriter w = tiny_writer(llama);
        for (const auto& [k, v] : keys)
            w.set("llama." + k, v);
        return meta_error(dir, w, "llama.gguf");
    };
    const auto f32 = [](float v) { return GgufValue::make_f32(v); };
    const auto yarn = GgufValue::make_string("yarn");
    // YaRN's factor: it stretches the context (>= 1), to at most 2^31 positions (2^31 / 256 here).
    const std::string yarn_range = "(expected a finite number >= 1 and <= 8.38861e+06: YaRN stretches the original "
                                   "context by the factor, to at most 2^31 positions)";
    for (const float v : {0.0f, 0.5f, 1e30f, INFINITY, NAN}) {
        CAPTURE(v);
        CHECK(with({{"rope.scaling.type", yarn}, {"rope.scaling.factor", f32(v)}}) ==
              "metadata llama.rope.scaling.factor: value " + float_text(v) + " is out of range " + yarn_range);
    }
    CHECK(with({{"rope.scaling.type", yarn}, {"rope.scaling.factor", f32(1.0f)}}) == "");
    CHECK(with({{"rope.scaling.factor", f32(0.0f)}}) == ""); // linear 0: no scaling, as the format says
    CHECK(with({{"rope.scaling.factor", f32(-2.0f)}}) ==
          "metadata llama.rope.scaling.factor: value -2 is out of range (expected a finite number > 0 and <= "
          "8.38861e+06: the original context times the factor must stay within 2^31 positions)");
    CHECK(
        with({{"rope.scale_linear", f32(1e30f)}}).starts_with("metadata llama.rope.scale_linear: value 1e+30 is out"));
    // The rope base.
    for (const float v : {INFINITY, NAN, 0.0f, -10000.0f, 1.0f}) {
        CAPTURE(v);
        CHECK(with({{"rope.freq_base", f32(v)}}) ==
              "metadata llama.rope.freq_base: value " + float_text(v) +
                  " is out of range (expected a finite number > 1: the rope frequencies base^(-2i/n_rot) must fall "
                  "with i)");
    }
    // The other float keys, one case each.
    CHECK(with({{"attention.layer_norm_rms_epsilon", f32(INFINITY)}}) ==
          "metadata llama.attention.layer_norm_rms_epsilon: value inf is out of range (expected a finite number > 0 "
          "and <= 1: a norm's epsilon is a small positive guard)");
    CHECK(with({{"attention.layer_norm_rms_epsilon", f32(0.0f)}}).find("value 0 is out of range") != std::string::npos);
    CHECK(with({{"rope.scaling.attn_factor", f32(1e30f)}}) ==
          "metadata llama.rope.scaling.attn_factor: value 1e+30 is out of range (expected a finite number > 0 and <= "
          "10: it multiplies every rotated q and k value)");
    CHECK(with({{"rope.scaling.attn_factor", f32(0.0f)}}).find("value 0 is out of range") != std::string::npos);
    CHECK(with({{"rope.scaling.type", yarn}, {"rope.scaling.yarn_ext_factor", f32(2.0f)}}) ==
          "metadata llama.rope.scaling.yarn_ext_factor: value 2 is out of range (expected a finite number >= 0 and "
          "<= 1: the share of the extrapolated angle in YaRN's ramp)");
    CHECK(with({{"rope.scaling.type", yarn}, {"rope.scaling.yarn_beta_slow", f32(NAN)}})
              .find("metadata llama.rope.scaling.yarn_beta_slow: value nan is out of range") == 0);
    CHECK(
        with({{"rope.scaling.type", yarn}, {"rope.scaling.yarn_log_multiplier", f32(-1.0f)}})
            .find("metadata llama.rope.scaling.yarn_log_multiplier: value -1 is out of range (expected a finite number "
                  ">= 0") == 0);
    {
        TinySpec m3;
        m3.arch = "mistral3";
        GgufWriter w = tiny_writer(m3);
        w.set("mistral3.attention.temperature_scale", f32(NAN));
        CHECK(meta_error(dir, w, "m3.gguf") ==
              "metadata mistral3.attention.temperature_scale: value nan is out of range (expected a finite number >= "
              "0 and <= 10: q's temperature 1 + scale * ln(...) grows with the position)");
    }
}

TEST_CASE("small tensors (norms, biases, rope factors) hold finite values, rope factors > 0: else refused at load") {
    test::TempDir dir;
    const std::string tail = " (a norm, bias, sink, router or rope factor must hold finite values: a damaged or "
                             "wrongly converted file)";
    // The one line loading `path` fails with, without its "<path>: " head.
    const auto error = [](const std::string& path) {
        const std::string msg = test::load_error(path);
        CHECK(msg.find('\n') == std::string::npos);
        return msg.rfind(path + ": ", 0) == 0 ? msg.substr(path.size() + 2) : "(not naming the file) " + msg;
    };
    TinySpec s;
    const std::string good = write_tiny(dir, tiny_writer(s), "good.gguf");
    for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
        CAPTURE(type_name(type));
        for (const float v : {NAN, INFINITY, -INFINITY}) {
            CHECK(error(test::rewrite_with_value(dir, good, "norm.gguf", "blk.1.attn_norm.weight", 5, v, type)) ==
                  "tensor blk.1.attn_norm.weight: element 5 is " + float_text(v) + tail);
            CHECK(error(test::rewrite_with_value(dir, good, "out-norm.gguf", "output_norm.weight", 31, v, type)) ==
                  "tensor output_norm.weight: element 31 is " + float_text(v) + tail);
        }
    }
    { // q/k norms, post norms and biases of the families that have them.
        TinySpec g;
        g.arch = "gemma3";
        g.qk_norm = g.post_norms = g.tied = true;
        GgufWriter w = tiny_writer(g);
        w.set("gemma3.attention.sliding_window", GgufValue::make_u32(16));
        const std::string gemma = write_tiny(dir, w, "gemma3.gguf");
        for (const char* t :
             {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "blk.0.post_attention_norm.weight",
              "blk.1.post_ffw_norm.weight", "blk.0.ffn_norm.weight"}) {
            CAPTURE(t);
            CHECK(error(test::rewrite_with_value(dir, gemma, "g.gguf", t, 3, NAN)) ==
                  std::string("tensor ") + t + ": element 3 is nan" + tail);
        }
        TinySpec q;
        q.arch = "qwen2";
        q.qkv_bias = true;
        const std::string qwen = write_tiny(dir, tiny_writer(q), "qwen2.gguf");
        CHECK(error(test::rewrite_with_value(dir, qwen, "b.gguf", "blk.1.attn_k.bias", 15, INFINITY, GgmlType::F16)) ==
              "tensor blk.1.attn_k.bias: element 15 is inf" + tail);
    }
    { // A quantized norm: its block's f16 scale is inf.
        std::vector<uint8_t> block(34, 1);
        block[0] = 0x00;
        block[1] = 0x7c; // d = inf (f16 0x7c00)
        const std::string path = test::rewrite_gguf(
            dir, good, "q8norm.gguf", [](GgufWriter&) {},
            [&](GgufWriter& w, const GgufTensor& t) {
                if (t.name != "blk.0.ffn_norm.weight") return false;
                w.add_tensor(t.name, GgmlType::Q8_0, {32}, block);
                return true;
            });
        CHECK(error(path) ==
              "tensor blk.0.ffn_norm.weight: block 0 (elements 0..31): its f16 scale d is inf (0x7c00)" + tail);
    }
    { // LongRoPE's factor tensors and rope_freqs: finite and > 0.
        const std::string lr = factor_model(dir, RopeFactorsMode::longrope, "lr.gguf");
        const std::string fr = factor_model(dir, RopeFactorsMode::freqs_long, "fr.gguf");
        g_random_weights = false;
        for (const char* t : {"rope_factors_long.weight", "rope_factors_short.weight"}) {
            CAPTURE(t);
            const std::string head = std::string("tensor ") + t + ": element 1 is ";
            const std::string why = ", but rope factors divide the rope angles and must be > 0 (a damaged or wrongly "
                                    "converted file)";
            CHECK(error(test::rewrite_with_value(dir, lr, "f0.gguf", t, 1, 0.0f)) == head + "0" + why);
            CHECK(error(test::rewrite_with_value(dir, lr, "fn.gguf", t, 1, -1.0f)) == head + "-1" + why);
            CHECK(error(test::rewrite_with_value(dir, lr, "fnan.gguf", t, 1, NAN)) == head + "nan" + tail);
        }
        CHECK(error(test::rewrite_with_value(dir, fr, "rf.gguf", "rope_freqs.weight", 3, -0.0f)) ==
              "tensor rope_freqs.weight: element 3 is -0, but rope factors divide the rope angles and must be > 0 (a "
              "damaged or wrongly converted file)");
        CHECK(test::load_error(lr).empty()); // the files they were made from load
        CHECK(test::load_error(fr).empty());
    }
}

namespace {

// A `tern synth` file of `shape` (f32) and its config, read without loading the weights: the loader and the
// forward of a family come after its config (engine/families.h).
std::string synth_f32(const test::TempDir& dir, const std::string& shape) {
    const std::string path = (dir / (shape + "-f32.gguf")).string();
    SynthOptions o;
    o.shape = shape;
    o.type = "f32";
    o.n_threads = 1;
    write_synth_model(o, path);
    return path;
}

ModelConfig config_of(const std::string& path) {
    return model_config_from_gguf(GgufFile::open(path));
}

std::string config_error(const std::string& path) {
    const std::string msg = error_of([&] { config_of(path); });
    CHECK(msg.find('\n') == std::string::npos);
    if (msg.rfind(path + ": ", 0) != 0) return "(not naming " + path + ") " + msg;
    return msg.substr(path.size() + 2);
}

} // namespace

TEST_CASE("families are a table: every architecture named once, in Arch order, its descriptor found by name") {
    const std::span<const std::string_view> names = supported_architectures();
    REQUIRE(names.size() == families().size());
    for (size_t i = 0; i < names.size(); ++i) {
        CAPTURE(names[i]);
        const FamilyDescriptor* f = find_family(names[i]);
        REQUIRE(f != nullptr);
        CHECK(static_cast<size_t>(f->arch) == i);
        CHECK(arch_name(f->arch) == names[i]);
        CHECK(&family_of(f->arch) == f);
        CHECK(std::count(names.begin(), names.end(), names[i]) == 1);
    }
    CHECK(find_family("granite") != nullptr);
    CHECK(find_family("olmo2") != nullptr);
    CHECK(find_family("mamba") == nullptr);
    CHECK(find_family("") == nullptr);
}

TEST_CASE("granite: llama layers and its four multipliers, RoPE switched by rope.scaling.finetuned") {
    test::TempDir dir;
    const std::string path = synth_f32(dir, "tiny-granite");
    const ModelConfig c = config_of(path);
    CHECK(c.arch == Arch::granite);
    CHECK(c.rope_style == RopeStyle::normal);
    CHECK(c.ffn_act == FfnActivation::silu);
    CHECK(c.pre_norms);
    CHECK_FALSE(c.post_norms);
    CHECK_FALSE(c.qk_norm);
    CHECK_FALSE(c.qkv_bias);
    CHECK_FALSE(c.tied_output);
    CHECK_FALSE(c.moe());
    CHECK(c.embed_scale == 12.0f);
    CHECK(c.residual_scale == 0.22f);
    CHECK(c.attn_scale == 0.0078125f);
    CHECK(c.logit_scale == 8.0f);
    CHECK(c.final_softcap == 0.0f);
    CHECK(c.head_dim == 64);
    CHECK(c.n_rot == 64);
    REQUIRE(c.n_layers == 2);
    for (const LayerConfig& l : c.layers) {
        CHECK(l.rope_base == 1e7f);
        CHECK_FALSE(l.no_rope);
        CHECK(l.sliding_window == 0);
    }

    // llama.cpp reads 0 as "not set" for all but logit_scale: the default multipliers, 1/sqrt(head_dim) for q.k.
    const std::string zeros = test::rewrite_gguf(dir, path, "zeros.gguf", [](GgufWriter& w) {
        for (const char* key : {"granite.embedding_scale", "granite.residual_scale", "granite.attention.scale"})
            w.set(key, GgufValue::make_f32(0.0f));
    });
    const ModelConfig z = config_of(zeros);
    CHECK(z.embed_scale == 1.0f);
    CHECK(z.residual_scale == 1.0f);
    CHECK(z.attn_scale == doctest::Approx(0.125f));
    CHECK(z.logit_scale == 8.0f);

    // rope.scaling.finetuned false: no layer rotates q and k.
    const std::string no_rope = test::rewrite_gguf(dir, path, "no-rope.gguf", [](GgufWriter& w) {
        w.set("granite.rope.scaling.finetuned", GgufValue::make_bool(false));
    });
    for (const LayerConfig& l : config_of(no_rope).layers)
        CHECK(l.no_rope);
    const std::string rope_on = test::rewrite_gguf(dir, path, "rope-on.gguf", [](GgufWriter& w) {
        w.set("granite.rope.scaling.finetuned", GgufValue::make_bool(true));
    });
    for (const LayerConfig& l : config_of(rope_on).layers)
        CHECK_FALSE(l.no_rope);

    // logit_scale is required and divides the logits: 0 is refused, as is a negative or non-finite multiplier.
    const std::string no_logit =
        test::rewrite_gguf(dir, path, "no-logit.gguf", [](GgufWriter& w) { w.remove("granite.logit_scale"); });
    CHECK(config_error(no_logit).find("granite.logit_scale") != std::string::npos);
    const std::string zero_logit = test::rewrite_gguf(
        dir, path, "zero-logit.gguf", [](GgufWriter& w) { w.set("granite.logit_scale", GgufValue::make_f32(0.0f)); });
    CHECK(config_error(zero_logit) == "metadata granite.logit_scale: value 0 is out of range (expected a finite "
                                      "number > 0: the logits are divided by it)");
    for (const float v : {-0.5f, INFINITY, NAN}) {
        CAPTURE(v);
        const std::string bad = test::rewrite_gguf(dir, path, "bad-residual.gguf", [&](GgufWriter& w) {
            w.set("granite.residual_scale", GgufValue::make_f32(v));
        });
        CHECK(config_error(bad) == "metadata granite.residual_scale: value " + float_text(v) +
                                       " is out of range (expected a finite number >= 0: a multiplier of the "
                                       "activations (0: none))");
    }
    // A granite mixture of experts is refused (its own architecture, granitemoe, is not supported either).
    const std::string moe = test::rewrite_gguf(
        dir, path, "moe.gguf", [](GgufWriter& w) { w.set("granite.expert_count", GgufValue::make_u32(8)); });
    CHECK(config_error(moe).find("mixture-of-experts granite models are not supported yet") != std::string::npos);
}

TEST_CASE("olmo2: no pre-norms, post norms, q/k norms over the whole width, neox RoPE, no sliding window") {
    test::TempDir dir;
    const std::string path = synth_f32(dir, "tiny-olmo2");
    const ModelConfig c = config_of(path);
    CHECK(c.arch == Arch::olmo2);
    CHECK(c.rope_style == RopeStyle::neox);
    CHECK(c.ffn_act == FfnActivation::silu);
    CHECK_FALSE(c.pre_norms);
    CHECK(c.post_norms);
    CHECK(c.qk_norm);
    CHECK(c.qk_norm_whole);
    CHECK_FALSE(c.tied_output);
    CHECK(c.embed_scale == 1.0f);
    CHECK(c.residual_scale == 1.0f);
    CHECK(c.logit_scale == 1.0f);
    CHECK(c.attn_scale == doctest::Approx(0.125f));
    REQUIRE(c.n_layers == 2);
    for (const LayerConfig& l : c.layers) {
        CHECK(l.n_heads == 4);
        CHECK(l.n_kv_heads == 2);
        CHECK(l.rope_base == 500000.0f);
        CHECK(l.sliding_window == 0);
        CHECK_FALSE(l.no_rope);
    }
    // The file holds no pre-norms and whole-width q/k norms (what llama.cpp loads for olmo2).
    const GgufFile f = GgufFile::open(path);
    CHECK(f.find_tensor("blk.0.attn_norm.weight") == nullptr);
    CHECK(f.find_tensor("blk.0.ffn_norm.weight") == nullptr);
    CHECK(f.tensor("blk.0.attn_q_norm.weight").ne[0] == 4 * 64);
    CHECK(f.tensor("blk.0.attn_k_norm.weight").ne[0] == 2 * 64);
    CHECK(f.tensor("blk.0.post_attention_norm.weight").ne[0] == 256);
    CHECK(f.tensor("blk.0.post_ffw_norm.weight").ne[0] == 256);

    // OLMo 3 (olmo2 files with sliding-window layers) is refused in one line; a window of 0 is none.
    const std::string swa = test::rewrite_gguf(dir, path, "swa.gguf", [](GgufWriter& w) {
        w.set("olmo2.attention.sliding_window", GgufValue::make_u32(4096));
    });
    CHECK(config_error(swa) == "metadata olmo2.attention.sliding_window: value 4096: sliding-window layers (OLMo 3) "
                               "are not supported yet");
    const std::string no_swa = test::rewrite_gguf(dir, path, "no-swa.gguf", [](GgufWriter& w) {
        w.set("olmo2.attention.sliding_window", GgufValue::make_u32(0));
    });
    CHECK(error_of([&] { config_of(no_swa); }).empty());
    CHECK(config_of(no_swa).layers[0].sliding_window == 0);
}

TEST_CASE("backend factory, KV type names, block KV types need head dims of 32") {
    std::string note;
    std::string why_no_gpu;
    const bool gpu = !list_cuda_devices(&why_no_gpu).empty();
    auto be = make_backend("auto", CpuOptions{}, &note);
    CHECK(be->device_kind() == (gpu ? DeviceKind::cuda : DeviceKind::cpu));
    // Why no GPU was taken, in a build that could have taken one.
    if (cuda_compiled() && !gpu) CHECK(note == "device auto: " + why_no_gpu + "; running on the cpu");
    if (!cuda_compiled()) CHECK(note.empty());
    CHECK(make_backend("cpu", CpuOptions{}, &note)->device_kind() == DeviceKind::cpu);
    CHECK(note.empty());
    CHECK(error_of([] { make_backend("tpu"); }).find("auto, cpu, cuda") != std::string::npos);
    if (!cuda_compiled()) {
        CHECK(error_of([] { make_backend("cuda"); }).find("built without CUDA") != std::string::npos);
        CHECK_THROWS_AS(make_backend("cuda"), DeviceUnavailable);
    } else if (!gpu) {
        CHECK(error_of([] { make_backend("cuda:1"); }) == "device cuda:1: " + why_no_gpu);
        CHECK_THROWS_AS(make_backend("cuda"), GpuUnavailable);
    }
    CHECK_THROWS_AS(make_backend("cuda:x"), DeviceUnavailable);

    for (KvType t : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3})
        CHECK(kv_type_from_name(kv_type_name(t)) == t);
    CHECK_THROWS_AS(kv_type_from_name("f64"), UsageError);

    if (!test::shared_available()) return;
    const Model m = load_model(test::shared_path("models/gguf/stories260K-f32.gguf").string());
    CpuBackend cpu(CpuOptions{1});
    // stories260K's head dim is 8: the block formats (32 per block) refuse it, with the numbers.
    CHECK(error_of([&] {
              cpu.load(m.config, m.weights, RunOptions{64, KvType::q8_0});
          }).find("KV type q8_0 needs head dimensions that are multiples of 32") != std::string::npos);
    CHECK_THROWS_AS(cpu.load(m.config, m.weights, RunOptions{64, KvType::q8_0}), KvHeadDimsUnfit);
    CHECK_THROWS_AS(cpu.load(m.config, m.weights, RunOptions{64, KvType::f8_e4m3}), UsageError);
    cpu.load(m.config, m.weights, RunOptions{8, KvType::bf16});
    const std::vector<int32_t> toks = {1, 403, 407};
    cpu.forward(ForwardBatch{toks, 0, LogitsWanted::last});
    CHECK(cpu.n_past() == 3);
    CHECK(cpu.n_logit_rows() == 1);
    CHECK_THROWS_AS(cpu.logits(1), UsageError);
    const std::vector<int32_t> too_many(6, 1);
    CHECK(error_of([&] {
              cpu.forward(ForwardBatch{too_many, 3, LogitsWanted::last});
          }).find("do not fit the context of 8") != std::string::npos);
    const std::vector<int32_t> bad_tok = {512};
    CHECK_THROWS_AS(cpu.forward(ForwardBatch{bad_tok, 3, LogitsWanted::last}), UsageError);
}

TEST_CASE("gemma4: the layer pattern array, local head sizes and rope, shared KV, per-layer inputs, the forward") {
    test::TempDir dir;
    const std::string path = synth_f32(dir, "tiny-gemma4");
    const ModelConfig c = config_of(path);
    CHECK(c.arch == Arch::gemma4);
    CHECK(c.attn_scale == 1.0f);
    CHECK(c.final_softcap == 30.0f);
    CHECK(c.v_norm);
    CHECK(c.per_layer_dim == 64);
    CHECK(c.embed_scale == doctest::Approx(std::sqrt(256.0f)));
    CHECK(c.rope_freq_factors);
    CHECK(c.shares_kv());
    CHECK_FALSE(c.uniform_head_dims());
    for (int32_t l = 0; l < 8; ++l) {
        CAPTURE(l);
        const LayerConfig& lc = c.layers[size_t(l)];
        const bool local = (l + 1) % 4 != 0;
        CHECK(lc.sliding_window == (local ? 16 : 0));
        CHECK(c.head_dim_of(l) == (local ? 64 : 128));
        CHECK(c.n_rot_of(l) == (local ? 64 : 128));
        CHECK(lc.rope_base == (local ? 10000.0f : 1000000.0f));
        CHECK(lc.no_freq_factors == local);
        CHECK(lc.kv_source == (l < 4 ? -1 : local ? 2 : 3));
    }
    // The KV of the shared layers is not allocated: 4 of 8 layers, 2 heads of 64 (local) or 128 (global), f16.
    CHECK(kv_bytes_per_position(c, KvType::f16) == uint64_t{2} * 2 * 2 * (3 * 64 + 128));

    // The forward: finite logits, and a token's logits the same whether it comes alone or in a prefill.
    const Model m = load_model(path);
    CpuBackend b;
    RunOptions o;
    o.n_ctx = 64;
    o.kv_type = KvType::f32;
    b.load(m.config, m.weights, o);
    std::vector<int32_t> tokens;
    for (int32_t i = 0; i < 24; ++i) tokens.push_back(1 + (i * 37) % 500);
    ForwardBatch all;
    all.tokens = tokens;
    all.wanted = LogitsWanted::all;
    b.forward(all);
    const std::vector<float> last(b.logits(23).begin(), b.logits(23).end());
    for (float v : last) REQUIRE(std::isfinite(v));
    b.kv_truncate(0);
    for (int32_t i = 0; i < 24; ++i) {
        ForwardBatch one;
        one.tokens = std::span<const int32_t>(&tokens[size_t(i)], 1);
        one.pos0 = i;
        b.forward(one);
    }
    const std::span<const float> step = b.logits(0);
    for (size_t v = 0; v < last.size(); ++v) CHECK(step[v] == doctest::Approx(last[v]).epsilon(1e-3));

    // A snapshot holds each layer's rows in its own head size: restored into another backend, the next token's
    // logits are the same bits.
    const KvSnapshot snap = b.kv_save(24);
    CpuBackend b2;
    b2.load(m.config, m.weights, o);
    b2.kv_load(snap);
    const int32_t next = 7;
    ForwardBatch more;
    more.tokens = std::span<const int32_t>(&next, 1);
    more.pos0 = 24;
    b.forward(more);
    b2.forward(more);
    const std::span<const float> x1 = b.logits(0), x2 = b2.logits(0);
    CHECK(std::equal(x1.begin(), x1.end(), x2.begin()));
}

TEST_CASE("gemma4's metadata and tensors refused in one line: shared KV of the wrong kind, a short pattern, no attn_k") {
    test::TempDir dir;
    const std::string path = synth_f32(dir, "tiny-gemma4");
    // 3 shared layers: layer 5 (local) would read layer 3, a global one.
    const std::string three = test::rewrite_gguf(dir, path, "shared3.gguf", [](GgufWriter& w) {
        w.set("gemma4.attention.shared_kv_layers", GgufValue::make_u32(3));
    });
    CHECK(config_error(three) == "metadata gemma4.attention.shared_kv_layers: layer 5 would read the KV of layer 3, "
                                 "which is not of its kind (sliding-window or global)");
    const std::string short_pattern = test::rewrite_gguf(dir, path, "pattern.gguf", [](GgufWriter& w) {
        w.set("gemma4.attention.sliding_window_pattern",
              GgufValue::make_array(GgufType::boolean, {GgufValue::make_bool(true), GgufValue::make_bool(false)}));
    });
    CHECK(config_error(short_pattern) ==
          "metadata gemma4.attention.sliding_window_pattern: expected an array of 8 bools (one per layer)");
    // attn_k may be left out on a layer on shared KV, not on one with its own.
    const std::string no_k5 = test::rewrite_zeroing(dir, path, "no-k5.gguf", [](GgufWriter&) {}, {},
                                                    [](const std::string& n) { return n == "blk.5.attn_k.weight"; });
    CHECK(test::load_error(no_k5).empty());
    const std::string no_k1 = test::rewrite_zeroing(dir, path, "no-k1.gguf", [](GgufWriter&) {}, {},
                                                    [](const std::string& n) { return n == "blk.1.attn_k.weight"; });
    CHECK(test::load_error(no_k1).find("tensor 'blk.1.attn_k.weight' is missing (layer 1 has its own KV)") !=
          std::string::npos);
}

} // namespace tern
