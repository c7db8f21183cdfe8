// Session on small fakes (a counting "model" and a table tokenizer), so the
// stop rules, prefix reuse and chunked prefill are checked independently of any real model; then
// the same on the real stories260K model. `tern run` end to end is in test_cli_run.cpp.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fake_backend.h"
#include "engine/backend_factory.h"
#include "engine/model.h"
#include "engine/generation/sampler.h"
#include "engine/generation/session.h"
#include "engine/logit_candidates.h"
#include "base/error.h"
#include "tests/fake_tokenizer.h"
#include "tests/test_support.h"

using namespace tern;

namespace {

// A flat, tie-rich row that depends on the last token and the position, with EOS (2) impossible: sampling
// from it is a real draw.
std::vector<float> spread_logits(int32_t last, int32_t n_past, int32_t vocab) {
    std::vector<float> l(static_cast<size_t>(vocab));
    for (int32_t i = 0; i < vocab; ++i)
        l[static_cast<size_t>(i)] = static_cast<float>((last * 7 + i * 5 + n_past * 3) % 6) * 0.5f;
    l[2] = -INFINITY;
    return l;
}

// Next token = (last token + 1) mod vocab, except that `jumps` can redirect a token.
// Records every forward so tests can see what was prefilled.
class FakeBackend : public test::FakeBackendBase {
public:
    struct Call {
        int32_t pos0;
        std::vector<int32_t> tokens;
    };
    int32_t vocab = 16;
    std::map<int32_t, int32_t> jumps;
    std::vector<Call> calls;
    int32_t n_ctx = 64;
    bool spread = false;   // logits from spread_logits() instead of one peak
    int logits_calls = 0, top_logits_calls = 0;

    void forward(const ForwardBatch& b) override {
        if (b.pos0 != n_past_) throw std::logic_error("forward at the wrong position");
        if (b.pos0 + static_cast<int32_t>(b.tokens.size()) > n_ctx) throw std::logic_error("past the context");
        calls.push_back({b.pos0, std::vector<int32_t>(b.tokens.begin(), b.tokens.end())});
        n_past_ += static_cast<int32_t>(b.tokens.size());
        const int32_t last = b.tokens.back();
        auto it = jumps.find(last);
        const int32_t next = it != jumps.end() ? it->second : (last + 1) % vocab;
        logits_.assign(static_cast<size_t>(vocab), 0.0f);
        logits_[static_cast<size_t>(next)] = 10.0f;
        if (spread) logits_ = spread_logits(last, n_past_, vocab);
    }
    std::span<const float> logits(int) override {
        ++logits_calls;
        return logits_;
    }
    size_t top_logits(int, const LogitPenalties& penalties, std::span<LogitCandidate> out) override {
        ++top_logits_calls;
        return select_top_logits(logits_, penalties, out);
    }
    // Scanned where the row is, as a GPU backend does (CudaBackend::scan_logits): not a copy of the row.
    FloatScan scan_logits(int) override { return scan_floats(logits_); }
    void argmax(std::span<int32_t> per_row) override {
        int32_t best = 0;
        for (int32_t i = 1; i < vocab; ++i)
            if (logits_[static_cast<size_t>(i)] > logits_[static_cast<size_t>(best)]) best = i;
        per_row[0] = best;
    }

private:
    std::vector<float> logits_;
};

using tern::test::FakeTokenizer;

std::vector<std::string> letters() {
    // 0..15: "", BOS, EOS, then "a".."m"
    std::vector<std::string> p = {"", "", ""};
    for (char c = 'a'; c <= 'm'; ++c) p.push_back(std::string(1, c));
    return p;
}

struct Fixture {
    FakeBackend* backend;
    std::unique_ptr<Session> session;
    explicit Fixture(int32_t n_ctx = 64, std::vector<std::string> pieces = letters()) {
        auto b = std::make_unique<FakeBackend>();
        b->n_ctx = n_ctx;
        backend = b.get();
        session = std::make_unique<Session>(std::move(b), std::make_unique<FakeTokenizer>(std::move(pieces)), n_ctx);
    }
};

GenerateOptions greedy(int32_t n_predict) {
    GenerateOptions o;
    o.n_predict = n_predict;
    o.sampling.temp = 0.0f;
    return o;
}

} // namespace

TEST_CASE("greedy generation follows the model, streams text and honours -n") {
    Fixture fx;
    const std::vector<int32_t> prompt = {1, 3};
    std::string streamed;
    const GenerateResult r =
        fx.session->generate(prompt, greedy(5), [&](std::string_view s) { streamed += s; return true; });
    CHECK(r.tokens == std::vector<int32_t>{4, 5, 6, 7, 8});
    CHECK(r.text == "bcdef");
    CHECK(streamed == r.text);
    CHECK(r.stop_reason == StopReason::length);
    CHECK(r.n_prompt() == 2);
    CHECK(r.n_gen() == 5);
    // The last sampled token is not forwarded: the KV holds the prompt and 4 generated tokens.
    CHECK(fx.session->kv_tokens() == std::vector<int32_t>{1, 3, 4, 5, 6, 7});
    CHECK(fx.backend->n_past() == 6);
}

TEST_CASE("-n 0 generates nothing") {
    Fixture fx;
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3}, greedy(0));
    CHECK(r.tokens.empty());
    CHECK(r.stop_reason == StopReason::length);
}

TEST_CASE("an end-of-generation token stops and is not part of the output") {
    Fixture fx;
    fx.backend->jumps[5] = 2;   // after "c" comes EOS
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3}, greedy(-1));
    CHECK(r.tokens == std::vector<int32_t>{4, 5});
    CHECK(r.text == "bc");
    CHECK(r.stop_reason == StopReason::eos);
}

TEST_CASE("logprobs: one entry per generated token, from the raw row, the end-of-generation token excluded") {
    Fixture fx;
    fx.backend->jumps[6] = 2;   // after "d" comes EOS
    GenerateOptions o = greedy(-1);
    o.logprobs = 3;
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3}, o);
    REQUIRE(r.tokens == std::vector<int32_t>{4, 5, 6});
    REQUIRE(r.logprobs.size() == r.tokens.size());
    // One logit of 10 among 16 zeros: log(e^10 / (e^10 + 15)).
    const double peak = 10.0 - std::log(std::exp(10.0) + 15.0), rest = -std::log(std::exp(10.0) + 15.0);
    for (size_t i = 0; i < r.tokens.size(); ++i) {
        CAPTURE(i);
        CHECK(r.logprobs[i].token == r.tokens[i]);
        CHECK(r.logprobs[i].logprob == doctest::Approx(peak));
        REQUIRE(r.logprobs[i].top.size() == 3);
        CHECK(r.logprobs[i].top[0].id == r.tokens[i]);
        CHECK(r.logprobs[i].top[1].logprob == doctest::Approx(rest));
        CHECK(r.logprobs[i].top[1].id == (r.tokens[i] == 0 ? 1 : 0));   // ties: the lowest id first
    }
    // Off (the default): nothing recorded, and the greedy path reads no logit row.
    Fixture off;
    off.backend->jumps[6] = 2;
    const GenerateResult plain = off.session->generate(std::vector<int32_t>{1, 3}, greedy(-1));
    CHECK(plain.tokens == r.tokens);
    CHECK(plain.logprobs.empty());
    CHECK(off.backend->logits_calls == 0);
}

TEST_CASE("a stop string ends generation and is trimmed, even across tokens") {
    Fixture fx;
    GenerateOptions o = greedy(20);
    o.stop = {"def"};
    std::string streamed;
    const GenerateResult r =
        fx.session->generate(std::vector<int32_t>{1, 3}, o, [&](std::string_view s) { streamed += s; return true; });
    CHECK(r.text == "bc");
    CHECK(streamed == "bc");
    CHECK(r.stop_reason == StopReason::stop);
    CHECK(r.tokens == std::vector<int32_t>{4, 5, 6, 7, 8});   // the ids of the stop string are kept
}

TEST_CASE("a stop string that never completes is printed in full at the end") {
    Fixture fx;
    GenerateOptions o = greedy(3);
    o.stop = {"cdX"};
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3}, o);
    CHECK(r.text == "bcd");
    CHECK(r.stop_reason == StopReason::length);
}

TEST_CASE("the end of the context stops generation") {
    Fixture fx(8);
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3, 4}, greedy(-1));
    // 8 positions: the prompt's 3 and 5 generated tokens fill them; one more is sampled from the
    // last position's logits.
    CHECK(r.n_gen() == 6);
    CHECK(r.stop_reason == StopReason::context);
    CHECK(fx.backend->n_past() == 8);
}

TEST_CASE("a prompt longer than the context is a usage error naming both numbers") {
    Fixture fx(4);
    const std::vector<int32_t> prompt = {1, 3, 4, 5, 6};
    try {
        fx.session->generate(prompt, greedy(1));
        FAIL("no exception");
    } catch (const UsageError& e) {
        const std::string m = e.what();
        CHECK(m.find("5 tokens") != std::string::npos);
        CHECK(m.find("context is 4") != std::string::npos);
    }
    CHECK_THROWS_AS(fx.session->generate(std::vector<int32_t>{}, greedy(1)), UsageError);
    // Exactly the context: allowed, one token can still be sampled.
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3, 4, 5}, greedy(-1));
    CHECK(r.n_gen() == 1);
    CHECK(r.stop_reason == StopReason::context);
}

TEST_CASE("the prompt is prefilled in chunks") {
    Fixture fx;
    GenerateOptions o = greedy(1);
    o.prefill_chunk = 4;
    const std::vector<int32_t> prompt = {1, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    fx.session->generate(prompt, o);
    REQUIRE(fx.backend->calls.size() == 3);
    CHECK(fx.backend->calls[0].tokens.size() == 4);
    CHECK(fx.backend->calls[1].pos0 == 4);
    CHECK(fx.backend->calls[2].tokens.size() == 2);
}

TEST_CASE("a second prompt sharing a prefix reuses the KV cache") {
    Fixture fx;
    const GenerateResult first = fx.session->generate(std::vector<int32_t>{1, 3, 4}, greedy(3));
    CHECK(first.n_reused == 0);
    CHECK(first.n_prefilled == 3);
    fx.backend->calls.clear();
    // The conversation so far plus a new turn: everything in the KV is reused.
    std::vector<int32_t> next = {1, 3, 4, 5, 6, 7, 9, 10};
    const GenerateResult second = fx.session->generate(next, greedy(2));
    CHECK(second.n_reused == 5);   // 1 3 4 5 6 were in the KV (7 was sampled, never forwarded)
    CHECK(second.n_prefilled == 3);
    REQUIRE(!fx.backend->calls.empty());
    CHECK(fx.backend->calls[0].pos0 == 5);
    CHECK(second.tokens == std::vector<int32_t>{11, 12});

    // A diverging prompt truncates back to the common prefix.
    fx.backend->calls.clear();
    const GenerateResult third = fx.session->generate(std::vector<int32_t>{1, 3, 9}, greedy(1));
    CHECK(third.n_reused == 2);
    CHECK(fx.backend->calls[0].pos0 == 2);
    CHECK(third.tokens == std::vector<int32_t>{10});

    // The same prompt again: all but its last token are reused, whose logits are needed.
    fx.backend->calls.clear();
    const GenerateResult again = fx.session->generate(std::vector<int32_t>{1, 3, 9}, greedy(1));
    CHECK(again.n_reused == 2);
    CHECK(again.tokens == std::vector<int32_t>{10});

    fx.session->reset();
    CHECK(fx.backend->n_past() == 0);
    CHECK(fx.session->generate(std::vector<int32_t>{1, 3, 9}, greedy(1)).n_reused == 0);
}

TEST_CASE("a Session reuses no more of its tokens than the backend still holds (another user emptied it)") {
    Fixture fx;
    fx.session->generate(std::vector<int32_t>{1, 3, 4}, greedy(3));
    REQUIRE(fx.session->kv_tokens().size() == 5);
    // A batching engine on the same backend (engine/batch/batch_engine.h) empties its cache.
    fx.backend->kv_truncate(0);
    fx.backend->calls.clear();
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3, 4, 5}, greedy(1));
    CHECK(r.n_reused == 0);
    CHECK(r.n_prefilled == 4);
    REQUIRE(!fx.backend->calls.empty());
    CHECK(fx.backend->calls[0].pos0 == 0);
    CHECK(r.tokens == std::vector<int32_t>{6});
    CHECK(fx.session->kv_tokens() == std::vector<int32_t>{1, 3, 4, 5});
}

TEST_CASE("a Session on a backend and tokenizer it borrows generates as one that owns them") {
    FakeBackend backend;
    const FakeTokenizer tokenizer(letters());
    Session borrowed(backend, tokenizer, 64, nullptr, nullptr);
    const GenerateResult r = borrowed.generate(std::vector<int32_t>{1, 3}, greedy(3));
    CHECK(r.tokens == std::vector<int32_t>{4, 5, 6});
    CHECK(r.text == "bcd");
    CHECK(&borrowed.backend() == &backend);
    CHECK(borrowed.model() == nullptr);
    CHECK(borrowed.prefix_cache() == nullptr);
    CHECK(backend.n_past() == 4);
}

TEST_CASE("the cancel flag stops before the next step") {
    Fixture fx;
    std::atomic<bool> cancel{false};
    GenerateOptions o = greedy(100);
    o.cancel = &cancel;
    int pieces = 0;
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3}, o, [&](std::string_view) {
        if (++pieces == 3) cancel = true;
        return true;
    });
    CHECK(r.n_gen() == 3);
    CHECK(r.text == "bcd");
    CHECK(r.stop_reason == StopReason::cancelled);
}

TEST_CASE("a callback returning false (closed stdout) stops generation") {
    Fixture fx;
    int calls = 0;
    const GenerateResult r = fx.session->generate(std::vector<int32_t>{1, 3}, greedy(100), [&](std::string_view) {
        ++calls;
        return false;
    });
    CHECK(calls == 1);
    CHECK(r.n_gen() == 1);
    CHECK(r.stop_reason == StopReason::cancelled);
}

TEST_CASE("sampling with a seed is reproducible and differs from greedy only through the RNG") {
    auto run = [](uint64_t seed) {
        Fixture fx;
        GenerateOptions o;
        o.n_predict = 10;
        o.sampling.temp = 1.0f;
        o.sampling.seed = seed;
        return fx.session->generate(std::vector<int32_t>{1, 3}, o).tokens;
    };
    CHECK(run(1) == run(1));
    // The fake model is so peaked (logit 10 vs 0, min-p 0.05) that sampling is forced.
    CHECK(run(1) == std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11, 12, 13});
}

TEST_CASE("sampling takes the backend's top candidates when top-k allows, and the tokens of the whole row") {
    const std::vector<int32_t> prompt = {1, 3};
    auto replay = [&](const SamplingParams& p, int n) {   // the sampler on each whole row, by hand
        Sampler s(p);
        std::vector<int32_t> history = prompt, out;
        for (int i = 0; i < n; ++i) {
            const auto n_past = static_cast<int32_t>(history.size());
            const int32_t t = s.sample(spread_logits(history.back(), n_past, 16), history);
            history.push_back(t);
            out.push_back(t);
        }
        return out;
    };
    struct Case {
        float temp;
        int32_t top_k;
        float repeat_penalty;
        bool candidates;   // whether the session should ask for candidates
    };
    // top-k 100 is more than the vocabulary: the candidates are all of it.
    for (const Case c : {Case{1.0f, 5, 1.0f, true}, Case{1.5f, 16, 1.3f, true}, Case{0.7f, 100, 1.3f, true},
                         Case{1.0f, 0, 1.3f, false}, Case{1.0f, kMaxTopCandidates + 1, 1.0f, false},
                         Case{0.0f, 0, 1.5f, true}}) {
        CAPTURE(c.temp);
        CAPTURE(c.top_k);
        Fixture fx;
        fx.backend->spread = true;
        GenerateOptions o;
        o.n_predict = 20;
        o.sampling.temp = c.temp;
        o.sampling.top_k = c.top_k;
        o.sampling.min_p = 0.0f;
        o.sampling.repeat_penalty = c.repeat_penalty;
        o.sampling.seed = 5;
        const GenerateResult r = fx.session->generate(prompt, o);
        CHECK(r.tokens == replay(o.sampling, 20));
        CHECK(fx.backend->top_logits_calls == (c.candidates ? 20 : 0));
        CHECK(fx.backend->logits_calls == (c.candidates ? 0 : 20));   // no row copied when candidates do
    }
}

TEST_CASE("split UTF-8 characters are held until complete") {
    std::vector<std::string> p = letters();
    // The two bytes of "é" as two tokens. (assign(1, byte): gcc 12's -Wrestrict misfires on
    // assigning a one-byte literal here.)
    p[4].assign(1, '\xC3');
    p[5].assign(1, '\xA9');
    Fixture fx(64, p);
    std::vector<std::string> pieces;
    fx.session->generate(std::vector<int32_t>{1, 3}, greedy(3), [&](std::string_view s) {
        pieces.emplace_back(s);
        return true;
    });
    REQUIRE(pieces.size() == 2);
    CHECK(pieces[0] == "\xC3\xA9");
    CHECK(pieces[1] == "d");
}

// ---------------------------------------------------------------------------------------------
// The same rules on a real model (stories260K, CPU backend): reusing a cached prefix or
// prefilling in small chunks must not change a single token.

namespace {

std::unique_ptr<Session> real_session(int32_t n_ctx) {
    auto model = std::make_shared<Model>(load_model(test::shared_path("models/gguf/stories260K-f32.gguf").string()));
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_type = KvType::f32;   // as the reference
    std::unique_ptr<Backend> backend = make_backend("cpu", CpuOptions{1});
    backend->load(model->config, model->weights, run);
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file);
    return std::make_unique<Session>(std::move(backend), std::move(tok), n_ctx, model);
}

std::vector<int32_t> reference_ids(const char* key) {
    const auto j = nlohmann::json::parse(
        test::read_file(test::shared_path("reference/stories260K-f32/once-upon-a-time.json")));
    return j[key].get<std::vector<int32_t>>();
}

} // namespace

TEST_CASE("real model: chunked prefill and prefix reuse give the reference tokens") {
    if (!test::shared_available()) return;
    const std::vector<int32_t> prompt = reference_ids("prompt_tokens");
    const std::vector<int32_t> want = reference_ids("generated_tokens");
    auto s = real_session(256);
    CHECK(s->tokenizer().encode("Once upon a time", {true, true}) == prompt);

    GenerateOptions o = greedy(64);
    o.prefill_chunk = 2;   // 5 prompt tokens in forwards of 2, 2, 1
    GenerateResult r = s->generate(prompt, o);
    CHECK(r.tokens == want);

    // Continue the story from a prompt that is the first story's prompt + 20 generated tokens:
    // 24 positions are reused and the continuation equals the reference's.
    std::vector<int32_t> longer = prompt;
    longer.insert(longer.end(), want.begin(), want.begin() + 20);
    o.prefill_chunk = 512;
    o.n_predict = 30;
    r = s->generate(longer, o);
    CHECK(r.n_reused == static_cast<int32_t>(longer.size()) - 1);
    CHECK(r.tokens == std::vector<int32_t>(want.begin() + 20, want.begin() + 50));

    // Back to a shorter prefix (KV truncated), then the same result as a fresh session.
    std::vector<int32_t> shorter(prompt.begin(), prompt.begin() + 3);
    const GenerateResult a = s->generate(shorter, greedy(16));
    CHECK(a.n_reused == 2);
    const GenerateResult b = real_session(256)->generate(shorter, greedy(16));
    CHECK(a.tokens == b.tokens);
    CHECK(a.text == b.text);
}

TEST_CASE("real model: sampling is reproducible from the seed and the stop rules hold") {
    if (!test::shared_available()) return;
    const std::vector<int32_t> prompt = reference_ids("prompt_tokens");
    GenerateOptions o;
    o.n_predict = 40;
    o.sampling.seed = 77;
    o.sampling.repeat_penalty = 1.1f;
    const GenerateResult a = real_session(128)->generate(prompt, o);
    const GenerateResult b = real_session(128)->generate(prompt, o);
    CHECK(a.tokens == b.tokens);
    CHECK(a.text == b.text);
    CHECK(a.n_gen() == 40);

    // A stop string taken from the middle of that text cuts it there.
    REQUIRE(a.text.size() > 20);
    const std::string stop = a.text.substr(10, 4);
    o.stop = {stop};
    const GenerateResult c = real_session(128)->generate(prompt, o);
    CHECK(c.stop_reason == StopReason::stop);
    CHECK(c.text == a.text.substr(0, a.text.find(stop)));
    CHECK(c.text.find(stop) == std::string::npos);
}
