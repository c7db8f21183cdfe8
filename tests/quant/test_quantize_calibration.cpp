// Calibration statistics for `tern quantize --calibrate` (engine/quantize/importance.h, calibration.h):
// the ForwardObserver hook of the CPU backend (what it reports, and that watching changes no logit), the
// ImportanceObserver's sums against a direct computation, and the chunked, split collection.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/cpu/backend_cpu.h"
#include "engine/model.h"
#include "engine/quantize/calibration.h"
#include "engine/quantize/importance.h"
#include "engine/text/tokenizer.h"
#include "kernels/cpu/ops.h"
#include "quant/reference.h"
#include "tests/fake_backend.h"
#include "tests/test_support.h"

namespace tern {
namespace {

std::string gguf(const std::string& name) { return test::shared_path("models/gguf/" + name + ".gguf").string(); }

// Every call the forward makes, with a copy of its input.
struct Recorder final : ForwardObserver {
    struct Call {
        int32_t layer;
        ProjectionInput which;
        int64_t n_rows, width;
        std::vector<float> x;
    };
    std::vector<Call> calls;
    void matmul_input(int32_t layer, ProjectionInput which, const float* x, int64_t n_rows, int64_t width) override {
        calls.push_back({layer, which, n_rows, width, std::vector<float>(x, x + n_rows * width)});
    }
};

std::unique_ptr<CpuBackend> cpu_backend(const Model& m, bool exact, KvType kv = KvType::f32, int32_t n_ctx = 64) {
    CpuOptions cpu;
    cpu.n_threads = 2;
    cpu.exact_matmul = exact;
    auto be = std::make_unique<CpuBackend>(cpu);
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_type = kv;
    be->load(m.config, m.weights, run);
    return be;
}

std::vector<float> all_logits(CpuBackend& be, int rows) {
    std::vector<float> out;
    for (int r = 0; r < rows; ++r) {
        const std::span<const float> l = be.logits(r);
        out.insert(out.end(), l.begin(), l.end());
    }
    return out;
}

const std::vector<int32_t> kTokens = {1, 403, 407, 261, 378, 429, 285, 300, 322, 265};

// A text of a few thousand tokens for the collection tests.
std::string story_text(size_t bytes) {
    std::string t = test::read_file(test::shared_path("data/tinystories/cs336-tinystories_sample.txt"));
    return t.substr(0, bytes);
}

} // namespace

TEST_CASE("the CPU forward reports each projection group's input once per layer, then the lm_head's") {
    if (!test::shared_available()) return;
    const Model m = load_model(gguf("stories260K-f32"));
    auto be = cpu_backend(m, true);
    Recorder rec;
    be->set_observer(&rec);
    be->forward(ForwardBatch{kTokens, 0, LogitsWanted::all});
    const ModelConfig& c = m.config;
    const int64_t n = static_cast<int64_t>(kTokens.size());
    REQUIRE(rec.calls.size() == static_cast<size_t>(4 * c.n_layers + 1));
    for (int32_t l = 0; l < c.n_layers; ++l) {
        const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
        const Recorder::Call* call = &rec.calls[static_cast<size_t>(4 * l)];
        const ProjectionInput order[] = {ProjectionInput::attn_qkv, ProjectionInput::attn_output,
                                         ProjectionInput::ffn_gate_up, ProjectionInput::ffn_down};
        const int64_t widths[] = {c.dim, lc.n_heads * c.head_dim_v, c.dim, lc.ffn_dim};
        for (int k = 0; k < 4; ++k) {
            CHECK(call[k].layer == l);
            CHECK(call[k].which == order[k]);
            CHECK(call[k].n_rows == n);
            CHECK(call[k].width == widths[k]);
        }
    }
    CHECK(rec.calls.back().which == ProjectionInput::lm_head);
    CHECK(rec.calls.back().layer == -1);
    CHECK(rec.calls.back().n_rows == n);

    // Layer 0's q/k/v input is RMSNorm(embedding) * attn_norm, computed here directly.
    std::vector<float> embd(static_cast<size_t>(c.dim)), norm(embd.size()), expect(embd.size());
    dequantize_row(m.weights.layers[0].attn_norm.type, m.weights.layers[0].attn_norm.data, norm.data(), c.dim);
    for (int64_t i = 0; i < n; ++i) {
        dequantize_row(m.weights.token_embd.type, m.weights.token_embd.row(kTokens[static_cast<size_t>(i)]), embd.data(), c.dim);
        rmsnorm_f32(embd.data(), norm.data(), expect.data(), c.dim, c.rms_eps);
        for (int64_t d = 0; d < c.dim; ++d) CHECK(rec.calls[0].x[static_cast<size_t>(i * c.dim + d)] == expect[static_cast<size_t>(d)]);
    }

    // Only the kept rows reach the lm_head.
    rec.calls.clear();
    be->kv_truncate(0);
    be->forward(ForwardBatch{kTokens, 0, LogitsWanted::last});
    CHECK(rec.calls.back().n_rows == 1);
}

TEST_CASE("an observer changes no logit, in either matmul mode, and a null one is the plain forward") {
    if (!test::shared_available()) return;
    for (const char* name : {"stories260K-q4_k_m", "llama2xs-tok512-f16"}) {
        const Model m = load_model(gguf(name));
        for (bool exact : {false, true}) {
            CAPTURE(name);
            CAPTURE(exact);
            const int rows = static_cast<int>(kTokens.size());
            auto plain = cpu_backend(m, exact, KvType::f16);
            plain->forward(ForwardBatch{kTokens, 0, LogitsWanted::all});
            auto watched = cpu_backend(m, exact, KvType::f16);
            Recorder rec;
            watched->set_observer(&rec);
            watched->forward(ForwardBatch{kTokens, 0, LogitsWanted::all});
            CHECK(all_logits(*watched, rows) == all_logits(*plain, rows));
            watched->set_observer(nullptr);
            const size_t seen = rec.calls.size();
            watched->kv_truncate(0);
            watched->forward(ForwardBatch{kTokens, 0, LogitsWanted::all});
            CHECK(rec.calls.size() == seen);
            CHECK(all_logits(*watched, rows) == all_logits(*plain, rows));
        }
    }
}

TEST_CASE("a backend without observer support refuses an observer but accepts none") {
    // FakeBackendBase leaves set_observer to Backend's default, as a backend without observer support does.
    struct Bare final : test::FakeBackendBase {
        void forward(const ForwardBatch&) override {}
        std::span<const float> logits(int) override { return {}; }
        void argmax(std::span<int32_t>) override {}
    } bare;
    Recorder rec;
    CHECK_NOTHROW(bare.set_observer(nullptr));
    CHECK_THROWS_AS(bare.set_observer(&rec), RuntimeFailure);
}

TEST_CASE("ImportanceObserver: mean squares per column, second moments, shared inputs and tied names") {
    ModelWeights w;
    w.layers.resize(1);
    LayerWeights& lw = w.layers[0];
    lw.wq.name = "blk.0.attn_q.weight";
    lw.wk.name = "blk.0.attn_k.weight";
    lw.wv.name = "blk.0.attn_v.weight";
    lw.wo.name = "blk.0.attn_output.weight";
    lw.w_gate.name = "blk.0.ffn_gate.weight";
    lw.w_up.name = "blk.0.ffn_up.weight";
    lw.w_down.name = "blk.0.ffn_down.weight";
    w.output.name = "token_embd.weight";   // a tied output is the embedding

    ImportanceObserver obs(w, true);
    const float a[] = {1, 2, 3, -1, 0, 2};   // two rows of width 3
    const float b[] = {4, -2};               // one row of width 2
    obs.matmul_input(0, ProjectionInput::attn_qkv, a, 2, 3);
    obs.matmul_input(0, ProjectionInput::ffn_down, b, 1, 2);
    obs.matmul_input(0, ProjectionInput::ffn_down, b, 1, 2);
    obs.matmul_input(-1, ProjectionInput::lm_head, a, 2, 3);
    const ImportanceMatrix im = obs.finish();

    CHECK(im.tokens == 2);   // counted at the lm_head
    // Sums over the reported rows, divided by the tokens.
    CHECK(im.columns.at("blk.0.attn_q.weight") == std::vector<float>{1.0f, 2.0f, 6.5f});   // (1+1, 4+0, 9+4) / 2
    CHECK(im.columns.at("blk.0.attn_k.weight") == im.columns.at("blk.0.attn_q.weight"));
    CHECK(im.columns.at("blk.0.attn_v.weight") == im.columns.at("blk.0.attn_q.weight"));
    CHECK(im.columns.at("blk.0.ffn_down.weight") == std::vector<float>{16.0f, 4.0f});   // (16+16, 4+4) / 2
    CHECK(im.columns.at("token_embd.weight") == im.columns.at("blk.0.attn_q.weight"));
    CHECK(im.columns.at("blk.0.ffn_up.weight").empty());   // gate never reported: up shares its (empty) statistics
    // x x^T: rows (1,2,3) and (-1,0,2).
    CHECK(im.moments.at("blk.0.attn_q.weight") == std::vector<float>{1, 1, 0.5f, 1, 2, 3, 0.5f, 3, 6.5f});
    CHECK(im.moments.count("blk.0.attn_k.weight") == 0);
    CHECK(im.moments_of("blk.0.attn_k.weight") == &im.moments.at("blk.0.attn_q.weight"));
    CHECK(im.moments_of("blk.0.ffn_up.weight") == nullptr);
    CHECK(im.moment_owner.at("blk.0.ffn_up.weight") == "blk.0.ffn_gate.weight");

    ImportanceObserver diagonal(w, false);
    diagonal.matmul_input(0, ProjectionInput::attn_qkv, a, 2, 3);
    const ImportanceMatrix d = diagonal.finish();
    CHECK(d.moments.empty());
    CHECK(d.tokens == 0);
    CHECK(d.columns.at("blk.0.attn_q.weight") == std::vector<float>{2.0f, 4.0f, 13.0f});   // no tokens counted: sums kept
}

TEST_CASE("collect_importance: every matrix, chunked with BOS, the same for any thread count") {
    if (!test::shared_available()) return;
    const Model m = load_model(gguf("stories260K-f32"));
    const auto tok = Tokenizer::from_gguf(m.file);
    const std::vector<int32_t> tokens = tok->encode(story_text(1500), EncodeOptions{true, false});
    REQUIRE(tokens.size() > 300);
    const int32_t n_ctx = 128;
    const ImportanceMatrix one = collect_importance(m, tokens, n_ctx, tok->bos(), 1, true);
    const ImportanceMatrix three = collect_importance(m, tokens, n_ctx, tok->bos(), 3, true);
    CHECK(one.columns == three.columns);
    CHECK(one.moments == three.moments);
    // A last chunk of a single token is skipped.
    const size_t last = tokens.size() % n_ctx;
    CHECK(one.tokens == static_cast<int64_t>(last == 1 ? tokens.size() - 1 : tokens.size()));
    for (const LayerWeights& lw : m.weights.layers)
        for (const WeightRef* w : {&lw.wq, &lw.wk, &lw.wv, &lw.wo, &lw.w_gate, &lw.w_up, &lw.w_down}) {
            CAPTURE(w->name);
            REQUIRE(one.columns.count(w->name) == 1);
            CHECK(static_cast<int64_t>(one.columns.at(w->name).size()) == w->n_in());
            CHECK(one.moments_of(w->name) != nullptr);
        }
    CHECK(one.columns.count(m.weights.output.name) == 1);

    // The first chunk alone, evaluated as one causal sequence from BOS: its lm_head input's mean squares.
    const std::vector<int32_t> first(tokens.begin(), tokens.begin() + n_ctx);
    const ImportanceMatrix chunk = collect_importance(m, first, n_ctx, tok->bos(), 2);
    auto be = cpu_backend(m, true, KvType::f32, n_ctx);   // what collect_importance runs
    Recorder rec;
    be->set_observer(&rec);
    std::vector<int32_t> with_bos = first;
    with_bos[0] = tok->bos();
    be->forward(ForwardBatch{with_bos, 0, LogitsWanted::all});
    const Recorder::Call& head = rec.calls.back();
    std::vector<float> expect(static_cast<size_t>(head.width), 0.0f);
    for (int64_t r = 0; r < head.n_rows; ++r)
        for (int64_t i = 0; i < head.width; ++i) expect[static_cast<size_t>(i)] += head.x[static_cast<size_t>(r * head.width + i)] * head.x[static_cast<size_t>(r * head.width + i)];
    for (float& e : expect) e /= static_cast<float>(n_ctx);
    CHECK(chunk.columns.at(m.weights.output.name) == expect);
}

TEST_CASE("collect_importance_split: alternate chunks to fit and check, `all` their token-weighted mean") {
    if (!test::shared_available()) return;
    const Model m = load_model(gguf("stories260K-f32"));
    const auto tok = Tokenizer::from_gguf(m.file);
    const std::vector<int32_t> tokens = tok->encode(story_text(2000), EncodeOptions{true, false});
    const int32_t n_ctx = 128;
    REQUIRE(tokens.size() > 3 * n_ctx);
    const SplitImportance s = collect_importance_split(m, tokens, n_ctx, tok->bos(), 2, true);
    std::vector<int32_t> odd;
    for (size_t start = n_ctx; start < tokens.size(); start += 2 * n_ctx)
        odd.insert(odd.end(), tokens.begin() + static_cast<int64_t>(start),
                   tokens.begin() + static_cast<int64_t>(std::min(tokens.size(), start + n_ctx)));
    CHECK(s.check_tokens == odd);
    CHECK(s.bos == tok->bos());
    CHECK(s.all.tokens == s.fit.tokens + s.check.tokens);
    CHECK(!s.fit.moments.empty());
    CHECK(!s.check.moments.empty());
    // `all` is the whole text's statistics up to rounding.
    const ImportanceMatrix whole = collect_importance(m, tokens, n_ctx, tok->bos(), 2);
    CHECK(whole.tokens == s.all.tokens);
    for (const auto& [name, v] : whole.columns) {
        CAPTURE(name);
        const std::vector<float>& mixed = s.all.columns.at(name);
        REQUIRE(mixed.size() == v.size());
        for (size_t i = 0; i < v.size(); ++i) CHECK(mixed[i] == doctest::Approx(v[i]).epsilon(1e-4));
    }
    const SplitImportance no_moments = collect_importance_split(m, tokens, n_ctx, tok->bos(), 2, false);
    CHECK(no_moments.fit.moments.empty());
    CHECK(no_moments.all.moments.empty());
    CHECK(no_moments.check.moments == s.check.moments);   // the check half always has them
}

TEST_CASE("calibrate_model: chunk length from the model, a short text refused by its name") {
    if (!test::shared_available()) return;
    const Calibration c = calibrate_model(gguf("stories260K-f32"), story_text(1500), "story.txt", 2, false);
    CHECK(c.n_ctx == 128);   // the model's training context, below 512
    CHECK(c.importance.all.tokens > 0);
    CHECK(c.importance.check_n_ctx == std::min<int32_t>(128, static_cast<int32_t>(c.importance.check_tokens.size() / 2)));
    try {
        calibrate_model(gguf("stories260K-f32"), "Once upon a time.", "short.txt", 2, false);
        FAIL("a short text was accepted");
    } catch (const InputError& e) {
        CHECK(std::string(e.what()).starts_with("short.txt: the calibration text is too short ("));
    }
}

} // namespace tern
