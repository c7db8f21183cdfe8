#pragma once
// BatchEngine: generation requests from many threads (an HTTP server's, `tern run --batch`'s reader),
// served by one engine thread. It is the seam between the serving layer and the scheduler:
//
//   submit()  thread-safe; queues a request or refuses it at once (a full waiting queue, a prompt the
//             context cannot hold, an engine that is shutting down), never blocking on the engine;
//   cancel()  thread-safe; a waiting request leaves the queue (its memory freed) before cancel()
//             returns, a running (or preempted) one ends at the engine's next step, its pages freed then;
//   run()     the engine loop, on one thread (start() spawns it); step() is one turn of it;
//   drain()   refuse new requests, finish the admitted ones, then run() returns; stop() cancels them;
//   stats()   counters, gauges and latency histograms for /metrics and progress lines.
//
// On a backend with sequences (Backend::supports_sequences: the CPU's and the CUDA backend's paged KV
// caches, engine/cpu/kv_cache.h and engine/cuda/kv_cache_cuda.h, and a model split between the two,
// engine/split_backend.h) the engine is a
// continuous-batching scheduler. Up to `parallel` requests run at once, each in a backend sequence of
// its own with its own RequestDecoder (engine/generation/request_decoder.h: sampling, penalties, stop
// strings, the repetition guard and limits, the rules Session::generate decodes by). Each step() is ONE forward over
// every decoding request's newest token plus chunks of the prompts being prefilled, under a per-step token budget
// (step_tokens: a long prompt is prefilled over several steps while the others keep decoding); then
// each request whose row ended its prompt or decoded a token hands it to its decoder, requests whose stop rule
// fired finish (their pages go back to the pool at once), and waiting requests are admitted into the
// free slots. A request's tokens are exactly what it gets alone: the forward gives each sequence the
// bits it gets alone (whatever shares the step, however its prompt is chunked), and each request samples
// its rows in its own order with its own RNG. On the CPU that is also what Session::generate gives for
// the same prompt, seed and options; the CUDA backend's batches keep to the per-column kernels for that
// invariance (engine/cuda/backend_cuda.cpp forward_on_device), where a Session's prefill takes the GEMM
// ones, so there the two agree to rounding, not bit for bit. When the pool lacks pages for a step, the youngest running
// request is preempted (its pages freed) and later resumes where it was, its prompt and generated
// tokens recomputed and its stream going on (no text is sent twice). A new request whose prompt starts
// like a running or recently finished sequence shares that prefix's pages (Backend::seq_fork). When the
// engine has an on-disk prefix cache (engine/prefix_cache/prefix_cache.h; the app's --prompt-cache),
// a starting request then restores the cached 64-token blocks that follow into its sequence (never its
// last token), and once its prompt is prefilled stores the prompt's blocks not on disk yet, as
// Session::generate does: restored K/V equal a cold prefill's bit for bit, so the tokens do not change,
// and a faulty entry costs a warning and a prefill, never the request.
//
// On a backend without sequences the engine runs the admitted requests one at a time, first come first
// served, through a Session of its own on that backend (engine/generation/session.h): each step is one
// whole generation, and a
// later request whose prompt starts like the previous one reuses its KV (the Session's prefix reuse).
//
// The API is shaped for batching:
//   - every request carries its own sampling parameters and seed, stop strings and limits;
//   - callbacks name no global state and may interleave across requests: on_text pieces of
//     different requests alternate in any order (each request's own pieces stay in order, and its
//     on_done comes after its last piece);
//   - callbacks run on the engine thread and must return at once (copy the piece into the
//     caller's own queue and signal it); they must not call submit/cancel of this engine from inside;
//   - ids identify requests in cancel(); results are delivered through the request's own callback.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "engine/batch/latency_histogram.h"
#include "engine/generation/generate_options.h"
#include "engine/generation/repeat_guard.h"
#include "engine/generation/sampler.h"

namespace tern {

class Backend;
class PrefixCache;
class Session;
class Tokenizer;
struct Model;

using RequestId = uint64_t;   // 1, 2, ... in submission order; 0 is never a request

// Why a request did not run to a completion.
enum class BatchError {
    none,
    queue_full,      // submit: max_waiting requests are already waiting
    invalid,         // submit: the request cannot run (empty prompt, longer than the context, bad n_predict)
    shutting_down,   // submit after drain() or stop()
    runtime,         // the engine failed while running it (device error, out of memory)
};
// "queue_full", "invalid", "shutting_down", "runtime" ("" for none).
std::string_view batch_error_name(BatchError error);

struct BatchTimings {
    double queue_ms = 0.0;         // submit -> the engine started it
    double first_token_ms = 0.0;   // submit -> its first text piece (the whole run when it showed none)
    double prefill_ms = 0.0;
    double decode_ms = 0.0;
    double total_ms = 0.0;         // submit -> done
};

struct BatchResult {
    RequestId id = 0;
    BatchError error = BatchError::none;   // runtime: `message` says what failed
    std::string message;
    std::string text;                       // the completion, stop string trimmed (what on_text showed)
    std::vector<int32_t> tokens;            // generated ids, the end-of-generation token excluded
    std::vector<TokenLogprobs> logprobs;    // BatchRequest::logprobs >= 0: one per entry of `tokens`
    int32_t n_prompt = 0;
    int32_t n_reused = 0;                   // prompt tokens whose KV was not computed (a shared prefix, the disk)
    int32_t n_from_disk = 0;                // of those, restored from the on-disk prefix cache
    StopReason stop_reason = StopReason::length;   // cancelled: cancel(), stop(), or on_text said stop
    BatchTimings timings;

    bool ok() const { return error == BatchError::none; }
    int32_t n_gen() const { return static_cast<int32_t>(tokens.size()); }
};

struct BatchRequest {
    std::vector<int32_t> prompt;    // token ids, BOS included: 1..n_ctx of them
    int32_t n_predict = -1;         // -1: until an end-of-generation token or the end of the context
    SamplingParams sampling;        // this request's own, seed included
    std::vector<std::string> stop;  // stop strings
    RepeatGuardParams repeat_guard;
    // >= 0: the log-probability of every generated token and those of its step's `logprobs` most likely tokens
    // (BatchResult::logprobs; engine/generation/token_logprobs.h). -1: off.
    int32_t logprobs = -1;
    bool special_text = false;      // control tokens in the text (GenerateOptions::special_text)
    // Each piece of final text, on the engine thread, as soon as it is known. Returns false to stop the
    // request (stop_reason cancelled). Must not block.
    std::function<bool(std::string_view piece)> on_text;
    // Exactly once per admitted request, after its last on_text: on the engine thread, or, for a
    // request that was still waiting, on the thread that called cancel() or stop(). Must not block
    // nor throw.
    std::function<void(BatchResult result)> on_done;
};

// submit()'s answer: the id, or why the request was refused (then on_done is never called).
struct Submission {
    RequestId id = 0;
    BatchError refused = BatchError::none;
    std::string message;   // one line: what was refused and why
    explicit operator bool() const { return refused == BatchError::none; }
};

// What one step of the batching scheduler forwarded (BatchEngineOptions::on_step).
struct BatchStepInfo {
    int32_t sequences = 0;        // spans in the forward
    int32_t decode_tokens = 0;    // decoding requests' newest tokens (one each)
    int32_t prefill_tokens = 0;   // prompt tokens, over every prefilling request
    int32_t prefill_sequences = 0;
};

struct BatchEngineOptions {
    int32_t parallel = 1;      // sequences decoded together (the batching scheduler's slots)
    int32_t max_waiting = 64;  // admitted requests waiting while others run; beyond it submit() refuses
    // Tokens one forward takes at most: every decoding request's newest token first, then prompt chunks
    // of the requests being prefilled, oldest first, up to this budget (chunked prefill).
    int32_t step_tokens = 512;
    // The waiting-queue policy. 0: a waiting request is admitted as soon as a slot (and KV pages) is
    // free. r > 0: while requests are decoding, waiting ones are admitted only once there are at least
    // r waiting per running request, or the oldest has waited max_waiting_steps steps: fewer, larger
    // admissions, so the running streams are slowed by prefill less often. Preempted requests resume first
    // whatever the policy.
    float waiting_served_ratio = 0.0f;
    int32_t max_waiting_steps = 16;
    // Keep the sequences of up to `parallel` finished requests and let a new request whose prompt starts
    // like a held sequence share those pages instead of recomputing them (false: free them at once).
    bool share_prefixes = true;
    // Called on the engine thread after each forward of the batching scheduler (tests, tracing).
    std::function<void(const BatchStepInfo&)> on_step;
};

struct BatchStats {
    int32_t parallel = 1;
    int32_t max_waiting = 0;
    int32_t running = 0;
    int32_t waiting = 0;
    bool draining = false;
    uint64_t submitted = 0;      // admitted
    uint64_t refused = 0;        // refused by submit (queue full, invalid, shutting down)
    uint64_t completed = 0;      // ran to a stop rule
    uint64_t cancelled = 0;      // stopped by cancel(), stop() or on_text
    uint64_t failed = 0;         // runtime errors
    uint64_t prompt_tokens = 0;  // of finished requests
    uint64_t reused_tokens = 0;  // of those, not computed: KV already held or restored from disk
    uint64_t disk_tokens = 0;    // of those, restored from the on-disk prefix cache
    uint64_t generated_tokens = 0;
    int64_t kv_used = 0;         // KV positions held (the paged cache: pages in use times their positions)
    int64_t kv_capacity = 0;     // positions there are (the paged cache: all its pages')
    uint64_t steps = 0;          // forwards of the batching scheduler
    uint64_t preempted = 0;      // requests put back to wait because the KV pool ran out of pages
    LatencyHistogram queue_time;
    LatencyHistogram first_token;      // submit -> first text piece
    LatencyHistogram time_per_token;   // decode time / generated tokens, one observation per request
    LatencyHistogram end_to_end;       // submit -> done
};

// What a BatchEngine serves: the loaded model's backend (loaded with a context of n_ctx positions), its
// tokenizer, and the caches. Each must outlive the engine, whose thread is their only user once start()
// ran (the tokenizer stays usable from any thread: encoding is const).
struct ServedModel {
    Backend& backend;
    const Tokenizer& tokenizer;
    int32_t n_ctx = 0;
    PrefixCache* prefix_cache = nullptr; // the on-disk prefix cache (--prompt-cache); null: none
    const Model* model = nullptr;        // the file whose changes stop the engine and that errors name; null: none
};
// What a Session holds (engine/generation/session.h), served: its backend, tokenizer, context, prefix cache
// and model, which the Session keeps alive. The Session must not generate while the engine runs.
ServedModel served_model(Session& session);

class BatchEngine {
public:
    // On a backend with sequences the backend's own cache (sequence 0) is emptied: the requests run in
    // sequences of their own. On one without, the engine's requests run in that cache, which it leaves
    // empty when it ends.
    BatchEngine(ServedModel served, BatchEngineOptions options);
    // stop(), then waits for the engine thread.
    ~BatchEngine();
    BatchEngine(const BatchEngine&) = delete;
    BatchEngine& operator=(const BatchEngine&) = delete;

    Submission submit(BatchRequest request);
    // True when the request was waiting or running (it then ends with stop_reason cancelled).
    bool cancel(RequestId id);

    // Spawns the engine thread running run().
    void start();
    // The engine loop on the calling thread: steps while there is work, sleeps when there is none,
    // returns once drain() found it idle or stop() was called. On a GPU backend call it on the thread
    // that loaded the model (or use start() only for device 0): the CUDA runtime's current device is
    // a per-thread setting that the backend sets once, when it is built.
    void run();
    // One scheduling step on the calling thread (the engine thread, or a test's): one forward of the
    // batching scheduler, or one whole request on a backend without sequences. False when there was
    // nothing to do.
    bool step();
    // Refuses new requests from now on; run() returns once the admitted ones are done.
    void drain();
    // Refuses new requests and cancels every admitted one; run() returns after the running step.
    void stop();
    // Waits for the thread start() spawned (after drain() or stop()).
    void join();

    // Why the engine stopped for good ("" while it has not): a model file it reads changed under it
    // (formats/mapped_file.h check_mapped_files). Every request running or waiting then failed with this
    // message, and new ones are refused as after stop(): a server built on the engine should exit.
    std::string fatal_error() const;

    // Nothing waiting nor running.
    bool idle() const;
    BatchStats stats() const;
    int32_t n_ctx() const { return n_ctx_; }
    const BatchEngineOptions& options() const { return options_; }

private:
    struct Job;
    using Clock = std::chrono::steady_clock;
    using JobPtr = std::shared_ptr<Job>;
    struct Held {                      // a finished request's sequence kept for its prefix
        int32_t seq = 0;
        std::vector<int32_t> tokens;   // whose K/V it holds
    };

    // One at a time through the Session (a backend without sequences).
    bool step_one();
    void run_job(Job& job);
    // The batching scheduler (engine thread).
    bool step_batched();
    bool end_cancelled();   // ends the running and preempted requests whose cancel flag is up
    void admit();
    void start_job(Job& job);
    // The on-disk prefix cache's part (prompt_cache_): the cached blocks of `target` after what the
    // job's sequence holds, and the prompt's new blocks once it is prefilled. Never fail a request.
    void restore_from_disk(Job& job);
    void store_prompt(const Job& job);
    // Builds and runs the step's forward (preempting when the pool is short); false when none ran.
    bool forward_step(std::vector<JobPtr>& spanned, std::vector<int32_t>& chunk);
    void preempt(Job& job);
    void finish_job(Job& job, StopReason reason);
    void fail_job(Job& job, std::string message);
    // Fails every running, preempted and waiting request with `message` and stops the engine (fatal_error).
    void fail_all(const std::string& message);
    void retire(Job& job, BatchResult result, bool keep_prefix);
    void release_seq(Job& job, bool keep);
    bool drop_oldest_held();
    int32_t new_seq_id() const;
    void update_kv_stats();   // under mutex_
    bool has_work() const;    // under mutex_

    void finish(Job& job, BatchResult result);   // stats, then on_done
    void deliver_cancelled(std::vector<JobPtr> jobs);

    Backend& backend_;
    const Tokenizer& tokenizer_;
    const std::string model_path_; // "" when the engine serves no file (tests' fakes)
    const BatchEngineOptions options_;
    const int32_t n_ctx_;
    const bool batched_;   // the backend runs sequences: the batching scheduler
    // The on-disk prefix cache on the batching path (null: none). Without sequences solo_ reads and writes it.
    PrefixCache* const prompt_cache_;
    // A backend without sequences: the Session that runs one request at a time in the backend's cache.
    std::unique_ptr<Session> solo_;

    mutable std::mutex mutex_;   // guards everything below (the engine thread alone changes running_/resume_)
    std::condition_variable wake_;
    std::deque<JobPtr> waiting_;
    std::deque<JobPtr> resume_;    // preempted requests, resumed before the waiting ones
    std::vector<JobPtr> running_;  // in admission order
    RequestId next_id_ = 1;
    bool draining_ = false;
    bool stopping_ = false;
    std::string fatal_error_;
    BatchStats stats_;
    std::thread thread_;

    // The engine thread's alone.
    std::vector<Held> held_;   // oldest first
    int32_t held_back_steps_ = 0;   // steps the waiting-queue policy kept the queue waiting
    std::vector<int32_t> row_argmax_; // a step's argmax of every row, when a request wants it
};

} // namespace tern
