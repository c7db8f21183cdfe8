// The repetition guard (engine/generation/repeat_guard.h): the detector on hand-made and random token
// sequences, its prompt index against a brute-force search, Session::generate with the guard on a
// scripted fake model (the cut tail never reaches the text callback, with or without drafting),
// and the `tern run` flags.
#include <doctest/doctest.h>

#include <atomic>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/fake_backend.h"
#include "engine/speculative/drafter.h"
#include "engine/generation/repeat_guard.h"
#include "engine/generation/session.h"
#include "tests/eager_drafter.h"
#include "tests/test_support.h"

using namespace tern;

namespace {

RepeatGuardParams on() {
    RepeatGuardParams p;
    p.enabled = true;
    return p;
}

// Feeds `generated` to a guard; returns the first cut and the number of tokens fed until then.
struct Fed {
    std::optional<RepeatCut> cut;
    size_t at = 0;   // tokens fed when it fired (all of them when it did not)
};
Fed feed(const RepeatGuardParams& p, const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated) {
    RepeatGuard g(p, prompt);
    Fed f;
    while (f.at < generated.size()) {
        ++f.at;
        if ((f.cut = g.push(std::span(generated).first(f.at)))) return f;
    }
    return f;
}

std::vector<int32_t> repeat(const std::vector<int32_t>& span, int times) {
    std::vector<int32_t> out;
    for (int i = 0; i < times; ++i) out.insert(out.end(), span.begin(), span.end());
    return out;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// `n` tokens drawn from [lo, lo + range).
std::vector<int32_t> random_tokens(std::mt19937& rng, size_t n, int32_t lo, int32_t range) {
    std::uniform_int_distribution<int32_t> d(lo, lo + range - 1);
    std::vector<int32_t> out(n);
    for (int32_t& t : out) t = d(rng);
    return out;
}

} // namespace

TEST_CASE("a loop fires once it has enough occurrences, and the cut leaves exactly one") {
    const RepeatGuardParams p = on();
    RepeatGuard g(p, std::vector<int32_t>{1, 2, 3});
    // Short spans need more occurrences; long ones fewer; 32 tokens and more: two.
    CHECK(g.repeats_needed(1) == 32);
    CHECK(g.repeats_needed(2) == 16);
    CHECK(g.repeats_needed(3) == 11);
    CHECK(g.repeats_needed(8) == 4);
    CHECK(g.repeats_needed(11) == 3);
    CHECK(g.repeats_needed(31) == 3);
    CHECK(g.repeats_needed(32) == 2);
    CHECK(g.repeats_needed(100) == 2);

    std::mt19937 rng(7);
    for (int32_t span : {1, 2, 3, 5, 8, 12, 20, 31, 32, 45, 128}) {
        CAPTURE(span);
        // A varied lead-in whose tokens never occur in the span, then the loop many times.
        const std::vector<int32_t> lead = random_tokens(rng, 40, 1000, 500);
        const std::vector<int32_t> unit = random_tokens(rng, static_cast<size_t>(span), 5000, 30000);
        const int needed = g.repeats_needed(span);
        const std::vector<int32_t> gen = concat(lead, repeat(unit, needed + 5));
        const Fed f = feed(p, {1, 2, 3}, gen);
        REQUIRE(f.cut);
        CHECK(f.cut->span == span);
        CHECK(f.cut->repeats == needed);
        CHECK(f.at == lead.size() + static_cast<size_t>(needed * span));   // as soon as it qualifies
        CHECK(f.cut->cut == (needed - 1) * span);
        const std::vector<int32_t> kept(gen.begin(), gen.begin() + static_cast<std::ptrdiff_t>(f.at - f.cut->cut));
        CHECK(kept == concat(lead, unit));
    }
}

TEST_CASE("a span that is itself periodic is reported by its shortest period") {
    const Fed f = feed(on(), {1}, repeat({7, 8, 7, 8}, 20));
    REQUIRE(f.cut);
    CHECK(f.cut->span == 2);
    CHECK(f.cut->cut == 30);   // 32 tokens seen, 2 kept
}

TEST_CASE("spans longer than max_span, and loops below the thresholds, do not fire") {
    RepeatGuardParams p = on();
    p.max_span = 16;
    std::mt19937 rng(3);
    const std::vector<int32_t> unit = random_tokens(rng, 20, 100, 5000);
    CHECK_FALSE(feed(p, {1}, repeat(unit, 10)).cut);

    // Two occurrences of a 31-token span, ten of a 3-token one: ordinary text does that.
    const std::vector<int32_t> u31 = random_tokens(rng, 31, 100, 5000);
    CHECK_FALSE(feed(on(), {1}, concat(repeat(u31, 2), {9, 9})).cut);
    CHECK_FALSE(feed(on(), {1}, concat(repeat({5, 6, 7}, 10), {9, 9})).cut);
    CHECK_FALSE(feed(on(), {1}, repeat({4}, 31)).cut);
    CHECK(feed(on(), {1}, repeat({4}, 32)).cut);
}

TEST_CASE("thresholds are configurable; long_span 0 turns the two-occurrence rule off") {
    RepeatGuardParams p = on();
    p.min_repeats = 5;
    p.min_loop_tokens = 8;
    p.long_span = 0;
    RepeatGuard g(p, std::vector<int32_t>{});
    CHECK(g.repeats_needed(1) == 8);
    CHECK(g.repeats_needed(2) == 5);
    CHECK(g.repeats_needed(64) == 5);
    const Fed f = feed(p, {}, repeat({3, 4}, 6));
    REQUIRE(f.cut);
    CHECK(f.cut->repeats == 5);
    CHECK(f.at == 10);
}

TEST_CASE("copying a passage from the prompt does not fire, even when the passage repeats") {
    std::mt19937 rng(11);
    const std::vector<int32_t> chorus = random_tokens(rng, 6, 100, 3000);
    const std::vector<int32_t> line = random_tokens(rng, 40, 100, 3000);
    // A song whose chorus repeats 15 times, a list of equal rows, a row of one token.
    const std::vector<int32_t> song = concat(concat(random_tokens(rng, 30, 100, 3000), repeat(chorus, 15)),
                                             random_tokens(rng, 20, 100, 3000));
    const std::vector<int32_t> rows = repeat(line, 4);
    const std::vector<int32_t> dashes = repeat({42}, 80);
    for (const std::vector<int32_t>* passage : {&song, &rows, &dashes}) {
        const std::vector<int32_t> instruction = random_tokens(rng, 8, 100, 3000);
        const std::vector<int32_t> prompt = concat(concat(*passage, instruction), {passage->front()});
        // The model copies the passage (from its second token: the prompt ends with the first).
        const std::vector<int32_t> copy(passage->begin() + 1, passage->end());
        CHECK_FALSE(feed(on(), prompt, copy).cut);
    }
}

TEST_CASE("a copy that runs on past the prompt's repeats is a loop again") {
    std::mt19937 rng(5);
    const std::vector<int32_t> unit = random_tokens(rng, 12, 100, 3000);   // needs 3 occurrences
    const std::vector<int32_t> prompt = concat(concat({1}, repeat(unit, 4)), {7, 7});
    // 4 occurrences are copied; the 5th is more than the prompt has: the guard fires right there,
    // and keeps the copied part.
    const Fed f = feed(on(), prompt, repeat(unit, 8));
    REQUIRE(f.cut);
    CHECK(f.at == 4 * 12 + 1);
    CHECK(f.cut->span == 12);
    CHECK(f.cut->cut == 1);
    // A loop that only starts like the prompt's copy is cut to one occurrence as usual.
    const Fed g = feed(on(), concat({1}, repeat(unit, 1)), repeat(unit, 8));
    REQUIRE(g.cut);
    CHECK(g.at == 3 * 12);
    CHECK(g.cut->cut == 2 * 12);
}

TEST_CASE("SubstringMatcher::prefix_in_text") {
    SubstringMatcher m(std::vector<int32_t>{5, 6, 7, 5, 6, 8});
    CHECK(m.prefix_in_text(std::vector<int32_t>{5, 6, 8, 1}) == 3);
    CHECK(m.prefix_in_text(std::vector<int32_t>{6, 7, 5, 6, 8}) == 5);
    CHECK(m.prefix_in_text(std::vector<int32_t>{9}) == 0);
    CHECK(m.prefix_in_text(std::vector<int32_t>{}) == 0);
}

TEST_CASE("near-loops with variation and random sequences never fire") {
    std::mt19937 rng(1);
    // "Day 1: ... Day 2: ...": the same sentence with a counter, 60 times.
    std::vector<int32_t> counted;
    for (int32_t i = 0; i < 60; ++i) counted = concat(counted, {50, 51, 52, 1000 + i, 53, 54});
    CHECK_FALSE(feed(on(), {1}, counted).cut);
    // A loop that changes one token every occurrence.
    std::vector<int32_t> drifting;
    for (int32_t i = 0; i < 40; ++i) {
        std::vector<int32_t> u = {60, 61, 62, 63, 64, 65, 66, 67};
        u[static_cast<size_t>(i % 8)] = 70 + i;
        drifting = concat(drifting, u);
    }
    CHECK_FALSE(feed(on(), {1}, drifting).cut);
    // Random tokens, even from a tiny vocabulary where short repeats are everywhere.
    for (int32_t vocab : {4, 16, 1000, 262144}) {
        CAPTURE(vocab);
        CHECK_FALSE(feed(on(), {1, 2}, random_tokens(rng, 20000, 0, vocab)).cut);
    }
}

TEST_CASE("at_risk covers every token a later cut removes") {
    std::mt19937 rng(9);
    for (int trial = 0; trial < 200; ++trial) {
        // Random text with short loops, some breaking off early, from a small vocabulary.
        std::vector<int32_t> gen;
        while (gen.size() < 400) {
            const int32_t span = std::uniform_int_distribution<int32_t>(1, 40)(rng);
            const int times = std::uniform_int_distribution<int>(1, 6)(rng);
            const std::vector<int32_t> unit = random_tokens(rng, static_cast<size_t>(span), 0, 6);
            gen = concat(gen, repeat(unit, times));
            if (times > 1) gen.resize(gen.size() - static_cast<size_t>(rng() % static_cast<uint32_t>(span)));
        }
        RepeatGuard g(on(), std::vector<int32_t>{1});
        std::vector<int32_t> risk;   // at_risk after each token
        for (size_t i = 0; i < gen.size(); ++i) {
            const std::optional<RepeatCut> cut = g.push(std::span(gen).first(i + 1));
            risk.push_back(g.at_risk());
            if (!cut) continue;
            // Every removed token was at risk from when it was generated until now.
            const size_t first_cut = i + 1 - static_cast<size_t>(cut->cut);
            for (size_t m = first_cut; m <= i; ++m) REQUIRE(risk[m] >= static_cast<int32_t>(m - first_cut + 1));
            break;
        }
    }
}

TEST_CASE("SubstringMatcher: the longest suffix found in the text, as a brute-force search says") {
    std::mt19937 rng(2);
    for (int trial = 0; trial < 40; ++trial) {
        const int32_t vocab = trial % 2 ? 3 : 50;
        const std::vector<int32_t> text = random_tokens(rng, 1 + rng() % 300, 0, vocab);
        const std::vector<int32_t> seq = random_tokens(rng, 300, 0, vocab);
        SubstringMatcher m(text);
        for (size_t i = 0; i < seq.size(); ++i) {
            const int32_t got = m.push(seq[i]);
            int32_t want = 0;
            for (size_t len = 1; len <= i + 1; ++len) {
                const auto first = seq.begin() + static_cast<std::ptrdiff_t>(i + 1 - len);
                const auto last = seq.begin() + static_cast<std::ptrdiff_t>(i + 1);
                if (std::search(text.begin(), text.end(), first, last) == text.end()) break;
                want = static_cast<int32_t>(len);
            }
            REQUIRE(got == want);
        }
    }
}

TEST_CASE("HeldText shows the text of the tokens that are not at risk") {
    HeldText h;
    CHECK(h.showable(0, 0) == 0);
    h.token_streamed(3);   // "abc"
    h.token_streamed(3);   // a token whose text is still held by the decoder
    h.token_streamed(7);
    CHECK(h.showable(0, 7) == 7);
    CHECK(h.showable(1, 7) == 3);
    CHECK(h.showable(2, 7) == 3);
    CHECK(h.showable(3, 7) == 0);
    CHECK(h.showable(10, 7) == 0);
}

TEST_CASE("bad thresholds are named by their field and worded without a flag") {
    using Field = RepeatGuardParamsError::Field;
    const auto field = [](const RepeatGuardParams& p) {
        const std::optional<RepeatGuardParamsError> e = check_repeat_guard_params(p);
        REQUIRE(e);
        CHECK(e->rule.starts_with("must be"));
        CHECK(e->rule.find("--") == std::string::npos);
        return e->field;
    };
    RepeatGuardParams p = on();
    CHECK(!check_repeat_guard_params(p));
    p.min_repeats = 1;
    CHECK(field(p) == Field::min_repeats);
    p = on();
    p.min_loop_tokens = 0;
    CHECK(field(p) == Field::min_loop_tokens);
    p = on();
    p.long_span = 1;
    CHECK(field(p) == Field::long_span);
    p.long_span = 0;
    CHECK(!check_repeat_guard_params(p));
    p.max_span = 0;
    CHECK(field(p) == Field::max_span);
}

// ---------------------------------------------------------------------------------------------
// Session::generate with the guard, on a fake model that plays a script: the token after
// position p is script[p + 1 - n_prompt] whatever the cache holds (a row after a wrong draft is
// never read), then EOS.

namespace {

constexpr int32_t kEos = 2;

class ScriptModel : public test::FakeBackendBase {
public:
    std::vector<int32_t> script;
    int32_t n_prompt = 0;
    int32_t n_ctx = 512;
    int32_t vocab = 64;
    std::atomic<bool>* cancel = nullptr;   // set during forward number cancel_in_forward (1: the prefill)
    int32_t cancel_in_forward = -1;

    void forward(const ForwardBatch& b) override {
        if (cancel && ++forwards_ == cancel_in_forward) *cancel = true;   // as a Ctrl-C would, mid-reply
        if (b.pos0 != n_past_) throw std::logic_error("forward at the wrong position");
        if (b.pos0 + static_cast<int64_t>(b.tokens.size()) > n_ctx) throw std::logic_error("past the context");
        n_past_ += static_cast<int32_t>(b.tokens.size());
        const size_t first = b.wanted == LogitsWanted::all ? 0 : b.tokens.size() - 1;
        rows_.clear();
        for (size_t i = first; i < b.tokens.size(); ++i) {
            const int64_t k = b.pos0 + static_cast<int64_t>(i) + 1 - n_prompt;
            rows_.push_back(k >= 0 && k < static_cast<int64_t>(script.size()) ? script[static_cast<size_t>(k)] : kEos);
        }
    }
    std::span<const float> logits(int r) override {
        logits_.assign(static_cast<size_t>(vocab), 0.0f);
        logits_[static_cast<size_t>(rows_.at(static_cast<size_t>(r)))] = 10.0f;
        return logits_;
    }
    void argmax(std::span<int32_t> per_row) override {
        for (size_t r = 0; r < per_row.size(); ++r) per_row[r] = rows_.at(r);
    }

private:
    int32_t forwards_ = 0;
    std::vector<int32_t> rows_;
    std::vector<float> logits_;
};

// Token i >= 3 is a two-letter word "<letter><digit> " so that text and tokens are easy to match;
// token 40 is the first byte of "é" and token 41 its second (a character split across tokens).
class WordTokenizer : public Tokenizer {
public:
    std::vector<int32_t> encode(std::string_view, const EncodeOptions&) const override { return {}; }
    std::string token_to_piece(int32_t id, bool) const override {
        if (id < 3) return {};
        if (id == 40) return "\xC3";
        if (id == 41) return "\xA9";
        return std::string(1, static_cast<char>('a' + id % 26)) + std::to_string(id / 26) + " ";
    }
    int32_t vocab_size() const override { return 64; }
    std::string_view kind() const override { return "fake"; }
    std::string_view pre() const override { return "default"; }
    int32_t bos() const override { return 1; }
    int32_t eos() const override { return kEos; }
    bool is_eog(int32_t id) const override { return id == kEos; }
    int32_t token_id(std::string_view) const override { return -1; }
};

struct Streamed {
    GenerateResult result;
    std::string shown;              // everything on_text received
    std::vector<size_t> shown_at;   // its length after each call
};

Streamed generate(const std::vector<int32_t>& prompt, const std::vector<int32_t>& script, GenerateOptions o,
                  Drafter* drafter = nullptr) {
    auto model = std::make_unique<ScriptModel>();
    model->script = script;
    model->n_prompt = static_cast<int32_t>(prompt.size());
    Session s(std::move(model), std::make_unique<WordTokenizer>(), 512);
    o.drafter = drafter;
    Streamed out;
    out.result = s.generate(prompt, o, [&](std::string_view piece) {
        out.shown += piece;
        out.shown_at.push_back(out.shown.size());
        return true;
    });
    return out;
}

std::string words(const std::vector<int32_t>& tokens) {
    WordTokenizer t;
    std::string s;
    for (int32_t id : tokens) s += t.token_to_piece(id, false);
    return s;
}

GenerateOptions guarded(int32_t n_predict) {
    GenerateOptions o;
    o.n_predict = n_predict;
    o.sampling.temp = 0.0f;
    o.repeat_guard = on();
    return o;
}

} // namespace

TEST_CASE("Session: a loop stops with stop_reason repetition, one occurrence kept, the cut never shown") {
    const std::vector<int32_t> lead = {10, 11, 12, 13};
    const std::vector<int32_t> unit = {20, 21, 22, 23, 24, 25, 26, 27};   // 8 tokens: 4 occurrences
    const std::vector<int32_t> script = concat(lead, repeat(unit, 30));
    const Streamed s = generate({1, 5}, script, guarded(200));
    CHECK(s.result.stop_reason == StopReason::repetition);
    CHECK(s.result.tokens == concat(lead, unit));
    CHECK(s.result.text == words(concat(lead, unit)));
    CHECK(s.shown == s.result.text);   // nothing of the cut tail reached on_text
    CHECK(s.result.repeat_cut.span == 8);
    CHECK(s.result.repeat_cut.repeats == 4);
    CHECK(s.result.repeat_cut.cut == 24);
    // The lead-in streamed as it came (the first word at once); the loop's text waited.
    REQUIRE(s.shown_at.size() >= 2);
    CHECK(s.shown_at.front() == words({10}).size());

    // Off (the engine's default): the model's own output, to -n.
    GenerateOptions plain = guarded(200);
    plain.repeat_guard.enabled = false;
    const Streamed p = generate({1, 5}, script, plain);
    CHECK(p.result.stop_reason == StopReason::length);
    CHECK(p.result.n_gen() == 200);
    CHECK(p.shown == p.result.text);
}

TEST_CASE("Session: Ctrl-C while a repetition is held back shows nothing more; the reply is what was shown") {
    const std::vector<int32_t> lead = {10, 11};
    const std::vector<int32_t> unit = {20, 21, 22, 23, 24, 25, 26, 27};
    for (int32_t at : {12, 16, 20, 24}) {   // forwards into the growing repeat (2 + 8 + 8 + ... tokens)
        CAPTURE(at);
        auto model = std::make_unique<ScriptModel>();
        std::atomic<bool> cancel{false};
        model->script = concat(lead, repeat(unit, 30));
        model->n_prompt = 2;
        model->cancel = &cancel;
        model->cancel_in_forward = at;
        Session session(std::move(model), std::make_unique<WordTokenizer>(), 512);
        GenerateOptions o = guarded(200);
        o.cancel = &cancel;
        std::string shown, shown_after_cancel;
        const GenerateResult r = session.generate(std::vector<int32_t>{1, 5}, o, [&](std::string_view piece) {
            (cancel ? shown_after_cancel : shown) += piece;
            return true;
        });
        CHECK(r.stop_reason == StopReason::cancelled);
        CHECK(shown_after_cancel.empty());   // the terminal already shows "^C": nothing may follow it
        CHECK(r.text == shown);
        CHECK(r.text == words(r.tokens));
        CHECK(static_cast<int32_t>(r.tokens.size()) < at);   // the held-back tokens were dropped
    }
}

TEST_CASE("Session: a repetition that breaks off is shown whole once it does") {
    const std::vector<int32_t> unit = {20, 21, 22, 23, 24, 25, 26, 27};
    const std::vector<int32_t> script = concat(concat({10, 11}, repeat(unit, 3)), {30, 31, 32});
    // 3 occurrences of 8 tokens (24 < 32 tokens): not a loop; its text is held, then released.
    const Streamed s = generate({1, 5}, concat(repeat(unit, 3), {30, 31, 32}), guarded(200));
    CHECK(s.result.stop_reason == StopReason::eos);
    CHECK(s.result.text == words(concat(repeat(unit, 3), {30, 31, 32})));
    CHECK(s.shown == s.result.text);
    const Streamed t = generate({1, 5}, script, guarded(200));
    CHECK(t.result.stop_reason == StopReason::eos);
    CHECK(t.shown == t.result.text);
}

TEST_CASE("Session: a copy of a repeating passage from the prompt is not cut") {
    const std::vector<int32_t> unit = {20, 21, 22, 23, 24};
    const std::vector<int32_t> passage = concat(concat({10, 11}, repeat(unit, 12)), {12, 13});
    const std::vector<int32_t> prompt = concat(concat({1}, passage), {30, 31, 32, 10});
    const std::vector<int32_t> copy(passage.begin() + 1, passage.end());
    const Streamed s = generate(prompt, copy, guarded(200));
    CHECK(s.result.stop_reason == StopReason::eos);
    CHECK(s.result.tokens == copy);
    CHECK(s.shown == s.result.text);
}

TEST_CASE("Session: the cut does not split a character or leak a stop string's prefix") {
    // "é" split over tokens 40/41 inside the looping span; a stop string that never completes.
    const std::vector<int32_t> unit = {20, 40, 41, 21, 22, 23, 24, 25, 26, 27, 28};
    GenerateOptions o = guarded(200);
    o.stop = {"x9 never"};
    const std::vector<int32_t> script = concat({10}, repeat(unit, 10));
    const Streamed s = generate({1, 5}, script, o);
    CHECK(s.result.stop_reason == StopReason::repetition);
    CHECK(s.result.tokens == concat({10}, unit));
    CHECK(s.result.text == words(concat({10}, unit)));
    CHECK(s.shown == s.result.text);
}

TEST_CASE("Session: the guard gives the same output with a drafter, at every -n") {
    const std::vector<int32_t> unit = {20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31};
    const std::vector<int32_t> script = concat(concat({10, 11, 12, 20, 21}, repeat(unit, 20)), {33});
    const std::vector<int32_t> prompt = {1, 5, 20, 21, 22, 23};   // gives prompt lookup something to copy
    for (int32_t n : {1, 7, 30, 40, 41, 42, 43, 60, 300}) {
        CAPTURE(n);
        const Streamed plain = generate(prompt, script, guarded(n));
        PromptLookupDrafter inner(8, 3);
        test::EagerDrafter lookup(inner); // drafts whatever the measured forward times
        const Streamed drafted = generate(prompt, script, guarded(n), &lookup);
        CHECK(drafted.result.tokens == plain.result.tokens);
        CHECK(drafted.result.text == plain.result.text);
        CHECK(drafted.shown == plain.shown);
        CHECK(drafted.result.stop_reason == plain.result.stop_reason);
        CHECK(drafted.shown == drafted.result.text);
        if (n >= 300) {
            CHECK(plain.result.stop_reason == StopReason::repetition);
            CHECK(drafted.result.n_accepted > 0);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// tern run

TEST_CASE("tern run: repeat-guard flag errors name the flag") {
    using tern::test::run_tern;
    if (!tern::test::shared_available()) return;
    const std::string model = tern::test::shared_path("models/gguf/stories260K-f32.gguf").string();
    for (const std::vector<std::string>& bad : std::vector<std::vector<std::string>>{
             {"--repeat-guard-count", "1"},
             {"--repeat-guard-min-tokens", "0"},
             {"--repeat-guard-long-span", "1"},
             {"--repeat-guard-max-span", "0"},
             {"--repeat-guard-max-span", "100000"},
         }) {
        std::vector<std::string> args = {"run", "-m", model, "-p", "Once", "-n", "4"};
        args.insert(args.end(), bad.begin(), bad.end());
        const tern::test::CommandResult r = run_tern(args);
        CAPTURE(bad[0]);
        CHECK(r.exit_code == 1);
        CHECK(r.err.find(bad[0] + ":") != std::string::npos);
        CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    }
}

TEST_CASE("tern run: a greedy loop of a small model is cut, noted on stderr, and --no-repeat-guard keeps it") {
    using nlohmann::json;
    using tern::test::run_tern;
    if (!tern::test::shared_available()) return;
    // Greedy, this model soon says the same sentence over and over (within its 128 positions).
    const std::string model = tern::test::shared_path("models/gguf/llama2xs-tok512-f32.gguf").string();
    const std::vector<std::string> base = {"run", "-m", model, "-p", "The sun was", "--temp", "0", "-n", "110"};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = base;
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    };
    const tern::test::CommandResult off = run_tern(with({"--json", "--no-repeat-guard"}));
    const tern::test::CommandResult guard = run_tern(with({"--json"}));
    const tern::test::CommandResult text = run_tern(with({}));
    const tern::test::CommandResult lookup = run_tern(with({"--json", "--lookup"}));
    REQUIRE(off.exit_code == 0);
    REQUIRE(guard.exit_code == 0);
    const json o = json::parse(off.out), g = json::parse(guard.out), l = json::parse(lookup.out);
    CHECK(o["stop_reason"] == "length");
    CHECK(g["stop_reason"] == "repetition");
    CHECK(guard.err.find("tern: repetition guard: cut a looping tail of ") != std::string::npos);
    // The guarded output is the unguarded one cut short: one occurrence of the loop kept.
    const std::vector<int32_t> all = o["tokens"], kept = g["tokens"];
    CHECK(kept.size() < all.size());
    CHECK(std::equal(kept.begin(), kept.end(), all.begin()));
    CHECK(o["text"].get<std::string>().starts_with(g["text"].get<std::string>()));
    // Streamed text is the JSON's text; prompt lookup changes nothing.
    CHECK(text.out == g["text"].get<std::string>());
    CHECK(l["tokens"] == g["tokens"]);
    CHECK(l["text"] == g["text"]);
}
