// Speculative decoding: the prompt-lookup drafter as a pure unit (crafted histories, and an
// incremental index against a brute-force scan), the session's draft verification on a fake
// model (identical output, exact -n / EOS / stop / context boundaries, KV rollback, sampling with
// the same seed), then real models: greedy and sampled output with --lookup and --draft-model
// byte-identical to plain decoding, acceptance counters, a vocabulary mismatch's error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fake_backend.h"
#include "engine/backend_factory.h"
#include "engine/speculative/drafter.h"
#include "engine/speculative/drafter_model.h"
#include "engine/model.h"
#include "engine/generation/session.h"
#include "base/error.h"
#include "tests/eager_drafter.h"
#include "tests/quick_mode.h"
#include "tests/test_support.h"

using namespace tern;
using nlohmann::json;

namespace {

std::vector<int32_t> propose(PromptLookupDrafter& d, const std::vector<int32_t>& history, int32_t k) {
    std::vector<int32_t> out;
    d.lookup(history, k, out);
    return out;
}

// The definition the index must reproduce: for n = n_max down to n_min, the latest j < size whose
// n tokens before it equal the history's last n; then the tokens from j on, continuing
// periodically past the end.
std::vector<int32_t> brute_force(const std::vector<int32_t>& h, int32_t k, int32_t n_max, int32_t n_min) {
    const auto size = static_cast<int64_t>(h.size());
    for (int32_t n = n_max; n >= n_min; --n) {
        if (n > size) continue;
        for (int64_t j = size - 1; j >= n; --j) {
            bool same = true;
            for (int32_t i = 0; i < n && same; ++i)
                same = h[static_cast<size_t>(j - n + i)] == h[static_cast<size_t>(size - n + i)];
            if (!same) continue;
            std::vector<int32_t> out;
            for (int64_t m = 0; m < k; ++m)
                out.push_back(j + m < size ? h[static_cast<size_t>(j + m)] : out[static_cast<size_t>(m - (size - j))]);
            return out;
        }
    }
    return {};
}

} // namespace

TEST_CASE("prompt lookup proposes what followed the most recent earlier occurrence, longest n first") {
    PromptLookupDrafter d(8, 3);
    // "1 2 3" occurred at the start, followed by 4 9 1 2 3; past the end the copy repeats itself.
    CHECK(propose(d, {1, 2, 3, 4, 9, 1, 2, 3}, 4) == std::vector<int32_t>{4, 9, 1, 2});
    CHECK(propose(d, {1, 2, 3, 4, 9, 1, 2, 3}, 7) == std::vector<int32_t>{4, 9, 1, 2, 3, 4, 9});

    // The most recent occurrence wins: "5 6" was followed by 7, then by 8.
    PromptLookupDrafter recent(8, 2);
    CHECK(propose(recent, {5, 6, 7, 5, 6, 8, 5, 6}, 2) == std::vector<int32_t>{8, 5});

    // The longest match wins: "1 2 3" -> 7 beats the more recent "2 3" -> 8.
    PromptLookupDrafter longest(8, 3);
    CHECK(propose(longest, {1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3}, 1) == std::vector<int32_t>{7});
    // With n_max = 2 only "2 3" is tried.
    PromptLookupDrafter shorter(8, 2);
    CHECK(propose(shorter, {1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3}, 1) == std::vector<int32_t>{8});

    // No earlier occurrence of any tail: nothing.
    PromptLookupDrafter none(8, 3);
    CHECK(propose(none, {1, 2, 3, 4}, 4).empty());
    none.begin({});
    CHECK(propose(none, {}, 4).empty());
    CHECK(propose(none, {1, 1}, 0).empty()); // nothing asked for

    // n_min = 2: a single repeated token is not enough.
    PromptLookupDrafter one(8, 3, 1), two(8, 3, 2);
    CHECK(propose(one, {1, 5, 2, 1}, 3) == std::vector<int32_t>{5, 2, 1});
    CHECK(propose(two, {1, 5, 2, 1}, 3).empty());

    // A run of one token drafts more of it.
    PromptLookupDrafter run(8, 3);
    CHECK(propose(run, {7, 7, 7}, 4) == std::vector<int32_t>{7, 7, 7, 7});

    CHECK_THROWS_AS(PromptLookupDrafter(8, 2, 3), std::invalid_argument);
    CHECK_THROWS_AS(PromptLookupDrafter(8, 2, 0), std::invalid_argument);
}

TEST_CASE("prompt lookup's incremental index equals a full scan at every step") {
    std::mt19937 rng(5);
    for (int32_t alphabet : {2, 4, 9}) {
        for (int32_t n_max : {1, 3, 5}) {
            CAPTURE(alphabet);
            CAPTURE(n_max);
            const int32_t n_min = n_max > 2 ? 2 : 1;
            PromptLookupDrafter d(16, n_max, n_min);
            std::vector<int32_t> h;
            for (int i = 0; i < 6; ++i)
                h.push_back(static_cast<int32_t>(rng() % static_cast<uint32_t>(alphabet)));
            d.begin(h);
            for (int step = 0; step < 200; ++step) {
                const auto k = static_cast<int32_t>(1 + rng() % 10);
                REQUIRE(propose(d, h, k) == brute_force(h, k, n_max, n_min));
                // Grow by 1-3 tokens, half the time copied from the proposal (as accepted drafts are).
                const std::vector<int32_t> proposal = brute_force(h, 3, n_max, n_min);
                const bool copy = rng() % 2 == 0;
                const uint32_t grow = 1 + rng() % 3;
                for (uint32_t g = 0; g < grow; ++g)
                    h.push_back(copy && g < proposal.size()
                                    ? proposal[g]
                                    : static_cast<int32_t>(rng() % static_cast<uint32_t>(alphabet)));
            }
        }
    }
    // begin() starts over: an unrelated history is indexed from scratch.
    PromptLookupDrafter d(8, 2);
    d.begin(std::vector<int32_t>{1, 2, 3, 1, 2});
    CHECK(propose(d, {1, 2, 3, 1, 2}, 1) == std::vector<int32_t>{3});
    d.begin(std::vector<int32_t>{4, 5});
    CHECK(propose(d, {4, 5}, 1).empty());
    CHECK_THROWS_AS(propose(d, {4}, 1), std::logic_error); // the history may only grow
}

TEST_CASE("the draft length is the one with the best expected speed for the acceptance and the cost") {
    // Free columns: draft as much as allowed whenever anything may hold.
    CHECK(best_draft_length(0.3, 0.0, 8) == 8);
    // A column costs 0.37 of a step: one draft token pays only when it holds more often than that.
    CHECK(best_draft_length(0.30, 0.37, 8) == 0);
    CHECK(best_draft_length(0.50, 0.37, 8) == 1);
    CHECK(best_draft_length(0.98, 0.37, 8) >= 5);
    CHECK(best_draft_length(0.98, 0.37, 3) == 3);
    CHECK(best_draft_length(0.99, 2.0, 8) == 0); // a draft model as slow as the target
    CHECK(best_draft_length(0.9, 0.1, 0) == 0);

    AcceptanceRate r;
    CHECK(r.rate() == doctest::Approx(0.5));
    for (int i = 0; i < 10; ++i)
        r.observe(8, 8);
    CHECK(r.rate() > 0.95);
    for (int i = 0; i < 40; ++i)
        r.observe(2, 0);
    CHECK(r.rate() < 0.25);
    const double low = r.rate();
    for (int i = 0; i < 30; ++i)
        r.forget(); // withheld proposals drift back to the prior
    CHECK(r.rate() > low + 0.1);
    CHECK(r.rate() < 0.5);

    DraftCost c;
    CHECK(c.relative_column_cost() == doctest::Approx(0.25)); // the prior
    c.record(1, 10.0);
    c.record(5, 30.0); // 4 extra columns for 20 ms
    CHECK(c.step_ms == doctest::Approx(10.0));
    CHECK(c.relative_column_cost() == doctest::Approx(0.5));

    // The lookup drafter withholds single-token matches once they keep failing, and keeps drafting
    // three-token matches that hold.
    PromptLookupDrafter d(4, 3);
    std::vector<int32_t> out;
    DraftCost expensive;
    expensive.step_ms = 10.0;
    expensive.column_ms = 4.0;
    expensive.column_samples = 1;
    std::vector<int32_t> h = {1, 2, 3, 4, 5, 6, 7, 8};
    d.begin(h);
    h.push_back(5); // matches "5" -> proposes 6 ...
    d.propose(h, 100, expensive, out);
    CHECK(out.size() == 1); // a = 0.5 (no evidence yet): one token pays at cost 0.4
    d.observe(1, 0);
    h.push_back(11);
    h.push_back(3); // matches "3" again, which failed
    d.propose(h, 100, expensive, out);
    CHECK(out.empty());
    h.insert(h.end(), {4, 5, 6, 7, 1, 2, 3}); // "1 2 3" -> 4 5 6 7
    d.propose(h, 100, expensive, out);
    CHECK(out.size() == 1);
    d.observe(1, 1);
    d.propose(h, 100, expensive, out);
    CHECK(out.size() >= 1);
}

// ---------------------------------------------------------------------------------------------
// Verification on a fake model whose logits depend on the last two tokens in its cache, so a
// cache rolled back wrongly changes the output.

namespace {

constexpr int32_t kVocab = 14;
constexpr int32_t kEos = 2;

uint32_t mix(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t h = a * 0x9E3779B1u ^ (b + 0x7F4A7C15u) * 0x85EBCA77u ^ c * 0xC2B2AE3Du;
    h ^= h >> 15;
    h *= 0x2C1B3C6Du;
    return h ^ (h >> 13);
}

// The fake model's greedy choice after (prev, last): a token in 3..kVocab-1, with few enough
// distinct pairs that outputs loop (so prompt lookup finds matches).
int32_t fake_next(int32_t prev, int32_t last, const std::vector<int32_t>& eos_after) {
    for (int32_t e : eos_after)
        if (last == e) return kEos;
    return 3 +
           static_cast<int32_t>(mix(static_cast<uint32_t>(prev) % 3, static_cast<uint32_t>(last), 1) % (kVocab - 3));
}

class FakeModel : public test::FakeBackendBase {
public:
    int32_t n_ctx = 256;
    std::vector<int32_t> eos_after; // tokens followed by EOS
    int forwards = 0;
    std::vector<int32_t> kv; // the token at each cached position

    void forward(const ForwardBatch& b) override {
        if (b.pos0 != static_cast<int32_t>(kv.size())) throw std::logic_error("forward at the wrong position");
        if (b.pos0 + static_cast<int64_t>(b.tokens.size()) > n_ctx) throw std::logic_error("forward past the context");
        ++forwards;
        kv.insert(kv.end(), b.tokens.begin(), b.tokens.end());
        const size_t first = b.wanted == LogitsWanted::all ? 0 : b.tokens.size() - 1;
        rows_ = static_cast<int>(b.tokens.size() - first);
        logits_.assign(static_cast<size_t>(rows_) * kVocab, 0.0f);
        for (size_t i = first; i < b.tokens.size(); ++i) {
            const size_t p = static_cast<size_t>(b.pos0) + i;
            const int32_t last = kv[p];
            const int32_t prev = p > 0 ? kv[p - 1] : 0;
            float* row = logits_.data() + (i - first) * kVocab;
            // A spread-out distribution for sampling, with the greedy choice on top.
            for (int32_t t = 0; t < kVocab; ++t)
                row[t] = static_cast<float>(
                             mix(static_cast<uint32_t>(last), static_cast<uint32_t>(prev), static_cast<uint32_t>(t)) %
                             1000) /
                         400.0f;
            row[kEos] = -1e9f;
            row[fake_next(prev, last, eos_after)] = 4.0f;
        }
    }
    std::span<const float> logits(int r) override {
        if (r < 0 || r >= rows_) throw std::logic_error("no such logit row");
        return {logits_.data() + static_cast<size_t>(r) * kVocab, static_cast<size_t>(kVocab)};
    }
    void argmax(std::span<int32_t> per_row) override {
        if (static_cast<int>(per_row.size()) > rows_) throw std::logic_error("argmax: too many rows");
        for (size_t r = 0; r < per_row.size(); ++r) {
            const auto l = logits(static_cast<int>(r));
            per_row[r] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
        }
    }
    int32_t n_past() const override { return static_cast<int32_t>(kv.size()); }
    void kv_truncate(int32_t n) override {
        if (n < 0 || n > n_past()) throw std::logic_error("kv_truncate out of range");
        kv.resize(static_cast<size_t>(n));
    }

private:
    int rows_ = 0;
    std::vector<float> logits_;
};

class LetterTokenizer : public Tokenizer {
public:
    std::vector<int32_t> encode(std::string_view, const EncodeOptions&) const override { return {}; }
    std::string token_to_piece(int32_t id, bool) const override {
        return id < 3 ? std::string() : std::string(1, static_cast<char>('a' + id - 3));
    }
    int32_t vocab_size() const override { return kVocab; }
    std::string_view kind() const override { return "fake"; }
    std::string_view pre() const override { return "default"; }
    int32_t bos() const override { return 1; }
    int32_t eos() const override { return kEos; }
    bool is_eog(int32_t id) const override { return id == kEos; }
    int32_t token_id(std::string_view) const override { return -1; }
};

// Drafts the fake model's true greedy continuation (through EOS and beyond), with every
// `wrong_every`-th drafted token replaced by a wrong one (0: never).
class OracleDrafter : public Drafter {
public:
    int32_t k = 4;
    int wrong_every = 0;
    std::vector<int32_t> eos_after;
    int proposals = 0;

    void begin(std::span<const int32_t>) override {}
    void propose(std::span<const int32_t> h, int32_t max_tokens, const DraftCost&, std::vector<int32_t>& out) override {
        out.clear();
        int32_t prev = h.size() > 1 ? h[h.size() - 2] : 0, last = h.back();
        for (int32_t i = 0; i < std::min(k, max_tokens); ++i) {
            int32_t next = fake_next(prev, last, eos_after);
            if (next == kEos) next = 5; // past EOS a drafter can guess anything
            ++proposals;
            if (wrong_every > 0 && proposals % wrong_every == 0) next = 3 + (next - 3 + 1) % (kVocab - 3);
            out.push_back(next);
            prev = last;
            last = next;
        }
    }
    void observe(int32_t, int32_t) override {}
    std::string_view name() const override { return "oracle"; }
};

struct FakeRun {
    GenerateResult result;
    int forwards = 0;
    std::vector<int32_t> kv;
    std::vector<int32_t> kv_tokens;
};

FakeRun fake_generate(const GenerateOptions& o, int32_t n_ctx = 256, std::vector<int32_t> eos_after = {},
                      const std::vector<int32_t>& prompt = {1, 3, 4, 3}) {
    auto model = std::make_unique<FakeModel>();
    model->n_ctx = n_ctx;
    model->eos_after = std::move(eos_after);
    FakeModel* m = model.get();
    Session s(std::move(model), std::make_unique<LetterTokenizer>(), n_ctx);
    FakeRun r;
    r.result = s.generate(prompt, o);
    r.forwards = m->forwards;
    r.kv = m->kv;
    r.kv_tokens = s.kv_tokens();
    return r;
}

GenerateOptions greedy_opts(int32_t n) {
    GenerateOptions o;
    o.n_predict = n;
    o.sampling.temp = 0.0f;
    return o;
}

// Same tokens, text and stop reason as plain decoding; the cache holds exactly the tokens the
// session believes it holds.
void check_same(const FakeRun& plain, const FakeRun& drafted) {
    CHECK(drafted.result.tokens == plain.result.tokens);
    CHECK(drafted.result.text == plain.result.text);
    CHECK(drafted.result.stop_reason == plain.result.stop_reason);
    CHECK(drafted.kv == drafted.kv_tokens);
    CHECK(drafted.result.n_accepted <= drafted.result.n_drafted);
}

} // namespace

TEST_CASE("drafting does not change greedy output, at every -n") {
    for (int32_t n = 0; n <= 24; ++n) {
        CAPTURE(n);
        const FakeRun plain = fake_generate(greedy_opts(n));
        CHECK(plain.result.n_gen() == n);
        for (int wrong : {0, 1, 2, 3}) {
            CAPTURE(wrong);
            OracleDrafter oracle;
            oracle.wrong_every = wrong;
            GenerateOptions o = greedy_opts(n);
            o.drafter = &oracle;
            const FakeRun d = fake_generate(o);
            check_same(plain, d);
            if (wrong == 0 && n > 2) CHECK(d.result.n_accepted == d.result.n_drafted);
            if (wrong == 1) CHECK(d.result.n_accepted == 0);
        }
        PromptLookupDrafter lookup(5, 3);
        GenerateOptions o = greedy_opts(n);
        o.drafter = &lookup;
        check_same(plain, fake_generate(o));
    }
}

TEST_CASE("a right draft saves forwards; the drafted counts add up") {
    const FakeRun plain = fake_generate(greedy_opts(40));
    OracleDrafter oracle; // always right, 4 per step: 5 tokens per forward
    GenerateOptions o = greedy_opts(40);
    o.drafter = &oracle;
    const FakeRun d = fake_generate(o);
    check_same(plain, d);
    CHECK(plain.forwards == 1 + 39); // prefill, then one per token but the last
    CHECK(d.forwards == 1 + 8);      // 39 tokens in steps of 5, the last one never forwarded
    CHECK(d.result.n_drafted == 31); // 7 steps of 4, then 3 (no draft past -n)
    CHECK(d.result.n_accepted == 31);

    // The lookup drafter on the fake's looping output: hits, and the same text.
    PromptLookupDrafter lookup(8, 3);
    test::EagerDrafter eager(lookup);
    GenerateOptions l = greedy_opts(120);
    l.drafter = &eager;
    const FakeRun lp = fake_generate(greedy_opts(120));
    const FakeRun ld = fake_generate(l);
    check_same(lp, ld);
    CHECK(ld.result.n_accepted > 20);
    CHECK(ld.forwards < lp.forwards);
}

TEST_CASE("EOS, stop strings and the context end inside a draft stop exactly where plain decoding does") {
    const FakeRun probe = fake_generate(greedy_opts(30));
    REQUIRE(probe.result.tokens.size() == 30);
    // EOS after the 7th generated token: the oracle keeps drafting past it.
    const std::vector<int32_t> eos_after = {probe.result.tokens[6]};
    const FakeRun plain_eos = fake_generate(greedy_opts(-1), 256, eos_after);
    CHECK(plain_eos.result.stop_reason == StopReason::eos);
    for (int wrong : {0, 3}) {
        OracleDrafter oracle;
        oracle.eos_after = {}; // blind to the EOS: drafts straight through it
        oracle.wrong_every = wrong;
        GenerateOptions o = greedy_opts(-1);
        o.drafter = &oracle;
        check_same(plain_eos, fake_generate(o, 256, eos_after));
    }

    // A stop string made of generated tokens 9..11.
    GenerateOptions s = greedy_opts(30);
    s.stop = {probe.result.text.substr(9, 3)};
    const FakeRun plain_stop = fake_generate(s);
    CHECK(plain_stop.result.stop_reason == StopReason::stop);
    OracleDrafter oracle;
    s.drafter = &oracle;
    const FakeRun d_stop = fake_generate(s);
    check_same(plain_stop, d_stop);
    CHECK(d_stop.result.text.size() < 12);

    // The context: 4 prompt tokens in 17 positions, every generation length around it.
    for (int32_t ctx = 5; ctx <= 17; ++ctx) {
        CAPTURE(ctx);
        const FakeRun plain = fake_generate(greedy_opts(-1), ctx);
        CHECK(plain.result.stop_reason == StopReason::context);
        CHECK(plain.result.n_gen() == ctx - 4 + 1);
        OracleDrafter o4;
        GenerateOptions o = greedy_opts(-1);
        o.drafter = &o4;
        check_same(plain, fake_generate(o, ctx)); // FakeModel throws on a forward past ctx
    }
}

TEST_CASE("sampling with drafts gives the same tokens as without, for the same seed") {
    for (uint64_t seed : {1u, 2u, 3u, 42u, 1234u}) {
        for (float penalty : {1.0f, 1.3f}) {
            CAPTURE(seed);
            GenerateOptions o;
            o.n_predict = 60;
            o.sampling.seed = seed;
            o.sampling.temp = 1.0f;
            o.sampling.top_k = 0;
            o.sampling.min_p = 0.0f;
            o.sampling.repeat_penalty = penalty;
            const FakeRun plain = fake_generate(o);
            OracleDrafter oracle;
            o.drafter = &oracle;
            const FakeRun d = fake_generate(o);
            check_same(plain, d);
            CHECK(d.result.n_accepted > 0); // the greedy choice is likely but not certain
            CHECK(d.result.n_accepted < d.result.n_drafted);
            PromptLookupDrafter lookup(6, 2);
            o.drafter = &lookup;
            check_same(plain, fake_generate(o));
        }
    }
}

TEST_CASE("a text callback that stops mid-draft stops the output at the same token") {
    for (int stop_after : {1, 3, 6}) {
        auto run = [&](Drafter* drafter) {
            auto model = std::make_unique<FakeModel>();
            Session s(std::move(model), std::make_unique<LetterTokenizer>(), 256);
            GenerateOptions o = greedy_opts(40);
            o.drafter = drafter;
            int pieces = 0;
            return s.generate(std::vector<int32_t>{1, 3, 4, 3}, o,
                              [&](std::string_view) { return ++pieces < stop_after; });
        };
        OracleDrafter oracle;
        const GenerateResult plain = run(nullptr), drafted = run(&oracle);
        CHECK(plain.stop_reason == StopReason::cancelled);
        CHECK(drafted.stop_reason == StopReason::cancelled);
        CHECK(drafted.tokens == plain.tokens);
        CHECK(drafted.text == plain.text);
    }
}

// ---------------------------------------------------------------------------------------------
// Real models on the CPU backend.

namespace {

struct Loaded {
    std::shared_ptr<Model> model;
    std::unique_ptr<Session> session;
};

Loaded load(const std::string& path, int32_t n_ctx = 512) {
    Loaded l;
    l.model = std::make_shared<Model>(load_model(path));
    RunOptions run;
    run.n_ctx = n_ctx;
    std::unique_ptr<Backend> backend = make_backend("cpu", CpuOptions{1});
    backend->load(l.model->config, l.model->weights, run);
    l.session = std::make_unique<Session>(std::move(backend), Tokenizer::from_gguf(l.model->file), n_ctx, l.model);
    return l;
}

std::unique_ptr<DraftModelDrafter> load_draft(const std::string& path, const Model& target, int32_t k,
                                              int32_t n_ctx = 512) {
    OpenRequest request;
    request.path = path;
    request.n_ctx = n_ctx;
    request.device = "cpu";
    request.cpu.n_threads = 1;
    return load_draft_model(request, target, k);
}

std::string gguf(const std::string& name) {
    return test::shared_path("models/gguf/" + name + ".gguf").string();
}

// The shared reference prompts (only those named in `slugs`, when given) and a repetitive one.
std::vector<std::string> reference_prompts(const std::vector<std::string>& slugs = {}) {
    std::vector<std::string> out;
    const json j = json::parse(test::read_file(test::shared_path("reference/prompts.json")));
    for (const auto& [slug, text] : j.items())
        if (slugs.empty() || std::find(slugs.begin(), slugs.end(), slug) != slugs.end())
            out.push_back(text.get<std::string>());
    REQUIRE((slugs.empty() || out.size() == slugs.size()));
    // Repetitive: the models copy much of it, so lookup drafts are often right.
    out.push_back("Tom has a red ball. Tom has a red ball. Tom has a red ball. Tom has a red");
    return out;
}

// Plain decoding, then the same prompt with `drafter`, from a cleared cache each time.
GenerateResult compare(Session& s, const std::string& text, Drafter* drafter, GenerateOptions o) {
    const std::vector<int32_t> prompt = s.tokenizer().encode(text, {true, true});
    s.reset();
    const GenerateResult plain = s.generate(prompt, o);
    s.reset();
    o.drafter = drafter;
    const GenerateResult drafted = s.generate(prompt, o);
    CHECK(drafted.tokens == plain.tokens);
    CHECK(drafted.text == plain.text);
    CHECK(drafted.stop_reason == plain.stop_reason);
    CHECK(s.backend().n_past() == static_cast<int32_t>(s.kv_tokens().size()));
    return drafted;
}

} // namespace

TEST_CASE("real models: greedy output with prompt lookup is byte-identical, for every reference model") {
    if (!test::shared_available()) return;
    std::vector<std::string> models;
    for (const char* dir : {"models/gguf", "models/synth"})
        for (const auto& e : std::filesystem::directory_iterator(test::shared_path(dir)))
            if (e.path().extension() == ".gguf") models.push_back(e.path().string());
    std::sort(models.begin(), models.end());
    REQUIRE(models.size() >= 20);
    // TERN_TEST_QUICK=1 (tests/quick_mode.h): on every file (each weight format's verification batch) the empty
    // prompt and the two repetitive ones, where drafts are long and mostly accepted; the other prompts still run
    // in the draft-model and sampled cases below.
    const std::vector<std::string> every_file_prompts =
        test::quick_mode() ? reference_prompts({"bos", "repeat-sentence"}) : reference_prompts();
    for (const std::string& path : models) {
        CAPTURE(path);
        Loaded l = load(path, 256);
        PromptLookupDrafter always(8, 3);
        test::EagerDrafter eager(always);
        PromptLookupDrafter lookup(8, 3); // as tern run uses it: drafts only where they pay
        int32_t accepted = 0;
        for (const std::string& prompt : every_file_prompts) {
            CAPTURE(prompt);
            accepted += compare(*l.session, prompt, &eager, greedy_opts(48)).n_accepted;
            compare(*l.session, prompt, &lookup, greedy_opts(48));
        }
        CHECK(accepted > 0);
    }
}

TEST_CASE("real models: a draft model gives the same greedy and sampled output") {
    if (!test::shared_available()) return;
    struct Pair {
        const char* target;
        const char* draft;
    };
    for (const Pair p :
         {Pair{"stories260K-f32", "stories260K-q4_k_m"}, Pair{"llama2xs-tok512-f32", "llama2xs-tok512-q4_0"},
          Pair{"stories260K-f16", "llama2xs-tok512-q8_0"}}) {
        const std::string target = p.target, draft = p.draft;
        CAPTURE(target);
        CAPTURE(draft);
        Loaded l = load(gguf(p.target));
        auto drafter = load_draft(gguf(p.draft), *l.model, 6);
        test::EagerDrafter eager(*drafter);
        int32_t accepted = 0, drafted = 0;
        for (const std::string& prompt : reference_prompts()) {
            CAPTURE(prompt);
            compare(*l.session, prompt, drafter.get(), greedy_opts(64)); // drafts only where they pay
            const GenerateResult r = compare(*l.session, prompt, &eager, greedy_opts(64));
            accepted += r.n_accepted;
            drafted += r.n_drafted;
        }
        CHECK(accepted > 0);
        MESSAGE(target << " drafted by " << draft << ": " << accepted << " of " << drafted << " accepted");
        for (uint64_t seed : {7u, 8u, 9u}) {
            GenerateOptions o;
            o.n_predict = 48;
            o.sampling.seed = seed;
            compare(*l.session, "Once upon a time", drafter.get(), o);
        }
    }
}

TEST_CASE("real model: sampled output with prompt lookup is the same for the same seed") {
    if (!test::shared_available()) return;
    Loaded l = load(gguf("stories260K-f32"));
    // Accepted drafts are counted on the eager wrapper (a loaded CI machine once made the
    // cost-aware lookup never draft: 0 accepted); both must give the plain output.
    PromptLookupDrafter always(8, 3);
    test::EagerDrafter eager(always);
    PromptLookupDrafter lookup(8, 3);
    int32_t accepted = 0;
    for (uint64_t seed : {1u, 2u, 3u, 4u}) {
        GenerateOptions o;
        o.n_predict = 64;
        o.sampling.seed = seed;
        o.sampling.repeat_penalty = 1.05f;
        for (const std::string& prompt : reference_prompts()) {
            accepted += compare(*l.session, prompt, &eager, o).n_accepted;
            compare(*l.session, prompt, &lookup, o);
        }
    }
    CHECK(accepted > 0);
}

TEST_CASE("Gemma 3 270M: greedy output with prompt lookup is byte-identical") {
    const char* home = std::getenv("HOME");
    const std::filesystem::path path =
        std::filesystem::path(home ? home : "") / ".cache/tern/models/gemma-3-270m-q4_k_m.gguf";
    if (!std::filesystem::exists(path)) {
        MESSAGE("skipped: no " << path.string());
        return;
    }
    Loaded l = load(path.string(), 512);
    PromptLookupDrafter always(8, 3);
    test::EagerDrafter eager(always);
    PromptLookupDrafter lookup(8, 3);
    const std::string copy_prompt =
        "Copy the list exactly.\nList: apples, pears, plums, cherries, figs, dates.\nCopy: apples, pears,";
    CHECK(compare(*l.session, copy_prompt, &eager, greedy_opts(32)).n_accepted > 0);
    compare(*l.session, copy_prompt, &lookup, greedy_opts(32));
    compare(*l.session, "The capital of France is", &lookup, greedy_opts(24));
}

TEST_CASE("a draft model with another vocabulary is refused with one line naming the file") {
    if (!test::shared_available()) return;
    Loaded l = load(gguf("stories260K-f32"));
    for (const char* other : {"babyllama-tok105-q8_0", "aidreams260K-f16"}) {
        CAPTURE(other);
        try {
            load_draft(gguf(other), *l.model, 4);
            FAIL("no exception");
        } catch (const DraftModelUnfit& e) {
            const std::string m = e.what();
            CHECK(e.vocabulary);
            CHECK(m.starts_with(gguf(other) + ": "));
            CHECK(m.find(other) != std::string::npos);
            CHECK(m.find('\n') == std::string::npos);
        }
    }
    CHECK_THROWS_AS(load_draft("/nonexistent/draft.gguf", *l.model, 4), DraftModelUnfit);
}

// ---------------------------------------------------------------------------------------------
// tern run end to end.

namespace {

test::CommandResult tern_run(std::vector<std::string> args) {
    std::vector<std::string> all = {"run", "-m", gguf("stories260K-f32"), "--device", "cpu"};
    all.insert(all.end(), args.begin(), args.end());
    return test::run_tern(all);
}

json run_json(std::vector<std::string> args) {
    args.push_back("--json");
    const test::CommandResult r = tern_run(args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return json::parse(r.out);
}

} // namespace

TEST_CASE("tern run --lookup / --draft-model: same text, drafted and accepted counts in --json and on stderr") {
    if (!test::shared_available()) return;
    const std::vector<std::string> base = {
        "-p", "Tom has a red ball. Tom has a red ball. Tom has a", "-n", "80", "--temp", "0"};
    const json plain = run_json(base);
    CHECK(plain["lookup"]["drafted"] == 0);

    std::vector<std::string> a = base;
    a.insert(a.end(), {"--lookup", "--lookup-ngram", "2"});
    const json lookup = run_json(a);
    CHECK(lookup["text"] == plain["text"]);
    CHECK(lookup["tokens"] == plain["tokens"]);
    CHECK(lookup["lookup"]["drafted"].get<int>() > 0);
    CHECK(lookup["lookup"]["accepted"].get<int>() > 0);
    CHECK(lookup["lookup"]["accepted"].get<int>() <= lookup["lookup"]["drafted"].get<int>());

    std::vector<std::string> d = base;
    d.insert(d.end(), {"--draft-model", gguf("stories260K-q4_k_m"), "--draft-max", "4"});
    const json draft = run_json(d);
    CHECK(draft["text"] == plain["text"]);
    CHECK(draft["lookup"]["accepted"].get<int>() > 0);

    // Plain text output and the statistics line.
    std::vector<std::string> t = base;
    t.insert(t.end(), {"--lookup", "4"});
    const test::CommandResult r = tern_run(t);
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == plain["text"].get<std::string>());
    CHECK(r.err.find("lookup drafted ") != std::string::npos);

    // Sampling: the same seed gives the same text with and without drafting.
    const std::vector<std::string> sampled = {"-p", "Once upon a time", "-n", "60", "--seed", "11"};
    const json s_plain = run_json(sampled);
    std::vector<std::string> s1 = sampled;
    s1.push_back("--lookup");
    CHECK(run_json(s1)["text"] == s_plain["text"]);
    std::vector<std::string> s2 = sampled;
    s2.insert(s2.end(), {"--draft-model", gguf("llama2xs-tok512-q4_0")});
    CHECK(run_json(s2)["text"] == s_plain["text"]);
}

TEST_CASE("tern run: drafting flag errors") {
    if (!test::shared_available()) return;
    const auto bad_vocab = tern_run({"-p", "Hi", "-n", "4", "--draft-model", gguf("babyllama-tok105-q8_0")});
    CHECK(bad_vocab.exit_code == 2);
    CHECK(bad_vocab.err.starts_with("tern: --draft-model "));
    CHECK(std::count(bad_vocab.err.begin(), bad_vocab.err.end(), '\n') == 1);
    CHECK(bad_vocab.out.empty());
    CHECK(tern_run({"-p", "Hi", "--draft-model", "/nonexistent.gguf"}).exit_code == 2);

    for (const std::vector<std::string>& args : {std::vector<std::string>{"--lookup", "0"},
                                                 {"--lookup-ngram", "2"},
                                                 {"--lookup", "--lookup-ngram", "0"},
                                                 {"--draft-max", "3"},
                                                 {"--lookup", "--draft-model", gguf("stories260K-q4_k_m")}}) {
        std::vector<std::string> all = {"-p", "Hi", "-n", "4"};
        all.insert(all.end(), args.begin(), args.end());
        const auto r = tern_run(all);
        CAPTURE(r.err);
        CHECK(r.exit_code == 1);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    }
}
