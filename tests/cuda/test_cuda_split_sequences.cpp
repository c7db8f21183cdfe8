// Partial offload (engine/split_backend.h, -ngl) with sequences, under the CUDA emulator: a SplitBackend of
// the CPU backend (the first layers) and the CUDA backend (the last ones) runs a script of multi-sequence
// forwards (interleaved sequences across a page boundary, a fork with copy on write, truncate, free, a range
// saved, forgotten and appended again) and gives every row the bits the same script gives when
// each sequence's part has a forward of its own (batch invariance), and the CPU backend's logits and page
// use; a second part that fails a forward leaves both parts' caches where they were; the batching engine
// over a split backend runs several requests in one forward, each getting the tokens it gets alone.
#include <doctest/doctest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/batch/batch_engine.h"
#include "engine/cpu/backend_cpu.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/generation/session.h"
#include "engine/load_errors.h"
#include "engine/model.h"
#include "engine/split_backend.h"
#include "engine/text/tokenizer.h"
#include "engine/tools/synth.h"
#include "tests/batch_alone_check.h"
#include "tests/quick_mode.h"
#include "tests/sequence_test_data.h"
#include "tests/test_support.h"

namespace tern {
namespace {

// As tests/test_cuda_backend.cpp: exact arithmetic on both sides, so they differ by f32 summation order only.
constexpr double kLogitTolerance = 1e-3;

Model synth_model(const test::TempDir& dir, const std::string& shape, const std::string& type) {
    const std::string path = (dir / (shape + "-" + type + ".gguf")).string();
    SynthOptions so;
    so.shape = shape;
    so.type = type;
    so.n_threads = 1;
    so.on_warning = [](const std::string&) {};
    write_synth_model(so, path);
    return load_model(path);
}

RunOptions run_options(int32_t n_ctx, int32_t pool) {
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_pool_positions = pool;
    return run;
}

// A second part that can be told to fail its next forward (as a device out of pages would), to see the
// split take back what the first part wrote, or to report a fuller pool than the first part's.
class FailingPart final : public Backend {
public:
    explicit FailingPart(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
    bool fail_next_forward = false;
    int32_t pages_withheld = 0;   // pages of the pool kv_pool() says are in use besides the real ones

    MemoryNeed plan_memory(const ModelConfig& c, const ModelWeights& w, const MemoryRequest& r) const override {
        return inner_->plan_memory(c, w, r);
    }
    std::vector<MemoryLimit> memory_limits() const override { return inner_->memory_limits(); }
    void load(const ModelConfig& c, const ModelWeights& w, const RunOptions& o) override { inner_->load(c, w, o); }
    void forward(const ForwardBatch& batch) override {
        if (std::exchange(fail_next_forward, false)) throw KvPoolExhausted(1, 0);
        inner_->forward(batch);
    }
    std::span<const float> logits(int row) override { return inner_->logits(row); }
    void argmax(std::span<int32_t> per_row) override { inner_->argmax(per_row); }
    int32_t n_past() const override { return inner_->n_past(); }
    void kv_truncate(int32_t n) override { inner_->kv_truncate(n); }
    KvSnapshot kv_save(int32_t n) const override { return inner_->kv_save(n); }
    void kv_load(const KvSnapshot& s) override { inner_->kv_load(s); }
    bool supports_sequences() const override { return inner_->supports_sequences(); }
    void seq_create(int32_t seq) override { inner_->seq_create(seq); }
    void seq_free(int32_t seq) override { inner_->seq_free(seq); }
    void seq_fork(int32_t src, int32_t dst, int32_t n) override { inner_->seq_fork(src, dst, n); }
    int32_t seq_n_past(int32_t seq) const override { return inner_->seq_n_past(seq); }
    void seq_truncate(int32_t seq, int32_t n) override { inner_->seq_truncate(seq, n); }
    KvSnapshot seq_save_range(int32_t seq, int32_t b, int32_t e) const override {
        return inner_->seq_save_range(seq, b, e);
    }
    void seq_append(int32_t seq, const KvSnapshot& r) override { inner_->seq_append(seq, r); }
    KvPoolUse kv_pool() const override {
        KvPoolUse use = inner_->kv_pool();
        use.pages_in_use += pages_withheld;
        return use;
    }
    DeviceKind device_kind() const override { return inner_->device_kind(); }
    std::string device_name() const override { return inner_->device_name(); }

private:
    std::unique_ptr<Backend> inner_;
};

// The split and, for the tests that look inside it, its two parts.
struct Split {
    std::unique_ptr<SplitBackend> backend;
    CpuBackend* cpu = nullptr;
    FailingPart* gpu = nullptr;
};

Split split_backend(const Model& m, int32_t gpu_layers, bool exact, int32_t n_ctx, int32_t pool) {
    CudaOptions o;
    o.exact_matmul = exact;
    auto cpu = std::make_unique<CpuBackend>(CpuOptions{2, exact});
    auto gpu = std::make_unique<FailingPart>(std::make_unique<CudaBackend>(o));
    Split s{nullptr, cpu.get(), gpu.get()};
    s.backend = std::make_unique<SplitBackend>(std::move(cpu), std::move(gpu), gpu_layers);
    s.backend->load(m.config, m.weights, run_options(n_ctx, pool));
    REQUIRE(s.backend->cpu_layers() == m.config.n_layers - gpu_layers);
    REQUIRE(s.backend->supports_sequences());
    return s;
}

using Part = test::SequencePart;

// The same rows with a forward for each part.
std::vector<std::vector<float>> forward_each(Backend& b, const std::vector<Part>& parts) {
    std::vector<std::vector<float>> rows;
    for (const Part& p : parts)
        for (std::vector<float>& r : test::forward_parts(b, {p})) rows.push_back(std::move(r));
    return rows;
}

// What a script step hands the backend: its parts, forwarded together or one by one.
using Step = std::function<std::vector<std::vector<float>>(Backend&, const std::vector<Part>&)>;

// Every step's kept rows and, after it, the pool's pages in use.
struct ScriptRun {
    std::vector<std::vector<std::vector<float>>> rows;
    std::vector<int32_t> pages_in_use;
};

ScriptRun run_script(Backend& b, const Model& m, const Step& step) {
    const std::vector<int32_t> p0 = test::random_tokens(m, 12, 1);
    const std::vector<int32_t> p1 = test::random_tokens(m, 140, 2);
    const std::vector<int32_t> d = test::random_tokens(m, 6, 3);
    ScriptRun run;
    auto record = [&](const std::vector<Part>& parts) {
        run.rows.push_back(step(b, parts));
        run.pages_in_use.push_back(b.kv_pool().pages_in_use);
    };
    b.seq_create(1);
    // Sequence 1's prompt crosses a page (128 positions) in two chunks; sequence 0 decodes beside it.
    record({{0, p0, LogitsWanted::all}, {1, {p1.begin(), p1.begin() + 90}}});
    record({{1, {p1.begin() + 90, p1.end()}}, {0, {d[0]}}});
    // Sequence 2 shares 133 positions of sequence 1 and writes into the shared page 1: copy on write.
    b.seq_fork(1, 2, 133);
    record({{2, {d[1], d[2]}}, {1, {d[3]}}, {0, {d[4]}}});
    // Sequence 1 forgets its last 41 positions (page 1 goes back) and goes on from there.
    b.seq_truncate(1, 100);
    record({{1, {d[5], d[0]}, LogitsWanted::all}, {2, {d[3]}}});
    // Sequence 2 goes and sequence 3 starts in its pages; sequence 0's last 4 positions are saved, forgotten
    // and appended again (the on-disk prefix cache's way).
    b.seq_free(2);
    b.seq_create(3);
    const KvSnapshot tail = b.seq_save_range(0, 10, 14);
    b.seq_truncate(0, 10);
    b.seq_append(0, tail);
    record({{3, {d[4], d[5]}}, {0, {d[1]}}, {1, {d[2]}}});
    record({{0, {d[2]}}, {3, {d[0]}}});
    return run;
}

void check_script(const Model& m, int32_t gpu_layers) {
    CAPTURE(gpu_layers);
    CpuBackend cpu(CpuOptions{2, true});
    cpu.load(m.config, m.weights, run_options(256, 4 * 256));
    const ScriptRun want = run_script(cpu, m, test::forward_parts);
    const ScriptRun alone = run_script(*split_backend(m, gpu_layers, true, 256, 4 * 256).backend, m, forward_each);
    Split split = split_backend(m, gpu_layers, true, 256, 4 * 256);
    const ScriptRun got = run_script(*split.backend, m, test::forward_parts);
    REQUIRE(got.rows.size() == want.rows.size());
    for (size_t s = 0; s < got.rows.size(); ++s) {
        CAPTURE(s);
        REQUIRE(got.rows[s].size() == want.rows[s].size());
        for (size_t r = 0; r < got.rows[s].size(); ++r) {
            CAPTURE(r);
            CHECK(test::same_bits(got.rows[s][r], alone.rows[s][r]));
            CHECK(test::normalised_error(got.rows[s][r], want.rows[s][r]) < kLogitTolerance);
            if (test::clear_winner(want.rows[s][r]))
                CHECK(test::argmax_of(got.rows[s][r]) == test::argmax_of(want.rows[s][r]));
        }
        CHECK(got.pages_in_use[s] == want.pages_in_use[s]);
    }
    for (int32_t seq : {0, 1, 3}) {
        CAPTURE(seq);
        CHECK(split.backend->seq_n_past(seq) == cpu.seq_n_past(seq));
        CHECK(split.cpu->seq_n_past(seq) == cpu.seq_n_past(seq));
    }
    CHECK_THROWS_AS(split.backend->seq_n_past(2), UsageError);   // freed in both parts
    CHECK_THROWS_AS(split.cpu->seq_n_past(2), UsageError);

    // A range in the one snapshot format: the CPU backend's range appended to the split comes back out as
    // the same bytes (its first layers from the CPU part, the rest from the GPU's).
    const KvSnapshot range = cpu.seq_save_range(0, 10, 15);
    split.backend->seq_truncate(0, 10);
    split.backend->seq_append(0, range);
    CHECK(split.backend->seq_n_past(0) == 15);
    CHECK(split.cpu->seq_n_past(0) == 15);
    CHECK(split.backend->seq_save_range(0, 10, 15).bytes == range.bytes);
    // Any sequence's ranges (the on-disk prefix cache feeding the batching engine's requests): another
    // sequence's range appended to a new one comes back out as the same bytes, in both parts.
    split.backend->seq_create(5);
    const KvSnapshot other = cpu.seq_save_range(1, 0, 4);
    split.backend->seq_append(5, other);
    CHECK(split.backend->seq_n_past(5) == 4);
    CHECK(split.cpu->seq_n_past(5) == 4);
    CHECK(split.backend->seq_save_range(5, 0, 4).bytes == other.bytes);
    // A range that does not start where the sequence ends is refused before either part changed.
    CHECK_THROWS_AS(split.backend->seq_append(5, other), UsageError);
    CHECK(split.backend->seq_n_past(5) == 4);
    CHECK(split.cpu->seq_n_past(5) == 4);
    CHECK(split.cpu->kv_pool().pages_in_use == split.gpu->kv_pool().pages_in_use);
}

} // namespace

TEST_CASE("split sequences: a multi-sequence script gives each sequence its bits alone and the CPU's logits") {
    // gemma2: windows of 16 on the even layers (the script's sequences reach 142 positions), post-norms and
    // softcaps. The GPU takes a local layer and a global one; TERN_TEST_QUICK=1 (the ASan+UBSan run, where the
    // emulator is slowest): the global one only.
    test::TempDir dir;
    const Model m = synth_model(dir, "tiny-gemma2", "q8_0");
    REQUIRE(m.config.n_layers == 4);
    REQUIRE(m.config.layers[2].sliding_window == 16);
    REQUIRE(m.config.layers[3].sliding_window == 0);
    check_script(m, test::quick_mode() ? 1 : 2);
}

TEST_CASE("split sequences: a failed forward in the second part takes back the first's; the tighter pool counts") {
    test::TempDir dir;
    const Model m = synth_model(dir, "tiny", "q8_0");
    const std::vector<int32_t> a = test::random_tokens(m, 20, 4);
    const std::vector<int32_t> b = test::random_tokens(m, 30, 5);
    const std::vector<Part> first = {{0, {a.begin(), a.begin() + 19}}, {1, {b.begin(), b.begin() + 29}}};
    const std::vector<Part> second = {{1, {b[29]}}, {0, {a[19]}}};
    Split want = split_backend(m, 1, false, 128, 2 * 128);
    want.backend->seq_create(1);
    test::forward_parts(*want.backend, first);
    const std::vector<std::vector<float>> rows = test::forward_parts(*want.backend, second);

    Split split = split_backend(m, 1, false, 128, 2 * 128);
    split.backend->seq_create(1);
    for (const std::vector<Part>* step : {&first, &second}) {
        split.gpu->fail_next_forward = true;
        const int32_t past0 = split.backend->seq_n_past(0), past1 = split.backend->seq_n_past(1);
        CHECK_THROWS_AS(test::forward_parts(*split.backend, *step), KvPoolExhausted);
        CHECK(split.cpu->seq_n_past(0) == past0);
        CHECK(split.cpu->seq_n_past(1) == past1);
        CHECK(split.backend->seq_n_past(0) == past0);
        CHECK(split.backend->seq_n_past(1) == past1);
        test::forward_parts(*split.backend, *step);   // the step again, on caches that are as they were
    }
    CHECK(test::same_bits(test::logit_row(*split.backend, 0), rows[0]));
    CHECK(test::same_bits(test::logit_row(*split.backend, 1), rows[1]));
    // A plain batch (sequence 0 alone) the same way.
    split.gpu->fail_next_forward = true;
    ForwardBatch plain;
    const std::vector<int32_t> token = {a[0]};
    plain.tokens = token;
    plain.pos0 = split.backend->n_past();
    CHECK_THROWS_AS(split.backend->forward(plain), KvPoolExhausted);
    CHECK(split.cpu->n_past() == plain.pos0);
    // The pool a step must fit is the part with the fewer free pages.
    CHECK(split.backend->kv_pool().pages_in_use == split.cpu->kv_pool().pages_in_use);
    split.gpu->pages_withheld = 1;
    CHECK(split.backend->kv_pool().pages_in_use == split.cpu->kv_pool().pages_in_use + 1);
}

TEST_CASE("split sequences: the batching engine runs requests together on a split model, each as alone") {
    test::TempDir dir;
    auto model = std::make_shared<Model>(synth_model(dir, "tiny", "q8_0"));
    auto session = [&](int32_t contexts) {
        Split split = split_backend(*model, 1, false, 128, contexts * 128);
        return std::make_unique<Session>(std::move(split.backend), Tokenizer::from_gguf(model->file), 128, model);
    };
    const std::vector<std::vector<int32_t>> prompts = {test::random_tokens(*model, 5, 6),
                                                       test::random_tokens(*model, 23, 7),
                                                       test::random_tokens(*model, 9, 8)};
    CHECK(test::check_batched_as_alone(session, prompts, 8) == 3);   // the three in one forward
}

} // namespace tern
