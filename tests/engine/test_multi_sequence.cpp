// Several sequences in one forward over the paged KV cache (engine/backend.h SequenceSpan, the CPU
// backend): each sequence's logits are the same bits as when it runs alone, whatever else shares the
// batch (batch invariance), prefixes shared by seq_fork included, and bad batches are refused.
#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/backend_factory.h"
#include "engine/load_errors.h"
#include "engine/model.h"
#include "tests/sequence_test_data.h"
#include "tests/test_support.h"

namespace tern {
namespace {

std::unique_ptr<Backend> cpu_backend(const Model& m, int32_t n_ctx, int32_t pool, int threads) {
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_pool_positions = pool;
    std::unique_ptr<Backend> b = make_backend("cpu", CpuOptions{threads, false});
    b->load(m.config, m.weights, run);
    return b;
}

// The last logits after feeding `chunks` one forward each to a backend of its own: the reference.
std::vector<std::vector<float>> alone(const Model& m, const std::vector<std::vector<int32_t>>& chunks, int threads) {
    auto b = cpu_backend(m, 512, 0, threads);
    std::vector<std::vector<float>> out;
    for (const std::vector<int32_t>& c : chunks) {
        ForwardBatch batch;
        batch.tokens = c;
        batch.pos0 = b->n_past();
        b->forward(batch);
        out.push_back(test::logit_row(*b, 0));
    }
    return out;
}

using test::same_bits;

void check_batched_equals_alone(const Model& m, int threads) {
    // Three sequences: prompts across page boundaries (128 positions), fed in chunks of different sizes,
    // then decoded a token at a time, all in shared forwards.
    const std::vector<int32_t> p0 = test::random_tokens(m, 5, 1);
    const std::vector<int32_t> p1 = test::random_tokens(m, 140, 2);
    const std::vector<int32_t> p2 = test::random_tokens(m, 270, 3);
    const std::vector<int32_t> d = test::random_tokens(m, 3, 4);
    // seq 0: p0, then d[0], d[1], d[2]; seq 1: p1 in two chunks, then d[0], d[1];
    // seq 2: p2 in chunks of 100 and 170, then d[2].
    const std::vector<int32_t> p1a(p1.begin(), p1.begin() + 90), p1b(p1.begin() + 90, p1.end());
    const std::vector<int32_t> p2a(p2.begin(), p2.begin() + 100), p2b(p2.begin() + 100, p2.end());
    const auto r0 = alone(m, {p0, {d[0]}, {d[1]}, {d[2]}}, threads);
    const auto r1 = alone(m, {p1a, p1b, {d[0]}, {d[1]}}, threads);
    const auto r2 = alone(m, {p2a, p2b, {d[2]}}, threads);

    auto b = cpu_backend(m, 512, 3 * 512, threads);
    REQUIRE(b->supports_sequences());
    b->seq_create(1);
    b->seq_create(2);
    struct Step {
        std::vector<std::pair<int32_t, std::vector<int32_t>>> parts;   // (seq, tokens)
        std::vector<const std::vector<float>*> expect;                 // per part
    };
    const std::vector<Step> steps = {
        {{{0, p0}, {1, p1a}, {2, p2a}}, {&r0[0], &r1[0], &r2[0]}},
        {{{2, p2b}, {0, {d[0]}}, {1, p1b}}, {&r2[1], &r0[1], &r1[1]}},
        {{{1, {d[0]}}, {0, {d[1]}}, {2, {d[2]}}}, {&r1[2], &r0[2], &r2[2]}},
        {{{0, {d[2]}}, {1, {d[1]}}}, {&r0[3], &r1[3]}},
    };
    for (size_t s = 0; s < steps.size(); ++s) {
        CAPTURE(s);
        std::vector<int32_t> toks;
        std::vector<SequenceSpan> spans;
        for (const auto& [seq, t] : steps[s].parts) {
            toks.insert(toks.end(), t.begin(), t.end());
            spans.push_back({seq, static_cast<int32_t>(t.size()), LogitsWanted::last});
        }
        ForwardBatch batch;
        batch.tokens = toks;
        batch.spans = spans;
        b->forward(batch);
        for (size_t p = 0; p < steps[s].parts.size(); ++p) {
            CAPTURE(p);
            CHECK(same_bits(test::logit_row(*b, static_cast<int>(p)), *steps[s].expect[p]));
        }
    }
    CHECK(b->seq_n_past(0) == 8);
    CHECK(b->seq_n_past(1) == 142);
    CHECK(b->seq_n_past(2) == 271);
    const KvPoolUse use = b->kv_pool();
    CHECK(use.positions_per_page == 128);
    CHECK(use.pages_in_use == 1 + 2 + 3);
    b->seq_free(2);
    CHECK(b->kv_pool().pages_in_use == 3);
}

} // namespace

TEST_CASE("a multi-sequence forward gives each sequence the bits it gets alone") {
    if (!test::shared_available()) return;
    for (const char* file : {"models/gguf/stories260K-f32.gguf", "models/gguf/llama2xs-tok512-q4_k_m.gguf",
                             "models/gguf/babyllama-tok105-q8_0.gguf"}) {
        CAPTURE(std::string(file));
        const Model m = load_model(test::shared_path(file).string());
        for (int threads : {1, 2}) {
            CAPTURE(threads);
            check_batched_equals_alone(m, threads);
        }
    }
}

TEST_CASE("seq_fork shares a prefix: both sequences go on as if each had computed it") {
    if (!test::shared_available()) return;
    const Model m = load_model(test::shared_path("models/gguf/llama2xs-tok512-q8_0.gguf").string());
    const std::vector<int32_t> prompt = test::random_tokens(m, 150, 9);
    const std::vector<int32_t> a = test::random_tokens(m, 2, 10);
    const std::vector<int32_t> c = test::random_tokens(m, 2, 11);
    const std::vector<int32_t> head(prompt.begin(), prompt.begin() + 133);
    const auto ra = alone(m, {prompt, a}, 2);
    const auto rc = alone(m, {head, c}, 2);
    auto b = cpu_backend(m, 512, 1024, 2);
    ForwardBatch first;
    first.tokens = prompt;
    b->forward(first);
    b->seq_fork(0, 1, 133);   // sequence 1 shares the first 133 positions, then diverges inside page 1
    CHECK(b->kv_pool().pages_in_use == 2);
    std::vector<int32_t> toks = a;
    toks.insert(toks.end(), c.begin(), c.end());
    const std::vector<SequenceSpan> spans = {{1, 2, LogitsWanted::last}, {0, 2, LogitsWanted::last}};
    const std::vector<int32_t> both = {c[0], c[1], a[0], a[1]};
    ForwardBatch step;
    step.tokens = both;
    step.spans = spans;
    b->forward(step);
    CHECK(same_bits(test::logit_row(*b, 0), rc[1]));
    CHECK(same_bits(test::logit_row(*b, 1), ra[1]));
    CHECK(b->kv_pool().pages_in_use == 3);   // sequence 1 copied the page it wrote into
    CHECK(b->seq_n_past(1) == 135);
    CHECK(b->n_past() == 152);
}

TEST_CASE("multi-sequence batches: bad spans are refused, an exhausted pool throws and keeps the positions") {
    if (!test::shared_available()) return;
    const Model m = load_model(test::shared_path("models/gguf/stories260K-f32.gguf").string());
    auto b = cpu_backend(m, 256, 256, 1);   // two pages in all
    b->seq_create(1);
    const std::vector<int32_t> t = test::random_tokens(m, 4, 5);
    ForwardBatch batch;
    batch.tokens = t;
    const std::vector<SequenceSpan> twice = {{1, 2, LogitsWanted::last}, {1, 2, LogitsWanted::last}};
    batch.spans = twice;
    CHECK_THROWS_AS(b->forward(batch), UsageError);
    const std::vector<SequenceSpan> short_of = {{0, 1, LogitsWanted::last}, {1, 2, LogitsWanted::last}};
    batch.spans = short_of;
    CHECK_THROWS_AS(b->forward(batch), UsageError);
    const std::vector<SequenceSpan> unknown = {{0, 2, LogitsWanted::last}, {7, 2, LogitsWanted::last}};
    batch.spans = unknown;
    CHECK_THROWS_AS(b->forward(batch), UsageError);
    const std::vector<SequenceSpan> empty_span = {{0, 0, LogitsWanted::last}, {1, 4, LogitsWanted::last}};
    batch.spans = empty_span;
    CHECK_THROWS_AS(b->forward(batch), UsageError);
    // Two sequences of 200 positions need four pages; the pool has two.
    const std::vector<int32_t> many = test::random_tokens(m, 400, 6);
    const std::vector<SequenceSpan> big = {{0, 200, LogitsWanted::last}, {1, 200, LogitsWanted::last}};
    batch.tokens = many;
    batch.spans = big;
    CHECK_THROWS_AS(b->forward(batch), KvPoolExhausted);
    CHECK(b->seq_n_past(0) == 0);
    CHECK(b->seq_n_past(1) == 0);
    CHECK_THROWS_AS(b->seq_free(0), UsageError);
    CHECK_THROWS_AS(b->seq_truncate(1, 1), UsageError);
}

} // namespace tern
