// engine/batch/batch_engine.h on the real stories260K model (CPU): results equal a plain Session's,
// the waiting queue is bounded, cancel() frees a waiting request at once and stops a running one,
// drain() finishes what was admitted, stop() cancels it, and the stats count all of it.
#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/backend_factory.h"
#include "engine/batch/batch_engine.h"
#include "engine/batch/latency_histogram.h"
#include "engine/generation/session.h"
#include "engine/model.h"
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
    BatchEngine engine(*session, {.parallel = 4, .max_waiting = 16});
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
    BatchEngine engine(*session, {.parallel = 1, .max_waiting = 2});
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
    BatchEngine engine(*session, {.parallel = 1, .max_waiting = 0});
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
    BatchEngine engine(*session, {.parallel = 1, .max_waiting = 8});
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
    auto engine = std::make_unique<BatchEngine>(*session, BatchEngineOptions{.parallel = 1, .max_waiting = 8});
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
    BatchEngine engine(*session, {.parallel = 1, .max_waiting = 8});
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
    BatchEngine engine(*session, {.parallel = 4, .max_waiting = 1000});
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
