// The on-disk prefix cache on the batching path (engine/batch/batch_engine.h): a BatchEngine on a Session
// with a PrefixCache restores the cached blocks of a starting request into its backend sequence (after
// the prefix it shares with a held or running sequence) and stores its prompt's blocks once prefilled;
// its entries are byte for byte a Session's and the tokens those of a Session alone with no cache, at
// parallel 1, 3 and 8, cold or warm; a damaged entry costs a warning and a prefill, never the request;
// without a cache nothing changes. Also the backend's sequence-aware range save and append
// (Backend::seq_save_range / seq_append).
#include <doctest/doctest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/batch/batch_engine.h"
#include "engine/generation/session.h"
#include "engine/model.h"
#include "engine/model_identity.h"
#include "engine/prefix_cache/prefix_cache.h"
#include "tests/test_support.h"

using namespace tern;
namespace fs = std::filesystem;

namespace {

const char* const kLlama2xs = "models/gguf/llama2xs-tok512-q8_0.gguf";
constexpr int32_t kCtx = 512;
constexpr int32_t kBlock = 64;   // PrefixCacheOptions' default, as the app uses it

struct Loaded {
    std::shared_ptr<Model> model;
    std::unique_ptr<Session> session;
};

// A CPU session (f16 KV) whose paged pool holds `contexts` whole contexts.
Loaded load(int32_t contexts = 1) {
    Loaded l;
    l.model = std::make_shared<Model>(load_model(test::shared_path(kLlama2xs).string()));
    RunOptions run;
    run.n_ctx = kCtx;
    run.kv_pool_positions = contexts * kCtx;
    std::unique_ptr<Backend> backend = make_backend("cpu", CpuOptions{1});
    backend->load(l.model->config, l.model->weights, run);
    l.session = std::make_unique<Session>(std::move(backend), Tokenizer::from_gguf(l.model->file), kCtx, l.model);
    return l;
}

uint64_t identity_of(const Loaded& l) {
    KvProducer producer;
    producer.kv_type = KvType::f16;
    return model_identity(*l.model, producer);
}

struct Warnings {
    std::vector<std::string> lines;
};

PrefixCache& attach_cache(Loaded& l, const fs::path& dir, Warnings& w) {
    PrefixCacheOptions o;
    o.dir = dir;
    l.session->set_prefix_cache(std::make_unique<PrefixCache>(
        o, identity_of(l), KvType::f16, [&w](const PrefixCache::Warning& warning) { w.lines.push_back(warning.text); }));
    return *l.session->prefix_cache();
}

std::string long_text(int sentences, const std::string& tail) {
    std::string t = "Once upon a time";
    for (int i = 0; i < sentences; ++i) t += ", the little bird sang a song to the tall green tree in the park";
    return t + ". " + tail;
}

struct Spec {
    std::string prompt;
    int32_t n_predict = 16;
    SamplingParams sampling;
    std::vector<int32_t> tokens;   // the prompt as token ids instead, when not empty
};

SamplingParams greedy() {
    SamplingParams p;
    p.temp = 0.0f;
    return p;
}

SamplingParams sampled(uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    return p;
}

// Requests with one long head (several blocks) and different tails, greedy and sampled.
std::vector<Spec> common_head_specs(size_t n) {
    const std::vector<std::string> tails = {"Then", "A dog came", "The cat sat", "Lily said", "One day",
                                            "The sun", "Tom ran to", "Then a big"};
    std::vector<Spec> v;
    for (size_t i = 0; i < n; ++i)
        v.push_back({long_text(12, tails[i % tails.size()]), 12 + static_cast<int32_t>(i),
                     i % 2 == 0 ? greedy() : sampled(i), {}});
    return v;
}

std::vector<int32_t> encode(const Session& s, const std::string& text) { return s.tokenizer().encode(text, {true, true}); }
std::vector<int32_t> encode(const Session& s, const Spec& spec) {
    return spec.tokens.empty() ? encode(s, spec.prompt) : spec.tokens;
}

BatchRequest request_of(const Session& session, const Spec& spec, std::map<RequestId, BatchResult>& done) {
    BatchRequest r;
    r.prompt = encode(session, spec);
    r.n_predict = spec.n_predict;
    r.sampling = spec.sampling;
    r.on_done = [&done](BatchResult res) { done[res.id] = std::move(res); };
    return r;
}

// Submits every spec at once to a BatchEngine on `session` and steps it on this thread until idle; the
// results in submission order, and the engine's stats afterwards.
struct BatchRun {
    std::vector<BatchResult> results;
    BatchStats stats;
};

BatchRun run_batch(Session& session, const std::vector<Spec>& specs, int32_t parallel, bool share_prefixes = true) {
    std::map<RequestId, BatchResult> done;
    std::vector<RequestId> ids;
    BatchRun out;
    {
        BatchEngine engine(served_model(session),
                           {.parallel = parallel, .max_waiting = 64, .share_prefixes = share_prefixes});
        for (const Spec& spec : specs) {
            const Submission s = engine.submit(request_of(session, spec, done));
            REQUIRE(s);
            ids.push_back(s.id);
        }
        for (int i = 0; i < 100000 && !engine.idle(); ++i) engine.step();
        REQUIRE(engine.idle());
        out.stats = engine.stats();
    }
    for (RequestId id : ids) {
        REQUIRE(done.count(id) == 1);
        out.results.push_back(done[id]);
    }
    return out;
}

// Each result's tokens and text equal a Session's alone, with no prefix cache.
void check_equal_to_alone(const std::vector<Spec>& specs, const std::vector<BatchResult>& got) {
    static Loaded reference = load();
    REQUIRE(got.size() == specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
        CAPTURE(i);
        reference.session->reset();
        GenerateOptions o;
        o.n_predict = specs[i].n_predict;
        o.sampling = specs[i].sampling;
        const GenerateResult want = reference.session->generate(encode(*reference.session, specs[i]), o);
        CHECK(got[i].ok());
        CHECK(got[i].tokens == want.tokens);
        CHECK(got[i].text == want.text);
        CHECK(got[i].stop_reason == want.stop_reason);
    }
}

// Full blocks of the prompt a restore may take (it leaves at least the last token to prefill).
int32_t restorable(const Session& s, const Spec& spec) {
    return (static_cast<int32_t>(encode(s, spec).size()) - 1) / kBlock * kBlock;
}

size_t entries_in(const fs::path& dir) {
    size_t n = 0;
    std::error_code ec;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
        if (e.path().extension() == ".tpc") ++n;
    return n;
}

} // namespace

TEST_CASE("seq_save_range / seq_append: a block moves between sequences of the paged CPU cache bit for bit") {
    if (!test::shared_available()) return;
    Loaded l = load(2);
    Backend& b = l.session->backend();
    const std::vector<int32_t> prompt = encode(*l.session, long_text(6, "Then"));
    REQUIRE(prompt.size() > 2 * kBlock);
    GenerateOptions o;
    o.n_predict = 1;
    o.sampling = greedy();
    l.session->generate(prompt, o);   // sequence 0 holds the prompt
    b.seq_create(2);
    b.seq_append(2, b.seq_save_range(0, 0, kBlock));
    b.seq_append(2, b.seq_save_range(0, kBlock, 2 * kBlock));
    CHECK(b.seq_n_past(2) == 2 * kBlock);
    CHECK(b.seq_save_range(2, 0, 2 * kBlock).bytes == b.kv_save_range(0, 2 * kBlock).bytes);
    CHECK(b.seq_save_range(0, 0, kBlock).bytes == b.kv_save_range(0, kBlock).bytes);
    CHECK_THROWS_AS(b.seq_append(2, b.seq_save_range(0, 0, kBlock)), UsageError);   // must start at its n_past
    CHECK_THROWS_AS(b.seq_save_range(3, 0, kBlock), UsageError);                    // no such sequence
    b.seq_free(2);
}

TEST_CASE("batching with a prompt cache: a request run again restores its blocks from disk and gives the same tokens") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    Warnings w;
    const std::vector<Spec> specs = {{long_text(10, "Then"), 20, greedy()}};

    Loaded first = load();
    attach_cache(first, dir.path(), w);
    const BatchRun cold = run_batch(*first.session, specs, 1);
    check_equal_to_alone(specs, cold.results);
    CHECK(cold.results[0].n_from_disk == 0);
    const int32_t n_prompt = cold.results[0].n_prompt;
    CHECK(entries_in(dir.path()) == static_cast<size_t>(n_prompt / kBlock));   // the prompt's full blocks
    // Byte for byte the entries a Session alone stores: the batch's K/V are a cold prefill's.
    {
        test::TempDir alone_dir;
        Loaded alone = load();
        attach_cache(alone, alone_dir.path(), w);
        GenerateOptions o;
        o.n_predict = 1;
        o.sampling = greedy();
        alone.session->generate(encode(*alone.session, specs[0]), o);
        REQUIRE(entries_in(alone_dir.path()) == entries_in(dir.path()));
        for (const fs::directory_entry& e : fs::directory_iterator(alone_dir.path()))
            if (e.path().extension() == ".tpc")
                CHECK(test::read_file(e.path()) == test::read_file(dir.path() / e.path().filename()));
    }

    // A fresh session (a new process): every full block but the one holding the last token is read back.
    Loaded second = load();
    attach_cache(second, dir.path(), w);
    const BatchRun warm = run_batch(*second.session, specs, 1);
    check_equal_to_alone(specs, warm.results);
    const int32_t want = restorable(*second.session, specs[0]);
    CHECK(want >= 3 * kBlock);
    CHECK(warm.results[0].n_from_disk == want);
    CHECK(warm.results[0].n_reused == want);
    CHECK(warm.stats.disk_tokens == static_cast<uint64_t>(want));
    CHECK(warm.stats.reused_tokens == static_cast<uint64_t>(want));

    // The same engine again without shared prefixes: its sequence is filled from disk, not from memory.
    const BatchRun twice = run_batch(*second.session, {specs[0], specs[0]}, 1, false);
    check_equal_to_alone({specs[0], specs[0]}, twice.results);
    CHECK(twice.results[0].n_from_disk == want);
    CHECK(twice.results[1].n_from_disk == want);
    CHECK(w.lines.empty());
}

TEST_CASE("batching with a prompt cache: requests with a common long head equal a Session alone at parallel 3 and 8") {
    if (!test::shared_available()) return;
    for (const int32_t parallel : {3, 8}) {
        CAPTURE(parallel);
        test::TempDir dir;
        Warnings w;
        const std::vector<Spec> specs = common_head_specs(8);
        Loaded cold_session = load(parallel);
        attach_cache(cold_session, dir.path(), w);
        const BatchRun cold = run_batch(*cold_session.session, specs, parallel);
        check_equal_to_alone(specs, cold.results);
        CHECK(entries_in(dir.path()) > 3);

        Loaded warm_session = load(parallel);
        attach_cache(warm_session, dir.path(), w);
        const BatchRun warm = run_batch(*warm_session.session, specs, parallel);
        check_equal_to_alone(specs, warm.results);
        // The first request reads the head from disk; those admitted beside it share its pages.
        CHECK(warm.results[0].n_from_disk == restorable(*warm_session.session, specs[0]));
        CHECK(warm.stats.disk_tokens >= static_cast<uint64_t>(3 * kBlock));
        for (const BatchResult& r : warm.results) CHECK(r.n_reused >= 3 * kBlock);
        CHECK(w.lines.empty());
    }
}

TEST_CASE("batching with a prompt cache: a prefix shared from memory off a block boundary goes on from disk") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    Warnings w;
    const Spec whole{long_text(10, "Then"), 12, greedy()};
    Loaded first = load();
    attach_cache(first, dir.path(), w);
    run_batch(*first.session, {whole}, 1);   // stores the whole prompt's blocks

    // A fresh engine: a short request (one block and a bit of the head) finishes and is held; the long
    // one shares its pages up to a position inside block 1, then restores blocks 1 on from disk.
    Loaded second = load(2);
    attach_cache(second, dir.path(), w);
    const std::vector<int32_t> head = encode(*second.session, whole.prompt);
    const Spec short_one{"", 4, greedy(), std::vector<int32_t>(head.begin(), head.begin() + kBlock + 20)};
    const std::vector<Spec> specs = {short_one, whole};
    BatchEngine engine(served_model(*second.session), {.parallel = 2, .max_waiting = 8});
    std::map<RequestId, BatchResult> done;
    std::vector<RequestId> ids;
    for (const Spec& spec : specs) {
        ids.push_back(engine.submit(request_of(*second.session, spec, done)).id);
        for (int i = 0; i < 10000 && !engine.idle(); ++i) engine.step();
    }
    REQUIRE(done.size() == 2);
    check_equal_to_alone(specs, {done[ids[0]], done[ids[1]]});
    const BatchResult& shared = done[ids[1]];
    CHECK(shared.n_reused == restorable(*second.session, whole));
    CHECK(shared.n_from_disk > 0);
    CHECK(shared.n_from_disk < shared.n_reused);   // part of it came from the held sequence
    CHECK(w.lines.empty());
}

TEST_CASE("batching with a prompt cache: a damaged entry costs a warning and a prefill, never the request") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    Warnings w;
    const std::vector<Spec> specs = {{long_text(10, "Then"), 16, greedy()}, {long_text(10, "A dog came"), 16, sampled(7)}};
    Loaded first = load(2);
    PrefixCache& cache = attach_cache(first, dir.path(), w);
    run_batch(*first.session, specs, 2);
    const std::vector<uint64_t> keys = prefix_chain_keys(encode(*first.session, specs[0]), kBlock, cache.identity());
    REQUIRE(keys.size() >= 3);
    const fs::path entry = cache.entry_path(keys[1]);
    std::string bytes = test::read_file(entry);
    REQUIRE(bytes.size() > 100);
    bytes[bytes.size() / 2] ^= 0x10;
    test::write_file(entry, bytes);

    Loaded second = load(2);
    attach_cache(second, dir.path(), w);
    const BatchRun r = run_batch(*second.session, specs, 2);
    check_equal_to_alone(specs, r.results);
    CHECK(r.results[0].n_from_disk == kBlock);   // block 0 only: block 1 is bad and the rest needs it
    REQUIRE(w.lines.size() == 1);
    CHECK(w.lines[0].find(entry.string()) != std::string::npos);
    CHECK(r.stats.failed == 0);

    // The run stored a good entry in its place: the next restores the whole head.
    Loaded third = load(2);
    attach_cache(third, dir.path(), w);
    const BatchRun again = run_batch(*third.session, specs, 2);
    check_equal_to_alone(specs, again.results);
    CHECK(again.results[0].n_from_disk == restorable(*third.session, specs[0]));
    CHECK(w.lines.size() == 1);
}

TEST_CASE("batching without a prompt cache: the same tokens, nothing read or written") {
    if (!test::shared_available()) return;
    const std::vector<Spec> specs = common_head_specs(4);
    Loaded l = load(3);
    REQUIRE(l.session->prefix_cache() == nullptr);
    const BatchRun r = run_batch(*l.session, specs, 3);
    check_equal_to_alone(specs, r.results);
    CHECK(r.stats.disk_tokens == 0);
    for (const BatchResult& res : r.results) CHECK(res.n_from_disk == 0);
}
