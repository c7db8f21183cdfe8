// engine/batch/batch_engine.h on real models (CPU): results equal a plain Session's, the waiting queue
// is bounded, cancel() frees a waiting request at once and stops a running one, drain() finishes what
// was admitted, stop() cancels it, and the stats count all of it. The batching scheduler: concurrent
// requests give each the tokens it gets alone (greedy and sampled, stop strings, n_predict; parallel 1,
// 3 and 8), a long prompt is prefilled in chunks while the others go on decoding, cancel frees pages,
// an exhausted pool preempts and resumes, prefixes are shared, and a backend without sequences falls
// back to one request at a time.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/batch/batch_engine.h"
#include "engine/batch/latency_histogram.h"
#include "engine/generation/session.h"
#include "engine/model.h"
#include "tests/fake_backend.h"
#include "tests/test_support.h"

using namespace tern;

namespace {

std::unique_ptr<Session> real_session(int32_t n_ctx) {
    auto model = std::make_shared<Model>(load_model(test::stories()));
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_type = KvType::f32;
    std::unique_ptr<Backend> backend = make_backend("cpu", CpuOptions{1});
    backend->load(model->config, model->weights, run);
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file);
    return std::make_unique<Session>(std::move(backend), std::move(tok), n_ctx, model);
}

std::unique_ptr<Session> model_session(const std::string& file, int32_t n_ctx, int32_t pool = 0, int threads = 1) {
    auto model = std::make_shared<Model>(load_model(test::shared_path(file).string()));
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_pool_positions = pool;
    std::unique_ptr<Backend> backend = make_backend("cpu", CpuOptions{threads});
    backend->load(model->config, model->weights, run);
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file);
    return std::make_unique<Session>(std::move(backend), std::move(tok), n_ctx, model);
}

std::vector<int32_t> encode(const Session& s, const std::string& text) { return s.tokenizer().encode(text, {true, true}); }

SamplingParams greedy() {
    SamplingParams p;
    p.temp = 0.0f;
    return p;
}

// Results by id, and a wait for a number of them.
struct Collector {
    std::mutex mutex;
    std::condition_variable cv;
    std::map<RequestId, BatchResult> results;
    std::map<RequestId, std::string> streamed;
    std::vector<RequestId> order;   // ids as they finished

    BatchRequest request(std::vector<int32_t> prompt, int32_t n_predict, SamplingParams sampling = greedy()) {
        BatchRequest r;
        r.prompt = std::move(prompt);
        r.n_predict = n_predict;
        r.sampling = sampling;
        auto text = std::make_shared<std::string>();
        r.on_text = [text](std::string_view piece) {
            *text += piece;
            return true;
        };
        r.on_done = [this, text](BatchResult res) {
            std::lock_guard<std::mutex> lock(mutex);
            streamed[res.id] = *text;
            order.push_back(res.id);
            results[res.id] = std::move(res);
            cv.notify_all();
        };
        return r;
    }
    bool wait_for(size_t n) {
        std::unique_lock<std::mutex> lock(mutex);
        return cv.wait_for(lock, std::chrono::seconds(60), [&] { return results.size() >= n; });
    }
};

// A gate the first request's on_text blocks on, so a test can act while the engine is busy. (Real
// callbacks must not block; this one holds the engine on purpose.)
struct Gate {
    std::promise<void> entered;
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    bool first = true;
    void hold(BatchRequest& r) {
        r.on_text = [this](std::string_view) {
            if (first) {
                first = false;
                entered.set_value();
                released.wait();
            }
            return true;
        };
    }
};

} // namespace

TEST_CASE("LatencyHistogram: buckets by upper bound, +Inf last, sum and count") {
    LatencyHistogram h({0.1, 1.0});
    h.observe(0.05);
    h.observe(0.1);   // on the bound: that bucket (le="0.1")
    h.observe(0.5);
    h.observe(7.0);
    h.observe(-1.0);  // a clock that went back counts as 0
    CHECK(h.counts().size() == 3);
    CHECK(h.counts()[0] == 3);
    CHECK(h.counts()[1] == 1);
    CHECK(h.counts()[2] == 1);
    CHECK(h.count() == 5);
    CHECK(h.sum() == doctest::Approx(7.65));
    CHECK_THROWS(LatencyHistogram({1.0, 0.5}));
}

TEST_CASE("BatchEngine: results equal a plain Session's, in FIFO order, with streamed text equal to the result") {
    if (!test::shared_available()) return;
    auto reference = real_session(256);
    auto session = real_session(256);
    const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Once upon a time there was",
                                              "Tom and Lily"};
    SamplingParams sampled;
    sampled.seed = 42;

    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 4, .max_waiting = 16});
    std::vector<RequestId> ids;
    for (size_t i = 0; i < prompts.size(); ++i) {
        const Submission s = engine.submit(c.request(encode(*session, prompts[i]), 24, i % 2 ? sampled : greedy()));
        REQUIRE(s);
        ids.push_back(s.id);
    }
    CHECK(engine.stats().waiting == 4);
    engine.start();
    REQUIRE(c.wait_for(prompts.size()));
    CHECK(c.order == ids);
    for (size_t i = 0; i < prompts.size(); ++i) {
        GenerateOptions o;
        o.n_predict = 24;
        o.sampling = i % 2 ? sampled : greedy();
        const GenerateResult want = reference->generate(encode(*reference, prompts[i]), o);
        const BatchResult& got = c.results[ids[i]];
        CHECK(got.ok());
        CHECK(got.tokens == want.tokens);
        CHECK(got.text == want.text);
        CHECK(c.streamed[ids[i]] == got.text);
        CHECK(got.n_prompt == want.n_prompt());
        CHECK(got.timings.total_ms >= got.timings.queue_ms);
    }
    const BatchStats st = engine.stats();
    CHECK(st.submitted == 4);
    CHECK(st.completed == 4);
    CHECK(st.generated_tokens > 0);
    CHECK(st.end_to_end.count() == 4);
    CHECK(st.kv_capacity == 256);
    CHECK(st.kv_used > 0);
    CHECK(st.parallel == 4);
    engine.drain();
    engine.join();
    CHECK(engine.idle());
}

TEST_CASE("BatchEngine: submit refuses a full queue, an over-long or empty prompt, and after drain") {
    if (!test::shared_available()) return;
    auto session = real_session(64);
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 1, .max_waiting = 2});
    std::vector<int32_t> prompt = encode(*session, "Once upon a time");

    std::vector<int32_t> too_long(65, prompt[1]);
    Submission s = engine.submit(c.request(too_long, 4));
    CHECK(s.refused == BatchError::invalid);
    CHECK(s.message.find("65 tokens") != std::string::npos);
    CHECK(engine.submit(c.request({}, 4)).refused == BatchError::invalid);
    CHECK(engine.submit(c.request(prompt, -2)).refused == BatchError::invalid);

    // Hold the engine in the first request; two more wait; the fourth is refused.
    Gate gate;
    BatchRequest first = c.request(prompt, 8);
    gate.hold(first);
    REQUIRE(engine.submit(std::move(first)));
    engine.start();
    gate.entered.get_future().wait();
    REQUIRE(engine.submit(c.request(prompt, 4)));
    REQUIRE(engine.submit(c.request(prompt, 4)));
    s = engine.submit(c.request(prompt, 4));
    CHECK(s.refused == BatchError::queue_full);
    BatchStats st = engine.stats();
    CHECK(st.running == 1);
    CHECK(st.waiting == 2);
    CHECK(st.refused == 4);

    // drain: no new requests, the admitted ones all finish.
    engine.drain();
    CHECK(engine.submit(c.request(prompt, 4)).refused == BatchError::shutting_down);
    gate.release.set_value();
    engine.join();
    CHECK(c.results.size() == 3);
    for (const auto& [id, r] : c.results) CHECK(r.stop_reason != StopReason::cancelled);
}

TEST_CASE("BatchEngine: max_waiting 0 runs one request at a time and queues none") {
    if (!test::shared_available()) return;
    auto session = real_session(64);
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 1, .max_waiting = 0});
    const std::vector<int32_t> prompt = encode(*session, "Once upon a time");
    Gate gate;
    BatchRequest first = c.request(prompt, 8);
    gate.hold(first);
    REQUIRE(engine.submit(std::move(first)));   // idle: taken
    CHECK(engine.submit(c.request(prompt, 4)).refused == BatchError::queue_full);
    engine.start();
    gate.entered.get_future().wait();
    CHECK(engine.submit(c.request(prompt, 4)).refused == BatchError::queue_full);
    gate.release.set_value();
    REQUIRE(c.wait_for(1));
    engine.drain();
    engine.join();
}

TEST_CASE("BatchEngine: cancel frees a waiting request at once and stops a running one") {
    if (!test::shared_available()) return;
    auto session = real_session(128);
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 1, .max_waiting = 8});
    const std::vector<int32_t> prompt = encode(*session, "Once upon a time");

    Gate gate;
    BatchRequest first = c.request(prompt, 100);
    gate.hold(first);
    const Submission running = engine.submit(std::move(first));
    engine.start();
    gate.entered.get_future().wait();
    const Submission waiting = engine.submit(c.request(prompt, 4));
    const Submission later = engine.submit(c.request(prompt, 4));

    // The waiting one: its on_done ran on this thread before cancel() returned.
    CHECK(engine.cancel(waiting.id));
    {
        std::lock_guard<std::mutex> lock(c.mutex);
        REQUIRE(c.results.count(waiting.id) == 1);
        CHECK(c.results[waiting.id].stop_reason == StopReason::cancelled);
        CHECK(c.results[waiting.id].n_gen() == 0);
    }
    CHECK(engine.stats().waiting == 1);
    CHECK_FALSE(engine.cancel(waiting.id));   // already gone
    CHECK_FALSE(engine.cancel(999));

    // The running one stops at its next step.
    CHECK(engine.cancel(running.id));
    gate.release.set_value();
    REQUIRE(c.wait_for(3));
    CHECK(c.results[running.id].stop_reason == StopReason::cancelled);
    CHECK(c.results[running.id].n_gen() < 100);
    CHECK(c.results[later.id].stop_reason != StopReason::cancelled);
    const BatchStats st = engine.stats();
    CHECK(st.cancelled == 2);
    CHECK(st.completed == 1);
}

TEST_CASE("BatchEngine: stop cancels the waiting requests on the caller's thread and ends run()") {
    if (!test::shared_available()) return;
    auto session = real_session(128);
    Collector c;
    auto engine =
        std::make_unique<BatchEngine>(served_model(*session), BatchEngineOptions{.parallel = 1, .max_waiting = 8});
    const std::vector<int32_t> prompt = encode(*session, "Once upon a time");
    Gate gate;
    BatchRequest first = c.request(prompt, 100);
    gate.hold(first);
    REQUIRE(engine->submit(std::move(first)));
    engine->start();
    gate.entered.get_future().wait();
    for (int i = 0; i < 3; ++i) REQUIRE(engine->submit(c.request(prompt, 4)));
    engine->stop();
    CHECK(c.results.size() == 3);   // the waiting ones, before stop() returned
    gate.release.set_value();
    engine->join();
    REQUIRE(c.results.size() == 4);
    for (const auto& [id, r] : c.results) CHECK(r.stop_reason == StopReason::cancelled);
    CHECK(engine->submit(c.request(prompt, 4)).refused == BatchError::shutting_down);
    engine.reset();   // the destructor after stop(): nothing left to wait for
}

TEST_CASE("BatchEngine: on_text returning false cancels; a throwing callback does not take the engine down") {
    if (!test::shared_available()) return;
    auto session = real_session(128);
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 1, .max_waiting = 8});
    const std::vector<int32_t> prompt = encode(*session, "Once upon a time");
    BatchRequest quit = c.request(prompt, 50);
    int pieces = 0;
    quit.on_text = [&pieces](std::string_view) { return ++pieces < 3; };
    BatchRequest thrower = c.request(prompt, 50);
    thrower.on_text = [](std::string_view) -> bool { throw std::runtime_error("client bug"); };
    const RequestId a = engine.submit(std::move(quit)).id;
    const RequestId b = engine.submit(std::move(thrower)).id;
    const RequestId d = engine.submit(c.request(prompt, 5)).id;
    engine.start();
    REQUIRE(c.wait_for(3));
    CHECK(c.results[a].stop_reason == StopReason::cancelled);
    CHECK(c.results[b].stop_reason == StopReason::cancelled);
    CHECK(c.results[d].ok());
    CHECK(c.results[d].stop_reason != StopReason::cancelled);
}

TEST_CASE("BatchEngine: many submitting threads, every admitted request answered once") {
    if (!test::shared_available()) return;
    auto session = real_session(128);
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 4, .max_waiting = 1000});
    const std::vector<int32_t> prompt = encode(*session, "Once upon a time");
    engine.start();
    std::vector<std::thread> threads;
    std::atomic<int> admitted{0};
    for (int t = 0; t < 8; ++t)
        threads.emplace_back([&] {
            for (int i = 0; i < 4; ++i)
                if (engine.submit(c.request(prompt, 3))) ++admitted;
        });
    for (std::thread& t : threads) t.join();
    REQUIRE(admitted == 32);
    REQUIRE(c.wait_for(32));
    CHECK(c.results.size() == 32);
    CHECK(engine.stats().completed == 32);
    engine.drain();
    engine.join();
}

// ---------------------------------------------------------------------------------------------
// The batching scheduler.

namespace {

const char* const kStories = "models/gguf/stories260K-f32.gguf";
const char* const kLlama2xs = "models/gguf/llama2xs-tok512-q8_0.gguf";

// One request of a mixed batch: its prompt, limits and sampling.
struct Spec {
    std::string prompt;
    int32_t n_predict = 32;
    SamplingParams sampling = greedy();
    std::vector<std::string> stop;
};

SamplingParams sampled(uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    return p;
}

std::string long_text(int sentences) {
    std::string t = "Once upon a time";
    for (int i = 0; i < sentences; ++i) t += ", the little bird sang a song to the tall green tree in the park";
    return t + ". Then";
}

std::vector<Spec> mixed_specs() {
    std::vector<Spec> v;
    v.push_back({"Once upon a time", 40, greedy(), {}});
    v.push_back({"The little dog", 50, sampled(1), {}});
    SamplingParams whole_row = sampled(2);   // top-k off: the sampler reads the whole row
    whole_row.top_k = 0;
    whole_row.temp = 1.0f;
    v.push_back({"Tom and Lily went", 30, whole_row, {}});
    SamplingParams penalised = greedy();     // greedy with penalties: the backend's top candidates
    penalised.repeat_penalty = 1.3f;
    v.push_back({"Once upon a time there was", 40, penalised, {}});
    v.push_back({"One day, a girl", 80, sampled(3), {"."}});
    v.push_back({"The sun was", 60, greedy(), {" the"}});
    SamplingParams freq = sampled(4);
    freq.frequency_penalty = 0.5f;
    v.push_back({long_text(5), 64, freq, {}});
    v.push_back({"Once upon a time, a cat", -1, greedy(), {}});
    return v;
}

BatchRequest to_request(Collector& c, const Session& s, const Spec& spec) {
    BatchRequest r = c.request(encode(s, spec.prompt), spec.n_predict, spec.sampling);
    r.stop = spec.stop;
    return r;
}

GenerateResult alone(Session& reference, const Spec& spec) {
    reference.reset();
    GenerateOptions o;
    o.n_predict = spec.n_predict;
    o.sampling = spec.sampling;
    o.stop = spec.stop;
    return reference.generate(encode(reference, spec.prompt), o);
}

// Steps on this thread until nothing is left.
void step_until_idle(BatchEngine& engine) {
    for (int i = 0; i < 100000 && !engine.idle(); ++i) engine.step();
    REQUIRE(engine.idle());
}

void check_equal_to_alone(Session& reference, Collector& c, const std::vector<Spec>& specs,
                          const std::vector<RequestId>& ids) {
    for (size_t i = 0; i < specs.size(); ++i) {
        CAPTURE(i);
        const GenerateResult want = alone(reference, specs[i]);
        REQUIRE(c.results.count(ids[i]) == 1);
        const BatchResult& got = c.results[ids[i]];
        CHECK(got.ok());
        CHECK(got.tokens == want.tokens);
        CHECK(got.text == want.text);
        CHECK(got.stop_reason == want.stop_reason);
        CHECK(c.streamed[ids[i]] == got.text);
    }
}

// A CPU backend behind a wrapper that says it runs one sequence (as a backend without sequences does).
class OneSequence : public test::ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;
    std::string device_name() const override { return "one-sequence"; }
};

} // namespace

TEST_CASE("batching: concurrent requests each give the tokens and text they give alone (parallel 1, 3, 8)") {
    if (!test::shared_available()) return;
    for (const char* file : {kStories, kLlama2xs}) {
        auto reference = model_session(file, 256);
        for (const int32_t parallel : {1, 3, 8}) {
            for (const int32_t step_tokens : {512, 24}) {
                CAPTURE(std::string(file));
                CAPTURE(parallel);
                CAPTURE(step_tokens);
                auto session = model_session(file, 256, parallel * 256);
                Collector c;
                BatchEngine engine(served_model(*session),
                                   {.parallel = parallel, .max_waiting = 64, .step_tokens = step_tokens});
                const std::vector<Spec> specs = mixed_specs();
                std::vector<RequestId> ids;
                for (const Spec& spec : specs) {
                    const Submission s = engine.submit(to_request(c, *session, spec));
                    REQUIRE(s);
                    ids.push_back(s.id);
                }
                int32_t most_running = 0;
                for (int i = 0; i < 100000 && !engine.idle(); ++i) {
                    engine.step();
                    most_running = std::max(most_running, engine.stats().running);
                }
                REQUIRE(engine.idle());
                CHECK(most_running == std::min<int32_t>(parallel, static_cast<int32_t>(specs.size())));
                check_equal_to_alone(*reference, c, specs, ids);
                const BatchStats st = engine.stats();
                CHECK(st.completed == specs.size());
                CHECK(st.preempted == 0);
            }
        }
    }
}

TEST_CASE("batching: the engine thread gives the same results, with requests arriving while others run") {
    if (!test::shared_available()) return;
    auto reference = model_session(kLlama2xs, 256);
    auto session = model_session(kLlama2xs, 256, 4 * 256, 2);   // two threads: the same bits as one
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 4, .max_waiting = 64});
    engine.start();
    const std::vector<Spec> specs = mixed_specs();
    std::vector<RequestId> ids;
    for (const Spec& spec : specs) {
        ids.push_back(engine.submit(to_request(c, *session, spec)).id);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    REQUIRE(c.wait_for(specs.size()));
    engine.drain();
    engine.join();
    check_equal_to_alone(*reference, c, specs, ids);
}

TEST_CASE("batching: a long prompt is prefilled in chunks while the other requests keep decoding") {
    if (!test::shared_available()) return;
    auto reference = model_session(kLlama2xs, 512);
    auto session = model_session(kLlama2xs, 512, 3 * 512);
    std::vector<BatchStepInfo> steps;
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 3,
                                                .max_waiting = 8,
                                                .step_tokens = 32,
                                                .on_step = [&steps](const BatchStepInfo& i) { steps.push_back(i); }});
    const std::vector<Spec> specs = {{"Once upon a time", 60, greedy(), {}},
                                     {"The little dog", 60, sampled(7), {}},
                                     {long_text(8), 20, sampled(8), {}}};
    std::vector<RequestId> ids;
    for (size_t i = 0; i < 2; ++i) ids.push_back(engine.submit(to_request(c, *session, specs[i])).id);
    for (int i = 0; i < 4; ++i) engine.step();   // the two short ones are decoding
    const size_t before = steps.size();
    const std::vector<int32_t> long_prompt = encode(*session, specs[2].prompt);
    REQUIRE(long_prompt.size() > 150);
    ids.push_back(engine.submit(to_request(c, *session, specs[2])).id);
    step_until_idle(engine);

    // Every step stays within the budget; the long prompt (but the start it shares with the first request)
    // took several steps, each also decoding the other two.
    const int32_t to_prefill = static_cast<int32_t>(long_prompt.size()) - c.results[ids[2]].n_reused;
    CHECK(c.results[ids[2]].n_reused > 0);   // "Once upon a time": the first request's pages
    int32_t prefill_steps = 0, prefilled = 0;
    for (size_t i = before; i < steps.size() && prefilled < to_prefill; ++i) {
        CHECK(steps[i].decode_tokens + steps[i].prefill_tokens <= 32);
        CHECK(steps[i].prefill_tokens > 0);
        CHECK(steps[i].decode_tokens == 2);
        ++prefill_steps;
        prefilled += steps[i].prefill_tokens;
        if (prefilled < to_prefill) CHECK(steps[i].prefill_tokens == 30);   // the budget less the decode tokens
    }
    CHECK(prefilled == to_prefill);
    CHECK(prefill_steps == (to_prefill + 29) / 30);
    check_equal_to_alone(*reference, c, specs, ids);
}

TEST_CASE("batching: cancel of a running request frees its pages at the next step") {
    if (!test::shared_available()) return;
    auto session = model_session(kStories, 512, 2 * 512);
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 2, .max_waiting = 8});
    const RequestId a = engine.submit(c.request(encode(*session, long_text(6)), 200)).id;
    const RequestId b = engine.submit(c.request(encode(*session, "The little dog"), 200)).id;
    for (int i = 0; i < 3; ++i) engine.step();
    const int32_t pages_before = session->backend().kv_pool().pages_in_use;
    CHECK(pages_before >= 3);   // a's prompt spans two pages, b's one
    CHECK(engine.stats().kv_used == pages_before * 128);
    CHECK(engine.cancel(a));
    CHECK(engine.stats().running == 2);   // until the next step
    engine.step();
    CHECK(c.results.count(a) == 1);
    CHECK(c.results[a].stop_reason == StopReason::cancelled);
    CHECK(c.results[a].n_gen() > 0);
    CHECK(c.streamed[a] == c.results[a].text);
    CHECK(session->backend().kv_pool().pages_in_use == 1);   // b's
    CHECK(engine.stats().running == 1);
    CHECK(engine.cancel(b));
    engine.step();
    CHECK(session->backend().kv_pool().pages_in_use == 0);
    CHECK(engine.idle());
    CHECK(engine.stats().cancelled == 2);
}

TEST_CASE("batching: an exhausted KV pool preempts the youngest request, which resumes and still gives its alone-result") {
    if (!test::shared_available()) return;
    for (const char* file : {kStories, kLlama2xs}) {
        CAPTURE(std::string(file));
        auto reference = model_session(file, 256);
        auto session = model_session(file, 256, 384);   // three pages for four requests of up to two each
        Collector c;
        BatchEngine engine(served_model(*session), {.parallel = 4, .max_waiting = 8, .step_tokens = 64});
        std::vector<Spec> specs = {{"Once upon a time", 200, greedy(), {}},
                                   {"The little dog", 180, sampled(11), {}},
                                   {"Tom and Lily went", 190, sampled(12), {}},
                                   {"One day, a girl", 170, greedy(), {}}};
        std::vector<RequestId> ids;
        for (const Spec& spec : specs) ids.push_back(engine.submit(to_request(c, *session, spec)).id);
        step_until_idle(engine);
        check_equal_to_alone(*reference, c, specs, ids);
        const BatchStats st = engine.stats();
        CHECK(st.preempted > 0);
        CHECK(st.completed == specs.size());
    }
}

TEST_CASE("batching: a preempted request can be cancelled while it waits to resume") {
    if (!test::shared_available()) return;
    auto reference = model_session(kStories, 256);
    auto session = model_session(kStories, 256, 256);   // two pages: one request's context
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 2, .max_waiting = 8});
    const std::vector<Spec> specs = {{"Once upon a time", 200, greedy(), {}}, {"The little dog", 200, sampled(5), {}}};
    const RequestId a = engine.submit(to_request(c, *session, specs[0])).id;
    const RequestId b = engine.submit(to_request(c, *session, specs[1])).id;
    for (int i = 0; i < 1000 && engine.stats().preempted == 0; ++i) engine.step();
    REQUIRE(engine.stats().preempted == 1);
    CHECK(engine.stats().running == 1);
    CHECK(engine.stats().waiting == 1);   // b, the younger, gave its pages back
    CHECK(engine.cancel(b));
    engine.step();
    REQUIRE(c.results.count(b) == 1);
    CHECK(c.results[b].stop_reason == StopReason::cancelled);
    CHECK(c.results[b].n_gen() > 0);
    CHECK(c.streamed[b] == c.results[b].text);
    step_until_idle(engine);
    check_equal_to_alone(*reference, c, {specs[0]}, {a});
}

TEST_CASE("batching: a prompt that starts like a held sequence shares its pages") {
    if (!test::shared_available()) return;
    auto reference = model_session(kLlama2xs, 512);
    auto session = model_session(kLlama2xs, 512, 2 * 512);
    Collector c;
    BatchEngine engine(served_model(*session), {.parallel = 2, .max_waiting = 8});
    const std::string head = long_text(8);
    const std::vector<Spec> specs = {{head, 10, greedy(), {}}, {head + " a dog came", 12, sampled(3), {}},
                                     {head + " a cat came", 12, greedy(), {}}};
    std::vector<RequestId> ids;
    ids.push_back(engine.submit(to_request(c, *session, specs[0])).id);
    step_until_idle(engine);   // finished: its sequence is held for its prefix
    ids.push_back(engine.submit(to_request(c, *session, specs[1])).id);
    ids.push_back(engine.submit(to_request(c, *session, specs[2])).id);
    step_until_idle(engine);
    check_equal_to_alone(*reference, c, specs, ids);
    const size_t n_head = encode(*session, head).size();
    CHECK(c.results[ids[1]].n_reused >= static_cast<int32_t>(n_head) - 2);
    CHECK(c.results[ids[2]].n_reused >= static_cast<int32_t>(n_head) - 2);
    CHECK(engine.stats().reused_tokens > 0);
}

TEST_CASE("batching: waiting_served_ratio holds new requests back until enough wait or the oldest waited long enough") {
    if (!test::shared_available()) return;
    auto session = model_session(kStories, 256, 4 * 256);
    Collector c;
    BatchEngine engine(served_model(*session),
                       {.parallel = 4, .max_waiting = 8, .waiting_served_ratio = 2.0f, .max_waiting_steps = 3});
    const std::vector<int32_t> prompt = encode(*session, "Once upon a time");
    REQUIRE(engine.submit(c.request(prompt, 100)));
    engine.step();   // idle: admitted at once
    CHECK(engine.stats().running == 1);
    REQUIRE(engine.submit(c.request(encode(*session, "The little dog"), 50)));
    engine.step();
    engine.step();
    engine.step();
    CHECK(engine.stats().running == 1);   // one waiting for one running: held back three steps
    engine.step();
    CHECK(engine.stats().running == 2);   // then admitted
    REQUIRE(engine.submit(c.request(prompt, 5)));
    REQUIRE(engine.submit(c.request(prompt, 5)));
    REQUIRE(engine.submit(c.request(prompt, 5)));
    REQUIRE(engine.submit(c.request(prompt, 5)));
    engine.step();   // four waiting for two running: admitted at once, into the two free slots
    CHECK(engine.stats().running == 4);
    step_until_idle(engine);
    CHECK(engine.stats().completed == 6);
}

TEST_CASE("batching: a backend without sequences runs the requests one at a time through the Session") {
    if (!test::shared_available()) return;
    auto reference = model_session(kStories, 256);
    auto model = std::make_shared<Model>(load_model(test::stories()));
    RunOptions run;
    run.n_ctx = 256;
    auto backend = std::make_unique<OneSequence>(make_backend("cpu", CpuOptions{1}));
    backend->load(model->config, model->weights, run);
    REQUIRE_FALSE(backend->supports_sequences());
    Session session(std::move(backend), Tokenizer::from_gguf(model->file), 256, model);
    Collector c;
    BatchEngine engine(served_model(session), {.parallel = 4, .max_waiting = 16});
    const std::vector<Spec> specs = mixed_specs();
    std::vector<RequestId> ids;
    for (const Spec& spec : specs) ids.push_back(engine.submit(to_request(c, session, spec)).id);
    CHECK(engine.step());   // one whole request
    CHECK(c.results.size() == 1);
    CHECK(engine.stats().steps == 0);
    step_until_idle(engine);
    check_equal_to_alone(*reference, c, specs, ids);
    CHECK(c.order == ids);
    CHECK(engine.stats().kv_capacity == 256);
}

TEST_CASE("batching: log-probabilities equal a plain Session's, scheduled (parallel 3) or one at a time") {
    if (!test::shared_available()) return;
    auto reference = model_session(kStories, 256);
    std::vector<Spec> specs = mixed_specs();
    specs.resize(5);
    const std::vector<int32_t> asked = {4, 0, -1, 2, 7};   // top N per token; -1: none
    const auto check = [&](Collector& c, const std::vector<RequestId>& ids) {
        for (size_t i = 0; i < specs.size(); ++i) {
            CAPTURE(i);
            reference->reset();
            GenerateOptions o;
            o.n_predict = specs[i].n_predict;
            o.sampling = specs[i].sampling;
            o.stop = specs[i].stop;
            o.logprobs = asked[i];
            const GenerateResult want = reference->generate(encode(*reference, specs[i].prompt), o);
            const BatchResult& got = c.results[ids[i]];
            REQUIRE(got.tokens == want.tokens);
            REQUIRE(got.logprobs.size() == (asked[i] < 0 ? 0 : got.tokens.size()));
            for (size_t k = 0; k < got.logprobs.size(); ++k) {
                CHECK(got.logprobs[k].token == got.tokens[k]);
                CHECK(got.logprobs[k].logprob == want.logprobs[k].logprob);   // the same bits as alone
                REQUIRE(got.logprobs[k].top.size() == static_cast<size_t>(asked[i]));
                for (size_t t = 0; t < got.logprobs[k].top.size(); ++t) {
                    CHECK(got.logprobs[k].top[t].id == want.logprobs[k].top[t].id);
                    CHECK(got.logprobs[k].top[t].logprob == want.logprobs[k].top[t].logprob);
                }
            }
        }
    };
    {
        auto session = model_session(kStories, 256, 3 * 256);
        Collector c;
        BatchEngine engine(served_model(*session), {.parallel = 3, .max_waiting = 64, .step_tokens = 24});
        std::vector<RequestId> ids;
        for (size_t i = 0; i < specs.size(); ++i) {
            BatchRequest r = to_request(c, *session, specs[i]);
            r.logprobs = asked[i];
            ids.push_back(engine.submit(std::move(r)).id);
        }
        step_until_idle(engine);
        check(c, ids);
    }
    {
        auto model = std::make_shared<Model>(load_model(test::stories()));
        RunOptions run;
        run.n_ctx = 256;
        auto backend = std::make_unique<OneSequence>(make_backend("cpu", CpuOptions{1}));
        backend->load(model->config, model->weights, run);
        Session session(std::move(backend), Tokenizer::from_gguf(model->file), 256, model);
        Collector c;
        BatchEngine engine(served_model(session), {.parallel = 4, .max_waiting = 16});
        std::vector<RequestId> ids;
        for (size_t i = 0; i < specs.size(); ++i) {
            BatchRequest r = to_request(c, session, specs[i]);
            r.logprobs = asked[i];
            ids.push_back(engine.submit(std::move(r)).id);
        }
        step_until_idle(engine);
        check(c, ids);
    }
}
