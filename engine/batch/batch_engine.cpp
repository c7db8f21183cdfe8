#include "engine/batch/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <new>
#include <utility>

#include "engine/generation/session.h"

namespace tern {

namespace {

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// A callback of the caller's that throws must not take the engine thread down with it.
template <class F, class... Args> void call_quietly(const F& f, Args&&... args) noexcept {
    if (!f) return;
    try {
        f(std::forward<Args>(args)...);
    } catch (...) {
    }
}

} // namespace

struct BatchEngine::Job {
    RequestId id = 0;
    BatchRequest request;
    Clock::time_point submitted;
    std::atomic<bool> cancel{false};
};

std::string_view batch_error_name(BatchError error) {
    switch (error) {
    case BatchError::none: return "";
    case BatchError::queue_full: return "queue_full";
    case BatchError::invalid: return "invalid";
    case BatchError::shutting_down: return "shutting_down";
    case BatchError::runtime: return "runtime";
    }
    return "unknown";
}

BatchEngine::BatchEngine(Session& session, BatchEngineOptions options)
    : session_(session), options_(options), n_ctx_(session.n_ctx()) {
    stats_.parallel = std::max(options_.parallel, 1);
    stats_.max_waiting = std::max(options_.max_waiting, 0);
    stats_.kv_capacity = n_ctx_;
    stats_.kv_used = static_cast<int64_t>(session_.kv_tokens().size());
}

BatchEngine::~BatchEngine() {
    stop();
    join();
}

Submission BatchEngine::submit(BatchRequest request) {
    Submission s;
    const auto refuse = [&](BatchError why, std::string message) {
        s.refused = why;
        s.message = std::move(message);
        std::lock_guard<std::mutex> lock(mutex_);
        ++stats_.refused;
        return s;
    };
    if (request.prompt.empty()) return refuse(BatchError::invalid, "the prompt is empty (no tokens to start from)");
    if (request.prompt.size() > static_cast<size_t>(n_ctx_))
        return refuse(BatchError::invalid, "the prompt has " + std::to_string(request.prompt.size()) +
                                               " tokens but the context is " + std::to_string(n_ctx_));
    if (request.n_predict < -1)
        return refuse(BatchError::invalid, "n_predict must be -1 (until the end) or a count of tokens");

    auto job = std::make_shared<Job>();
    job->request = std::move(request);
    job->submitted = Clock::now();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (draining_ || stopping_) {
            ++stats_.refused;
            s.refused = BatchError::shutting_down;
            s.message = "the server is shutting down and takes no new requests";
            return s;
        }
        // An idle engine takes one more: max_waiting counts the requests beyond those running.
        const int64_t free_slots = running_ ? 0 : 1;
        if (static_cast<int64_t>(waiting_.size()) >= stats_.max_waiting + free_slots) {
            ++stats_.refused;
            s.refused = BatchError::queue_full;
            s.message = "too many requests are waiting (" + std::to_string(waiting_.size()) +
                        "); try again later";
            return s;
        }
        job->id = next_id_++;
        s.id = job->id;
        waiting_.push_back(std::move(job));
        ++stats_.submitted;
    }
    wake_.notify_all();
    return s;
}

bool BatchEngine::cancel(RequestId id) {
    std::shared_ptr<Job> removed;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (running_ && running_->id == id) {
            running_->cancel.store(true, std::memory_order_relaxed);
            return true;
        }
        const auto it = std::find_if(waiting_.begin(), waiting_.end(), [id](const auto& j) { return j->id == id; });
        if (it == waiting_.end()) return false;
        removed = std::move(*it);
        waiting_.erase(it);
    }
    wake_.notify_all();   // drain() may be waiting for the queue to empty
    deliver_cancelled({std::move(removed)});
    return true;
}

void BatchEngine::deliver_cancelled(std::vector<std::shared_ptr<Job>> jobs) {
    for (const std::shared_ptr<Job>& job : jobs) {
        BatchResult r;
        r.id = job->id;
        r.n_prompt = static_cast<int32_t>(job->request.prompt.size());
        r.stop_reason = StopReason::cancelled;
        const double ms = ms_between(job->submitted, Clock::now());
        r.timings.queue_ms = r.timings.first_token_ms = r.timings.total_ms = ms;
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ++stats_.cancelled;
        }
        call_quietly(job->request.on_done, std::move(r));
    }
}

void BatchEngine::start() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (thread_.joinable()) return;
    thread_ = std::thread([this] { run(); });
}

void BatchEngine::run() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return !waiting_.empty() || stopping_ || draining_; });
            if (stopping_ || waiting_.empty()) return;   // stopped, or drained: nothing is left
        }
        step();
    }
}

bool BatchEngine::step() {
    std::shared_ptr<Job> job;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (waiting_.empty() || stopping_) return false;
        job = std::move(waiting_.front());
        waiting_.pop_front();
        running_ = job;
    }
    run_job(*job);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        running_.reset();
    }
    wake_.notify_all();
    return true;
}

void BatchEngine::run_job(Job& job) {
    const Clock::time_point started = Clock::now();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.kv_used = static_cast<int64_t>(job.request.prompt.size());
    }
    BatchRequest& req = job.request;
    GenerateOptions o;
    o.n_predict = req.n_predict;
    o.sampling = req.sampling;
    o.stop = req.stop;
    o.repeat_guard = req.repeat_guard;
    o.cancel = &job.cancel;

    bool shown = false;
    Clock::time_point first_piece = started;
    const TextCallback on_text = [&](std::string_view piece) {
        if (!shown) {
            shown = true;
            first_piece = Clock::now();
        }
        bool go_on = true;
        if (req.on_text) {
            try {
                go_on = req.on_text(piece);
            } catch (...) {
                go_on = false;
            }
        }
        return go_on && !job.cancel.load(std::memory_order_relaxed);
    };

    BatchResult r;
    r.id = job.id;
    r.n_prompt = static_cast<int32_t>(req.prompt.size());
    try {
        GenerateResult g = session_.generate(req.prompt, o, on_text);
        r.text = std::move(g.text);
        r.tokens = std::move(g.tokens);
        r.n_reused = g.n_reused;
        r.stop_reason = g.stop_reason;
        r.timings.prefill_ms = g.prefill_ms;
        r.timings.decode_ms = g.decode_ms;
    } catch (const std::bad_alloc&) {
        r.error = BatchError::runtime;
        r.message = "out of memory while generating";
    } catch (const std::exception& e) {
        r.error = BatchError::runtime;
        r.message = e.what();
    }
    if (!r.ok()) {
        // A forward that failed half-way leaves the cache in an unknown state: start the next one cold.
        try {
            session_.reset();
        } catch (...) {
        }
    }
    const Clock::time_point done = Clock::now();
    r.timings.queue_ms = ms_between(job.submitted, started);
    r.timings.first_token_ms = ms_between(job.submitted, shown ? first_piece : done);
    r.timings.total_ms = ms_between(job.submitted, done);
    finish(job, std::move(r));
}

void BatchEngine::finish(Job& job, BatchResult r) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.kv_used = static_cast<int64_t>(session_.kv_tokens().size());
        if (!r.ok()) {
            ++stats_.failed;
        } else {
            if (r.stop_reason == StopReason::cancelled)
                ++stats_.cancelled;
            else
                ++stats_.completed;
            stats_.prompt_tokens += static_cast<uint64_t>(r.n_prompt);
            stats_.reused_tokens += static_cast<uint64_t>(r.n_reused);
            stats_.generated_tokens += static_cast<uint64_t>(r.n_gen());
            stats_.queue_time.observe(r.timings.queue_ms / 1000.0);
            if (r.n_gen() > 0) {
                stats_.first_token.observe(r.timings.first_token_ms / 1000.0);
                stats_.time_per_token.observe(r.timings.decode_ms / 1000.0 / r.n_gen());
            }
            stats_.end_to_end.observe(r.timings.total_ms / 1000.0);
        }
    }
    call_quietly(job.request.on_done, std::move(r));
}

void BatchEngine::drain() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        draining_ = true;
    }
    wake_.notify_all();
}

void BatchEngine::stop() {
    std::vector<std::shared_ptr<Job>> dropped;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        draining_ = true;
        dropped.assign(std::make_move_iterator(waiting_.begin()), std::make_move_iterator(waiting_.end()));
        waiting_.clear();
        if (running_) running_->cancel.store(true, std::memory_order_relaxed);
    }
    wake_.notify_all();
    deliver_cancelled(std::move(dropped));
}

void BatchEngine::join() {
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool BatchEngine::idle() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return waiting_.empty() && !running_;
}

BatchStats BatchEngine::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    BatchStats s = stats_;
    s.running = running_ ? 1 : 0;
    s.waiting = static_cast<int32_t>(waiting_.size());
    s.draining = draining_;
    return s;
}

} // namespace tern
