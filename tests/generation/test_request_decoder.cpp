// engine/generation/request_decoder.h on a fake backend whose logit rows a test writes: the token each
// row gives (the backend's argmax, or the top candidates after the penalties), the stop rules in their
// order (cancel, n_predict, end of generation, stop strings), the log-probabilities kept, the finite-row
// check, speculative steps (draft room, accepted drafts), the empty-prompt, context and prefix rules.
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

#include "engine/generation/request_decoder.h"
#include "engine/logit_candidates.h"
#include "engine/logit_guard.h"
#include "tests/fake_backend.h"
#include "tests/fake_tokenizer.h"

using namespace tern;

namespace {

constexpr int32_t kVocab = 8;

// Rows of logits set by the test; argmax() and top_logits() read them as a backend would.
class RowBackend : public test::FakeBackendBase {
public:
    std::vector<std::vector<float>> rows;
    int argmax_calls = 0;

    // Row `r` with a peak on `token`, and a lower one on `runner_up` (when >= 0).
    void peak(size_t r, int32_t token, int32_t runner_up = -1) {
        if (rows.size() <= r) rows.resize(r + 1);
        rows[r].assign(kVocab, 0.0f);
        rows[r][static_cast<size_t>(token)] = 10.0f;
        if (runner_up >= 0) rows[r][static_cast<size_t>(runner_up)] = 9.0f;
    }
    void forward(const ForwardBatch&) override {}
    std::span<const float> logits(int row) override { return rows.at(static_cast<size_t>(row)); }
    void argmax(std::span<int32_t> per_row) override {
        ++argmax_calls;
        for (size_t r = 0; r < per_row.size(); ++r) {
            const std::vector<float>& l = rows.at(r);
            per_row[r] = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
        }
    }
    size_t top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out) override {
        return select_top_logits(rows.at(static_cast<size_t>(row)), penalties, out);
    }
};

// 0: "", 1: BOS, 2: EOS, then "a".."e".
test::FakeTokenizer letters() {
    return test::FakeTokenizer({"", "", "", "a", "b", "c", "d", "e"});
}

GenerateOptions greedy(int32_t n_predict) {
    GenerateOptions o;
    o.n_predict = n_predict;
    o.sampling.temp = 0.0f;
    return o;
}

// The argmax of row `r` as the caller reads it for the decoder.
int32_t argmax_of(RowBackend& b, size_t r) {
    std::vector<int32_t> all(b.rows.size());
    b.argmax(all);
    return all[r];
}

// Proposes a fixed continuation, cut to what it is allowed; records what it was told.
class FixedDrafter : public Drafter {
public:
    std::vector<int32_t> guess;
    int32_t last_max = -1;
    std::vector<std::pair<int32_t, int32_t>> observed;
    void begin(std::span<const int32_t>) override {}
    void propose(std::span<const int32_t>, int32_t max_tokens, const DraftCost&, std::vector<int32_t>& out) override {
        last_max = max_tokens;
        out = guess; // longer than allowed on purpose: the decoder cuts it
    }
    void observe(int32_t proposed, int32_t accepted) override { observed.emplace_back(proposed, accepted); }
    std::string_view name() const override { return "fixed"; }
};

} // namespace

TEST_CASE("RequestDecoder: greedy takes the backend's argmax, streams the text and stops at n_predict") {
    RowBackend b;
    const test::FakeTokenizer tok = letters();
    const std::vector<int32_t> prompt = {1, 3};
    const GenerateOptions o = greedy(2);
    std::string shown;
    RequestDecoder d(
        b, tok, prompt, o,
        [&](std::string_view s) {
            shown += s;
            return true;
        },
        "");
    REQUIRE(d.wants_argmax());

    b.peak(0, 4);
    ProducedToken p = d.next(0, argmax_of(b, 0));
    CHECK(p.token == 4);
    CHECK_FALSE(p.stop);
    b.peak(0, 5);
    p = d.next(0, argmax_of(b, 0));
    CHECK(p.token == 5);
    REQUIRE(p.stop);
    CHECK(*p.stop == StopReason::length); // n_predict reached with this token
    CHECK(d.stream().history().size() == 4);

    const Completion c = d.finish(*p.stop);
    CHECK(c.stop_reason == StopReason::length);
    CHECK(c.tokens == std::vector<int32_t>{4, 5});
    CHECK(c.text == "bc");
    CHECK(shown == "bc");
    CHECK(c.logprobs.empty());
}

TEST_CASE("RequestDecoder: the stop rules come in order: cancel, n_predict, end of generation, stop strings") {
    RowBackend b;
    const test::FakeTokenizer tok = letters();
    const std::vector<int32_t> prompt = {1};
    b.peak(0, 2); // EOS

    SUBCASE("a raised cancel flag stops before the row is read") {
        std::atomic<bool> cancel{true};
        GenerateOptions o = greedy(-1);
        o.cancel = &cancel;
        RequestDecoder d(b, tok, prompt, o, {}, "");
        const ProducedToken p = d.next(0, 2);
        CHECK_FALSE(p.token);
        CHECK(p.stop == StopReason::cancelled);
    }
    SUBCASE("n_predict 0 stops before any token") {
        const GenerateOptions o = greedy(0);
        RequestDecoder d(b, tok, prompt, o, {}, "");
        const ProducedToken p = d.next(0, 2);
        CHECK_FALSE(p.token);
        CHECK(p.stop == StopReason::length);
    }
    SUBCASE("an end-of-generation token ends it and is not kept") {
        const GenerateOptions o = greedy(-1);
        RequestDecoder d(b, tok, prompt, o, {}, "");
        const ProducedToken p = d.next(0, argmax_of(b, 0));
        CHECK_FALSE(p.token);
        CHECK(p.stop == StopReason::eos);
        CHECK(d.finish(*p.stop).tokens.empty());
    }
    SUBCASE("a stop string ends it, trimmed from the text") {
        GenerateOptions o = greedy(-1);
        o.stop = {"cd"};
        RequestDecoder d(b, tok, prompt, o, {}, "");
        std::optional<StopReason> stop;
        for (const int32_t t : {4, 5, 6, 7}) { // b c d e
            b.peak(0, t);
            stop = d.next(0, argmax_of(b, 0)).stop;
            if (stop) break;
        }
        REQUIRE(stop);
        CHECK(*stop == StopReason::stop);
        const Completion c = d.finish(*stop);
        CHECK(c.text == "b");
        CHECK(c.stop_reason == StopReason::stop);
    }
}

TEST_CASE("RequestDecoder: penalties take the candidates path, so a repeated token gives way") {
    RowBackend b;
    const test::FakeTokenizer tok = letters();
    const std::vector<int32_t> prompt = {1, 4}; // "b" already in the history
    GenerateOptions o = greedy(-1);
    o.sampling.repeat_penalty = 100.0f;
    o.sampling.repeat_last_n = 64;
    RequestDecoder d(b, tok, prompt, o, {}, "");
    CHECK_FALSE(d.wants_argmax());
    b.peak(0, 4, 6);                       // "b" best on the raw row, "d" second
    const ProducedToken p = d.next(0, -1); // no argmax given: the decoder must not need it
    CHECK(p.token == 6);
    CHECK(b.argmax_calls == 0);
}

TEST_CASE("RequestDecoder: log-probabilities follow the tokens and their top candidates") {
    RowBackend b;
    const test::FakeTokenizer tok = letters();
    const std::vector<int32_t> prompt = {1};
    GenerateOptions o = greedy(2);
    o.logprobs = 2;
    RequestDecoder d(b, tok, prompt, o, {}, "");
    b.peak(0, 3, 5);
    d.next(0, argmax_of(b, 0));
    b.peak(0, 7, 3);
    const ProducedToken p = d.next(0, argmax_of(b, 0));
    const Completion c = d.finish(*p.stop);
    REQUIRE(c.logprobs.size() == 2);
    CHECK(c.logprobs[0].token == 3);
    CHECK(c.logprobs[1].token == 7);
    REQUIRE(c.logprobs[1].top.size() == 2);
    CHECK(c.logprobs[1].top[0].id == 7);
    CHECK(c.logprobs[1].top[1].id == 3);
    CHECK(c.logprobs[0].logprob > c.logprobs[0].top[1].logprob);
}

TEST_CASE("RequestDecoder: a row that is not finite is refused before it is sampled") {
    RowBackend b;
    const test::FakeTokenizer tok = letters();
    const std::vector<int32_t> prompt = {1};
    const GenerateOptions o = greedy(-1);
    RequestDecoder d(b, tok, prompt, o, {}, "model.gguf");
    b.peak(0, 3);
    b.peak(1, 4);
    CHECK_NOTHROW(d.check_rows(0, 2, 5));
    b.rows[1][2] = NAN;
    try {
        d.check_rows(0, 2, 5);
        FAIL("a NaN row passed");
    } catch (const NonFiniteLogits& e) {
        CHECK(e.position == 6); // the second row: the token at position first_pos + 1
        CHECK(e.model == "model.gguf");
        CHECK(e.fault == LogitFault::nan);
    }
    CHECK_NOTHROW(d.check_rows(0, 1, 5));
}

TEST_CASE("RequestDecoder: speculative steps draft within the limits and keep the confirmed drafts") {
    RowBackend b;
    const test::FakeTokenizer tok = letters();
    const std::vector<int32_t> prompt = {1};
    FixedDrafter drafter;
    drafter.guess = {4, 5, 6, 7};
    GenerateOptions o = greedy(4);
    o.drafter = &drafter;
    RequestDecoder d(b, tok, prompt, o, {}, "");

    b.peak(0, 3);
    REQUIRE_FALSE(d.next(0, argmax_of(b, 0)).stop); // "a": 1 generated, 3 left
    std::vector<int32_t> step;
    d.next_step(/*cache_room=*/10, DraftCost{}, step);
    CHECK(drafter.last_max == 2); // 3 left after the newest token: it and at most 2 drafts
    CHECK(step == std::vector<int32_t>{3, 4, 5});
    d.next_step(/*cache_room=*/1, DraftCost{}, step); // the cache is tighter than n_predict
    CHECK(step == std::vector<int32_t>{3, 4});

    // The forward of {3, 4, 5}: row 0 confirms 4, row 1 says 6 instead of 5.
    b.peak(0, 4);
    b.peak(1, 6);
    b.peak(2, 7);
    std::vector<int32_t> argmax(3);
    b.argmax(argmax);
    const std::vector<int32_t> drafts = {4, 5};
    const AcceptedDrafts a = d.accept(drafts, argmax);
    CHECK(a.accepted == 1);
    CHECK_FALSE(a.stop);
    CHECK(d.n_drafted() == 2);
    CHECK(d.n_accepted() == 1);
    REQUIRE(drafter.observed.size() == 1);
    CHECK(drafter.observed[0] == std::pair<int32_t, int32_t>{2, 1});
    const std::span<const int32_t> gen = d.stream().generated();
    CHECK(std::vector<int32_t>(gen.begin(), gen.end()) == std::vector<int32_t>{3, 4, 6});

    const GenerateOptions plain = greedy(-1);
    RequestDecoder alone(b, tok, prompt, plain, {}, "");
    b.peak(0, 3);
    alone.next(0, argmax_of(b, 0));
    alone.next_step(10, DraftCost{}, step);
    CHECK(step == std::vector<int32_t>{3}); // no drafter: the newest token alone
}

TEST_CASE("the empty-prompt, context and prefix rules") {
    const test::FakeTokenizer tok = letters();
    std::vector<int32_t> tokens;
    CHECK(start_empty_prompt(tokens, tok));
    CHECK(tokens == std::vector<int32_t>{1});
    tokens = {5};
    CHECK(start_empty_prompt(tokens, tok));
    CHECK(tokens == std::vector<int32_t>{5}); // a prompt with tokens is left as it is
    tokens.clear();
    CHECK_FALSE(start_empty_prompt(tokens, tok, /*bos_allowed=*/false));
    CHECK(tokens.empty());
    CHECK(empty_prompt_refusal() == "the prompt is empty and the model has no BOS token to start from");

    CHECK(prompt_over_context(8, 8).empty());
    CHECK(prompt_over_context(9, 8) == "the prompt has 9 tokens but the context is 8");

    const std::vector<int32_t> held = {1, 3, 4, 5};
    CHECK(shared_prefix(held, std::vector<int32_t>{1, 3, 4, 6}, 10) == 3);
    CHECK(shared_prefix(held, std::vector<int32_t>{1, 3, 4, 5, 6}, 4) == 4);
    CHECK(shared_prefix(held, std::vector<int32_t>{1, 3, 4, 5, 6}, 2) == 2); // the limit
    CHECK(shared_prefix(held, std::vector<int32_t>{1, 3}, 10) == 2);         // the shorter of the two
    CHECK(shared_prefix(held, std::vector<int32_t>{2}, 10) == 0);
}
