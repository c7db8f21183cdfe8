// Several sequences over the CUDA backend's paged KV cache (engine/cuda/kv_cache_cuda.h), under the CUDA
// emulator: the same script of multi-sequence forwards (interleaved sequences of different lengths across
// page boundaries, a fork with copy on write, truncate, free and reuse of pages) against the CPU backend's
// sequences; batch invariance bit for bit (a sequence's logits alone and among others, in forwards of fewer
// and of more than 16 tokens, where a single-sequence forward would switch to the GEMM kernels, a mixture of
// experts' two ways to run its experts included); and the batching engine giving each request the tokens it
// gets alone.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/batch/batch_engine.h"
#include "engine/cpu/backend_cpu.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/generation/session.h"
#include "engine/model.h"
#include "engine/text/tokenizer.h"
#include "engine/tools/synth.h"
#include "tests/batch_alone_check.h"
#include "tests/sequence_test_data.h"
#include "tests/synth_file.h"
#include "tests/test_support.h"

namespace tern {
namespace {

// As tests/cuda/test_cuda_backend.cpp: exact arithmetic on both sides, so they differ by f32 summation order only.
constexpr double kLogitTolerance = 1e-3;

const char* const kStories = "models/gguf/stories260K-f32.gguf";
const char* const kLlama2xs = "models/gguf/llama2xs-tok512-q8_0.gguf";

std::unique_ptr<Backend> load_backend(std::unique_ptr<Backend> b, const Model& m, int32_t n_ctx, int32_t pool) {
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_pool_positions = pool;
    b->load(m.config, m.weights, run);
    return b;
}

std::unique_ptr<Backend> cuda_backend(const Model& m, bool exact, int32_t n_ctx, int32_t pool) {
    CudaOptions o;
    o.exact_matmul = exact;
    return load_backend(std::make_unique<CudaBackend>(o), m, n_ctx, pool);
}

using Part = test::SequencePart;
using test::argmax_of;
using test::clear_winner;
using test::forward_parts;
using test::normalised_error;
using test::same_bits;

// The script both backends run: every step's kept rows, compared by the caller.
void run_script(Backend& b, const Model& m, const std::function<void(Backend&, const std::vector<Part>&)>& step) {
    const std::vector<int32_t> p0 = test::random_tokens(m, 12, 1);
    const std::vector<int32_t> p1 = test::random_tokens(m, 140, 2);
    const std::vector<int32_t> d = test::random_tokens(m, 6, 3);
    b.seq_create(1);
    // Sequence 1's prompt crosses a page (128 positions) in two chunks; sequence 0 decodes beside it.
    step(b, {{0, p0, LogitsWanted::all}, {1, {p1.begin(), p1.begin() + 90}}});
    step(b, {{1, {p1.begin() + 90, p1.end()}}, {0, {d[0]}}});
    // Sequence 2 shares 133 positions of sequence 1 and writes into the shared page 1: copy on write.
    b.seq_fork(1, 2, 133);
    step(b, {{2, {d[1], d[2]}}, {1, {d[3]}}, {0, {d[4]}}});
    // Sequence 1 forgets its last 41 positions (page 1 goes back) and goes on from there.
    b.seq_truncate(1, 100);
    step(b, {{1, {d[5], d[0]}, LogitsWanted::all}, {2, {d[3]}}});
    // Sequence 2 goes; sequence 3 takes its pages.
    b.seq_free(2);
    b.seq_create(3);
    step(b, {{3, {p1.begin(), p1.begin() + 20}}, {0, {d[1]}}, {1, {d[2]}}});
    step(b, {{0, {d[2]}}, {3, {d[4]}}});
}

void check_against_cpu(const Model& m) {
    auto cpu = load_backend(std::make_unique<CpuBackend>(CpuOptions{2, true}), m, 256, 4 * 256);
    auto cuda = cuda_backend(m, true, 256, 4 * 256);
    std::vector<std::vector<std::vector<float>>> want;
    std::vector<KvPoolUse> want_pool;
    run_script(*cpu, m, [&](Backend& b, const std::vector<Part>& parts) {
        want.push_back(forward_parts(b, parts));
        want_pool.push_back(b.kv_pool());
    });
    size_t s = 0;
    run_script(*cuda, m, [&](Backend& b, const std::vector<Part>& parts) {
        CAPTURE(s);
        const std::vector<std::vector<float>> got = forward_parts(b, parts);
        REQUIRE(got.size() == want[s].size());
        for (size_t r = 0; r < got.size(); ++r) {
            CAPTURE(r);
            CHECK(normalised_error(got[r], want[s][r]) < kLogitTolerance);
            if (clear_winner(want[s][r])) CHECK(argmax_of(got[r]) == argmax_of(want[s][r]));
        }
        CHECK(b.kv_pool().pages_in_use == want_pool[s].pages_in_use);
        ++s;
    });
    CHECK(s == want.size());
    for (int32_t seq : {0, 1, 3}) CHECK(cuda->seq_n_past(seq) == cpu->seq_n_past(seq));
    // argmax on the device over the last forward's rows, as the CPU's.
    std::vector<int32_t> ids(2), cpu_ids(2);
    cuda->argmax(ids);
    cpu->argmax(cpu_ids);
    for (size_t r = 0; r < ids.size(); ++r)
        if (clear_winner(want.back()[r])) CHECK(ids[r] == cpu_ids[r]);
}

void check_against_cpu(const char* file) {
    CAPTURE(std::string(file));
    check_against_cpu(load_model(test::shared_path(file).string()));
}

} // namespace

TEST_CASE("CUDA sequences: a multi-sequence script gives the CPU backend's logits and pages") {
    if (!test::shared_available()) return;
    check_against_cpu(kStories);
    check_against_cpu(kLlama2xs);
}

TEST_CASE("CUDA sequences: gpt-oss's sinks, windows and biased experts in a multi-sequence script: the CPU's logits") {
    // attention_tokens with the sinks, windows of 16 on the even layers (the script's sequences reach 140
    // positions), the biased experts grouped and by slot on per-column kernels.
    test::TempDir dir;
    check_against_cpu(load_model(synth_file(dir, "tiny-gpt-oss", "f32")));
}

TEST_CASE("CUDA sequences: a sequence's logits are the same bits alone and among others") {
    if (!test::shared_available()) return;
    const Model m = load_model(test::shared_path(kLlama2xs).string());
    // The default arithmetic (int8 activations): a single-sequence forward of 16 tokens or more would take
    // the tensor-core GEMM. Sequence A alone runs forwards of 10, 1 and 1 tokens; among others the same
    // spans share forwards of 40, 19 and 2 tokens, and B's and C's rows are checked the same way.
    const std::vector<int32_t> a = test::random_tokens(m, 12, 4);
    const std::vector<int32_t> bt = test::random_tokens(m, 31, 5);
    const std::vector<int32_t> c = test::random_tokens(m, 18, 6);
    const std::vector<int32_t> a0(a.begin(), a.begin() + 10);
    auto alone = [&](const std::vector<std::vector<int32_t>>& chunks) {
        auto b = cuda_backend(m, false, 256, 256);
        std::vector<std::vector<float>> rows;
        for (const auto& chunk : chunks) rows.push_back(forward_parts(*b, {{0, chunk}})[0]);
        return rows;
    };
    const auto ra = alone({a0, {a[10]}, {a[11]}});
    const auto rb = alone({{bt.begin(), bt.begin() + 30}, {bt[30]}});
    const auto rc = alone({{c.begin(), c.begin() + 17}, {c[17]}});

    auto b = cuda_backend(m, false, 256, 3 * 256);
    b->seq_create(1);
    b->seq_create(2);
    const auto s1 = forward_parts(*b, {{0, a0}, {1, {bt.begin(), bt.begin() + 30}}});
    const auto s2 = forward_parts(*b, {{0, {a[10]}}, {2, {c.begin(), c.begin() + 17}}, {1, {bt[30]}}});
    const auto s3 = forward_parts(*b, {{2, {c[17]}}, {0, {a[11]}}});
    CHECK(same_bits(s1[0], ra[0]));
    CHECK(same_bits(s1[1], rb[0]));
    CHECK(same_bits(s2[0], ra[1]));
    CHECK(same_bits(s2[1], rc[0]));
    CHECK(same_bits(s2[2], rb[1]));
    CHECK(same_bits(s3[0], rc[1]));
    CHECK(same_bits(s3[1], ra[2]));
}

TEST_CASE("CUDA sequences: a mixture of experts gives a sequence the same bits alone and among others") {
    // Alone, 10 tokens then 1 run the experts by slot (backend_cuda_moe.cpp); among others the same spans share
    // a forward of 40 tokens, which groups the slots by expert: both on per-column kernels, so the same bits.
    test::TempDir dir;
    const Model m = load_model(synth_file(dir, "tiny-qwen3moe", "q4_k_m"));
    const std::vector<int32_t> a = test::random_tokens(m, 11, 7);
    const std::vector<int32_t> bt = test::random_tokens(m, 30, 8);
    const std::vector<int32_t> a0(a.begin(), a.begin() + 10);
    for (const bool exact : {false, true}) {
        CAPTURE(exact);
        std::vector<std::vector<float>> ra;
        {
            auto b = cuda_backend(m, exact, 256, 256);
            ra.push_back(forward_parts(*b, {{0, a0}})[0]);
            ra.push_back(forward_parts(*b, {{0, {a[10]}}})[0]);
        }
        auto b = cuda_backend(m, exact, 256, 2 * 256);
        b->seq_create(1);
        const auto s1 = forward_parts(*b, {{1, bt}, {0, a0}});
        const auto s2 = forward_parts(*b, {{0, {a[10]}}, {1, {bt[0]}}});
        CHECK(same_bits(s1[1], ra[0]));
        CHECK(same_bits(s2[0], ra[1]));
    }
}

TEST_CASE("CUDA sequences: the batching engine gives each request the tokens it gets alone") {
    if (!test::shared_available()) return;
    auto model = std::make_shared<Model>(load_model(test::shared_path(kLlama2xs).string()));
    auto session = [&](int32_t contexts) {
        auto backend = cuda_backend(*model, false, 128, contexts * 128);
        REQUIRE(backend->supports_sequences());
        return std::make_unique<Session>(std::move(backend), Tokenizer::from_gguf(model->file), 128, model);
    };
    const std::vector<std::string> texts = {"Once upon a time", "The little dog ran to the park and saw a big tree",
                                            "Tom and Lily"};
    std::vector<std::vector<int32_t>> prompts;
    for (const std::string& t : texts) prompts.push_back(Tokenizer::from_gguf(model->file)->encode(t, {true, true}));
    CHECK(test::check_batched_as_alone(session, prompts, 8) == 3);
}

} // namespace tern
