// What the commands do on a GPU, through the Session (engine/generation) over the CUDA backend, under the
// CUDA emulator: greedy generation equal to the CPU's, prompt-lookup speculation equal to plain decoding,
// the on-disk prefix cache storing from one session and restoring into another (and across devices), the
// context shift of a long conversation, and /save then /load; sampled generation drawing from the
// candidates selected on the GPU, equal to the host's selection from the same logits.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/cpu/backend_cpu.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/generation/session.h"
#include "engine/logit_candidates.h"
#include "engine/model.h"
#include "engine/model_identity.h"
#include "engine/prefix_cache/prefix_cache.h"
#include "engine/speculative/drafter.h"
#include "engine/text/tokenizer.h"
#include "tests/fake_backend.h"
#include "tests/quick_mode.h"
#include "tests/test_support.h"

namespace tern {
namespace {

struct Loaded {
    std::shared_ptr<Model> model;
    std::unique_ptr<Session> session;
};

// `exact`: the CUDA backend with the CPU's exact arithmetic (the tight comparisons with the CPU): no int8
// activations, prefill attention in f32.
Loaded cuda_session(const std::string& file, bool exact, int32_t n_ctx = 256, KvType kv = KvType::f16) {
    Loaded l;
    l.model = std::make_shared<Model>(load_model(test::shared_path(file).string()));
    CudaOptions o;
    o.exact_matmul = exact;
    if (exact) o.prefill_attention = cuda::PrefillAttention::f32;
    auto backend = std::make_unique<CudaBackend>(o);
    backend->load(l.model->config, l.model->weights, RunOptions{n_ctx, kv});
    l.session = std::make_unique<Session>(std::move(backend), Tokenizer::from_gguf(l.model->file), n_ctx, l.model);
    return l;
}

Loaded cpu_session(const std::string& file, int32_t n_ctx = 256, KvType kv = KvType::f16) {
    Loaded l;
    l.model = std::make_shared<Model>(load_model(test::shared_path(file).string()));
    auto backend = std::make_unique<CpuBackend>(CpuOptions{2, true});
    backend->load(l.model->config, l.model->weights, RunOptions{n_ctx, kv});
    l.session = std::make_unique<Session>(std::move(backend), Tokenizer::from_gguf(l.model->file), n_ctx, l.model);
    return l;
}

GenerateOptions greedy(int32_t n) {
    GenerateOptions o;
    o.n_predict = n;
    o.sampling.temp = 0.0f;
    return o;
}

// 24 greedy tokens from a reset session with prompt-lookup drafts (up to 6 tokens from a 3-gram match): what
// verification batches of up to 1 + 6 tokens decide.
GenerateResult greedy_with_lookup(Session& s, const std::vector<int32_t>& prompt) {
    PromptLookupDrafter lookup(6, 3);
    GenerateOptions o = greedy(24);
    o.drafter = &lookup;
    s.reset();
    return s.generate(prompt, o);
}

std::vector<int32_t> prompt_of(const Session& s, const std::string& text) { return s.tokenizer().encode(text, {true, true}); }

// A backend that passes every call to `inner` but selects sampling candidates as told: on the host from
// the copied-back row (the base class's Backend::top_logits), or by `inner` (the GPU's kernels). Counts
// the rows copied back and the selections.
class SelectingBackend : public test::ForwardingBackend {
public:
    SelectingBackend(std::unique_ptr<Backend> inner, bool on_host)
        : ForwardingBackend(std::move(inner)), on_host_(on_host) {}
    int logits_calls = 0, top_logits_calls = 0;

    std::span<const float> logits(int row) override {
        ++logits_calls;
        return ForwardingBackend::logits(row);
    }
    // The guard's scan of each sampled row, where the row is (on the GPU: no row copied back).
    FloatScan scan_logits(int row) override { return inner().scan_logits(row); }
    size_t top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out) override {
        ++top_logits_calls;
        return on_host_ ? Backend::top_logits(row, penalties, out) : inner().top_logits(row, penalties, out);
    }

private:
    bool on_host_;
};

const std::string kStory = "Once upon a time there was a little girl named Lily. She loved to play in the park with her "
                           "dog Max. One day Lily found a big red ball. Lily found a big red ball. Lily found a";

} // namespace

TEST_CASE("cuda session: greedy text equals the CPU's, and prompt lookup leaves it unchanged") {
    if (!test::shared_available()) return;
    std::vector<const char*> files = {"models/gguf/stories260K-f32.gguf", "models/gguf/llama2xs-tok512-q4_0.gguf",
                                      "models/synth/synth-qwen2-k256-q4_k_m.gguf"};
    // TERN_TEST_QUICK=1 (tests/quick_mode.h): the two llama files (f32 and a quantized format); qwen2 on the GPU
    // (biases, neox rope) is held against the CPU by test_cuda_backend's greedy ids, which runs that file too.
    if (test::quick_mode()) files.resize(2);
    for (const char* file : files) {
        CAPTURE(file);
        Loaded cpu = cpu_session(file), cuda = cuda_session(file, true);
        const std::vector<int32_t> prompt = prompt_of(*cuda.session, kStory);
        const GenerateResult want = cpu.session->generate(prompt, greedy(24));
        const GenerateResult plain = cuda.session->generate(prompt, greedy(24));
        CHECK(plain.tokens == want.tokens);
        // Speculation: verification batches of up to 1 + 6 tokens decide what one-token steps decided.
        const GenerateResult drafted = greedy_with_lookup(*cuda.session, prompt);
        CHECK(drafted.tokens == plain.tokens);
        CHECK(drafted.text == plain.text);
        CHECK(drafted.n_drafted > 0);
    }
}

TEST_CASE("cuda session: sampling draws from candidates selected on the GPU, as from the host's selection") {
    if (!test::shared_available()) return;
    for (const char* file : {"models/gguf/stories260K-f32.gguf"}) {
        CAPTURE(file);
        const auto model = std::make_shared<Model>(load_model(test::shared_path(file).string()));
        SelectingBackend* selecting[2] = {};
        std::unique_ptr<Session> sessions[2];
        for (int host = 0; host < 2; ++host) {
            auto inner = std::make_unique<CudaBackend>();
            inner->load(model->config, model->weights, RunOptions{256, KvType::f16});
            auto b = std::make_unique<SelectingBackend>(std::move(inner), host == 1);
            selecting[host] = b.get();
            sessions[host] = std::make_unique<Session>(std::move(b), Tokenizer::from_gguf(model->file), 256, model);
        }
        const std::vector<int32_t> prompt = prompt_of(*sessions[0], kStory);
        GenerateOptions o;
        o.n_predict = 32;
        o.sampling.temp = 1.1f;
        o.sampling.top_k = 40;
        o.sampling.repeat_penalty = 1.3f;
        o.sampling.frequency_penalty = 0.2f;
        o.sampling.presence_penalty = 0.1f;
        o.sampling.seed = 5;
        const GenerateResult gpu = sessions[0]->generate(prompt, o), host = sessions[1]->generate(prompt, o);
        CHECK(gpu.tokens == host.tokens);
        CHECK(gpu.text == host.text);
        CHECK(selecting[0]->top_logits_calls == gpu.n_gen());
        CHECK(selecting[0]->logits_calls == 0);   // no logit row copied back
        CHECK(selecting[1]->logits_calls == host.n_gen());
        // Greedy with penalties (one candidate), and sampling with prompt-lookup drafts (several rows).
        PromptLookupDrafter lookup(6, 3);
        for (bool greedy_penalised : {true, false}) {
            GenerateOptions q = o;
            if (greedy_penalised) q.sampling.temp = 0.0f;
            else q.drafter = &lookup;
            CAPTURE(greedy_penalised);
            for (auto& s : sessions) s->reset();
            const GenerateResult a = sessions[0]->generate(prompt, q), b = sessions[1]->generate(prompt, q);
            CHECK(a.tokens == b.tokens);
            if (!greedy_penalised) CHECK(a.n_drafted > 0);
        }
    }
}

TEST_CASE("cuda session: the on-disk prefix cache stores from one GPU session and restores into another") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    const char* file = "models/gguf/stories260K-f32.gguf";
    Loaded cuda = cuda_session(file, true), cuda2 = cuda_session(file, true), cold = cuda_session(file, true);
    // The app keys the cache by the producing device too (model_identity): CPU and GPU K/V differ in
    // their last bits, so neither restores the other's blocks.
    KvProducer producer;
    producer.kv_type = KvType::f16;
    producer.exact_matmul = true;
    producer.device = DeviceKind::cuda;
    producer.device_name = "cuda:0";
    const uint64_t identity = model_identity(*cuda.model, producer);
    auto cache = [&] {
        PrefixCacheOptions o;
        o.dir = dir.path();
        o.block_tokens = 16;
        return std::make_unique<PrefixCache>(o, identity, KvType::f16, [](const PrefixCache::Warning&) {});
    };
    cuda.session->set_prefix_cache(cache());
    cuda2.session->set_prefix_cache(cache());
    const std::vector<int32_t> prompt = prompt_of(*cuda.session, kStory);
    const GenerateResult stored = cuda.session->generate(prompt, greedy(12));
    CHECK(stored.n_from_disk == 0);
    const GenerateResult restored = cuda2.session->generate(prompt, greedy(12));
    CHECK(restored.n_from_disk > 0);
    CHECK(restored.tokens == stored.tokens);
    // And the same as a session without the cache.
    CHECK(cold.session->generate(prompt, greedy(12)).tokens == stored.tokens);
}

TEST_CASE("cuda session: the context shift and /save + /load") {
    if (!test::shared_available()) return;
    const char* file = "models/gguf/llama2xs-tok512-q4_0.gguf";
    Loaded cpu = cpu_session(file, 96), cuda = cuda_session(file, true, 96);
    const std::vector<int32_t> prompt = prompt_of(*cuda.session, kStory);
    for (Loaded* l : {&cpu, &cuda}) {
        l->session->generate(prompt, greedy(4));
        l->session->erase(1, 21);   // drop 20 positions after BOS, as a long chat drops old turns
    }
    CHECK(cuda.session->kv_tokens() == cpu.session->kv_tokens());
    CHECK(cuda.session->kv_shifted());
    std::vector<int32_t> next = cuda.session->kv_tokens();
    next.push_back(prompt[5]);
    const GenerateResult a = cpu.session->generate(next, greedy(10));
    const GenerateResult b = cuda.session->generate(next, greedy(10));
    CHECK(b.tokens == a.tokens);

    // /save on the GPU, /load into a fresh GPU session and into a CPU session: the next reply is the same.
    const KvSnapshot saved = cuda.session->backend().kv_save(cuda.session->backend().n_past());
    const std::vector<int32_t> tokens = cuda.session->kv_tokens();
    Loaded fresh = cuda_session(file, true, 96), cpu2 = cpu_session(file, 96);
    fresh.session->restore(saved, tokens, true);
    cpu2.session->restore(saved, tokens, true);
    std::vector<int32_t> more = tokens;
    more.push_back(prompt[7]);
    const GenerateResult c = fresh.session->generate(more, greedy(6));
    const GenerateResult d = cpu2.session->generate(more, greedy(6));
    CHECK(c.tokens == d.tokens);
}

TEST_CASE("cuda session: int8 decode (the default) with prompt lookup equals int8 decode without it") {
    if (!test::shared_available()) return;
    Loaded cuda = cuda_session("models/gguf/babyllama-tok105-q4_k_m.gguf", false);
    const std::vector<int32_t> prompt = prompt_of(*cuda.session, kStory);
    const GenerateResult plain = cuda.session->generate(prompt, greedy(24));
    const GenerateResult drafted = greedy_with_lookup(*cuda.session, prompt);
    CHECK(drafted.tokens == plain.tokens);
}

} // namespace tern
