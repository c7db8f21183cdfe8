#include "engine/batch/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <new>
#include <optional>
#include <utility>

#include "engine/backend.h"
#include "engine/generation/request_decoder.h"
#include "engine/generation/session.h"
#include "engine/load_errors.h"
#include "engine/model.h"
#include "engine/prefix_cache/prefix_cache.h"
#include "formats/mapped_file.h"

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

// What a request asks of its decoder (a Session's generate on a backend without sequences).
GenerateOptions generate_options(const BatchRequest& r, const std::atomic<bool>* cancel) {
    GenerateOptions o;
    o.n_predict = r.n_predict;
    o.sampling = r.sampling;
    o.stop = r.stop;
    o.repeat_guard = r.repeat_guard;
    o.logprobs = r.logprobs;
    o.special_text = r.special_text;
    o.cancel = cancel;
    return o;
}

int32_t pages_for(size_t positions, int32_t per_page) {
    return static_cast<int32_t>((positions + static_cast<size_t>(per_page) - 1) / static_cast<size_t>(per_page));
}

} // namespace

struct BatchEngine::Job {
    RequestId id = 0;
    BatchRequest request;
    Clock::time_point submitted;
    std::atomic<bool> cancel{false};

    // The batching scheduler's state, on the engine thread. A request is admitted (start_job) into a
    // backend sequence, prefills `target` in chunks, then decodes one token per step; a preemption frees
    // its sequence and puts it back to wait with `target` = everything it had but the newest token.
    int32_t seq = -1;               // its backend sequence while running; -1: none
    std::vector<int32_t> kv;        // the tokens whose K/V the sequence holds, in position order
    std::vector<int32_t> target;    // what the sequence must hold before decoding (goes on)
    bool decoding = false;          // the newest generated token is forwarded next
    GenerateOptions options;        // the request's, read by its decoder
    std::unique_ptr<RequestDecoder> decoder; // made at the first admission, kept across preemptions
    int32_t n_reused = 0;
    int32_t n_from_disk = 0;
    bool shown = false;
    bool prefilled = false;
    Clock::time_point started, first_piece, decode_started;
    double prefill_ms = 0.0;

    // The request's text callback as the engine shows it: the time of the first piece noted, a callback
    // that throws taken as one that stops listening, and the cancel flag read after every piece.
    TextCallback text_callback() {
        return [this](std::string_view piece) {
            if (!shown) {
                shown = true;
                first_piece = Clock::now();
            }
            bool go_on = true;
            if (request.on_text) {
                try {
                    go_on = request.on_text(piece);
                } catch (...) {
                    go_on = false;
                }
            }
            return go_on && !cancel.load(std::memory_order_relaxed);
        };
    }
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

ServedModel served_model(Session& session) {
    return {.backend = session.backend(),
            .tokenizer = session.tokenizer(),
            .n_ctx = session.n_ctx(),
            .prefix_cache = session.prefix_cache(),
            .model = session.model()};
}

BatchEngine::BatchEngine(ServedModel served, BatchEngineOptions options)
    : backend_(served.backend), tokenizer_(served.tokenizer),
      model_path_(served.model ? served.model->file.path() : std::string()), options_(std::move(options)),
      n_ctx_(served.n_ctx), batched_(backend_.supports_sequences()),
      prompt_cache_(batched_ ? served.prefix_cache : nullptr) {
    stats_.parallel = std::max(options_.parallel, 1);
    stats_.max_waiting = std::max(options_.max_waiting, 0);
    if (batched_) {
        backend_.kv_truncate(0); // sequence 0 stays empty: every request runs in a sequence of its own
        update_kv_stats();
    } else {
        solo_ = std::make_unique<Session>(backend_, tokenizer_, n_ctx_, served.prefix_cache, served.model);
        stats_.kv_capacity = n_ctx_;
    }
}

BatchEngine::~BatchEngine() {
    stop();
    join();
    if (!batched_) {
        // A Session that shares the backend finds an empty cache, not positions whose tokens it does not know.
        try {
            backend_.kv_truncate(0);
        } catch (...) {
        }
        return;
    }
    // No engine thread is left: requests a caller's own step() calls left running end here, and the
    // sequences kept for their prefixes go back to the pool (the Session may run alone again).
    try {
        end_cancelled();
        while (drop_oldest_held()) {
        }
    } catch (...) {
    }
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
    if (std::string misfit = prompt_over_context(request.prompt.size(), n_ctx_); !misfit.empty())
        return refuse(BatchError::invalid, std::move(misfit));
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
        // Free slots take requests beyond max_waiting: it counts the requests beyond those running.
        const int64_t slots = batched_ ? stats_.parallel : 1;
        const int64_t free_slots =
            std::max<int64_t>(slots - static_cast<int64_t>(running_.size() + resume_.size()), 0);
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
    JobPtr removed;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto is_it = [id](const JobPtr& j) { return j->id == id; };
        // Running or preempted: the engine thread ends it at its next step (its pages go then).
        JobPtr active;
        if (const auto r = std::find_if(running_.begin(), running_.end(), is_it); r != running_.end()) active = *r;
        if (const auto r = std::find_if(resume_.begin(), resume_.end(), is_it); r != resume_.end()) active = *r;
        if (active) {
            active->cancel.store(true, std::memory_order_relaxed);
            wake_.notify_all();
            return true;
        }
        const auto it = std::find_if(waiting_.begin(), waiting_.end(), is_it);
        if (it == waiting_.end()) return false;
        removed = std::move(*it);
        waiting_.erase(it);
    }
    wake_.notify_all();   // drain() may be waiting for the queue to empty
    deliver_cancelled({std::move(removed)});
    return true;
}

void BatchEngine::deliver_cancelled(std::vector<JobPtr> jobs) {
    for (const JobPtr& job : jobs) {
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

bool BatchEngine::has_work() const { return !waiting_.empty() || !resume_.empty() || !running_.empty(); }

void BatchEngine::run() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mutex_);
            wake_.wait(lock, [&] { return has_work() || stopping_ || draining_; });
            if (!has_work()) return;   // stopped, or drained: nothing is left
        }
        step();
    }
}

bool BatchEngine::step() {
    try {
        return batched_ ? step_batched() : step_one();
    } catch (const FileChanged& e) {
        fail_all(e.what());
        return true;
    }
}

void BatchEngine::fail_all(const std::string& message) {
    std::vector<JobPtr> jobs;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        draining_ = true;
        fatal_error_ = message;
        jobs.assign(running_.begin(), running_.end());
        jobs.insert(jobs.end(), std::make_move_iterator(resume_.begin()), std::make_move_iterator(resume_.end()));
        jobs.insert(jobs.end(), std::make_move_iterator(waiting_.begin()), std::make_move_iterator(waiting_.end()));
        resume_.clear();
        waiting_.clear();
    }
    for (const JobPtr& j : jobs) fail_job(*j, message);
    wake_.notify_all();
}

std::string BatchEngine::fatal_error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return fatal_error_;
}

// ---------------------------------------------------------------------------------------------
// One request at a time through the Session.

bool BatchEngine::step_one() {
    JobPtr job;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (waiting_.empty() || stopping_) return false;
        job = std::move(waiting_.front());
        waiting_.pop_front();
        running_.assign(1, job);
    }
    run_job(*job);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        running_.clear();
    }
    wake_.notify_all();
    // The Session checked the model between its steps and failed the job if it changed; the engine stops then.
    check_mapped_files();
    return true;
}

void BatchEngine::run_job(Job& job) {
    const Clock::time_point started = Clock::now();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.kv_used = static_cast<int64_t>(job.request.prompt.size());
    }
    const BatchRequest& req = job.request;
    const GenerateOptions o = generate_options(req, &job.cancel);
    BatchResult r;
    r.id = job.id;
    r.n_prompt = static_cast<int32_t>(req.prompt.size());
    try {
        GenerateResult g = solo_->generate(req.prompt, o, job.text_callback());
        r.text = std::move(g.text);
        r.tokens = std::move(g.tokens);
        r.logprobs = std::move(g.logprobs);
        r.n_reused = g.n_reused;
        r.n_from_disk = g.n_from_disk;
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
            solo_->reset();
        } catch (...) {
        }
    }
    const Clock::time_point done = Clock::now();
    r.timings.queue_ms = ms_between(job.submitted, started);
    r.timings.first_token_ms = ms_between(job.submitted, job.shown ? job.first_piece : done);
    r.timings.total_ms = ms_between(job.submitted, done);
    finish(job, std::move(r));
}

// ---------------------------------------------------------------------------------------------
// The batching scheduler.

bool BatchEngine::step_batched() {
    bool worked = end_cancelled();
    admit();
    std::vector<JobPtr> spanned;
    std::vector<int32_t> chunk;
    if (!forward_step(spanned, chunk)) {
        std::lock_guard<std::mutex> lock(mutex_);
        update_kv_stats();
        return worked || !running_.empty();
    }
    // A model rewritten in place since the last step: this step's rows may be garbage (step() stops the engine).
    check_mapped_files();
    const bool any_argmax =
        std::any_of(spanned.begin(), spanned.end(), [](const JobPtr& j) { return j->decoder->wants_argmax(); });
    if (any_argmax) {
        row_argmax_.resize(spanned.size());
        backend_.argmax(row_argmax_);
    }
    const Clock::time_point now = Clock::now();
    for (size_t row = 0; row < spanned.size(); ++row) {
        Job& j = *spanned[row];
        if (!j.decoding) {
            if (j.kv.size() < j.target.size()) continue;   // more of the prompt to come
            if (!j.prefilled) {
                j.prefilled = true;
                j.prefill_ms = ms_between(j.started, now);
                j.decode_started = now;
                store_prompt(j);
            }
            j.decoding = true;
            // A resumed request's row is not sampled: its newest token, already chosen, is forwarded next.
            if (j.decoder->stream().n_generated() > 0) continue;
        }
        ProducedToken produced;
        try {
            const int r = static_cast<int>(row);
            j.decoder->check_rows(r, 1, static_cast<int32_t>(j.kv.size()) - 1);
            produced = j.decoder->next(r, any_argmax ? row_argmax_[row] : -1);
        } catch (const std::bad_alloc&) {
            fail_job(j, "out of memory while sampling");
            continue;
        } catch (const std::exception& e) {
            fail_job(j, e.what());
            continue;
        }
        std::optional<StopReason> stop = produced.stop;
        // The token goes to position kv.size(): past the context, the request ends.
        if (produced.token && !stop && static_cast<int64_t>(j.kv.size()) >= n_ctx_) stop = StopReason::context;
        if (stop) finish_job(j, *stop);
    }
    {
        std::lock_guard<std::mutex> lock(mutex_);
        update_kv_stats();
    }
    wake_.notify_all();
    return true;
}

bool BatchEngine::end_cancelled() {
    std::vector<JobPtr> ended;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (const JobPtr& j : running_) {
            if (stopping_) j->cancel.store(true, std::memory_order_relaxed);
            if (j->cancel.load(std::memory_order_relaxed)) ended.push_back(j);
        }
        for (auto it = resume_.begin(); it != resume_.end();) {
            if (stopping_) (*it)->cancel.store(true, std::memory_order_relaxed);
            if ((*it)->cancel.load(std::memory_order_relaxed)) {
                ended.push_back(std::move(*it));
                it = resume_.erase(it);
            } else {
                ++it;
            }
        }
    }
    for (const JobPtr& j : ended) finish_job(*j, StopReason::cancelled);
    return !ended.empty();
}

void BatchEngine::admit() {
    const KvPoolUse pool = backend_.kv_pool();
    const int32_t per_page = std::max(pool.positions_per_page, 1);
    // Pages the running requests still need next (a decoding one at a page boundary takes a new page, a
    // prefilling one the rest of its prompt's), and pages the held prefixes would give back.
    int32_t free_pages = pool.pages - pool.pages_in_use;
    for (const JobPtr& j : running_) {
        if (j->decoding)
            free_pages -= j->kv.size() % static_cast<size_t>(per_page) == 0 ? 1 : 0;
        else
            free_pages -= pages_for(j->target.size(), per_page) - pages_for(j->kv.size(), per_page);
    }
    for (const Held& h : held_) free_pages += pages_for(h.tokens.size(), per_page);

    std::vector<JobPtr> taken;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) return;
        const size_t slots = static_cast<size_t>(stats_.parallel);
        const float ratio = options_.waiting_served_ratio;
        const bool policy_admits = running_.empty() || ratio <= 0.0f ||
                                   static_cast<float>(waiting_.size()) >= ratio * static_cast<float>(running_.size()) ||
                                   held_back_steps_ >= options_.max_waiting_steps;
        bool held_back = false;
        while (running_.size() + taken.size() < slots) {
            const bool resuming = !resume_.empty();
            std::deque<JobPtr>& queue = resuming ? resume_ : waiting_;
            if (queue.empty()) break;
            if (!resuming && !policy_admits) {
                held_back = true;
                break;
            }
            const JobPtr& j = queue.front();
            const int32_t need = pages_for(j->decoder ? j->target.size() : j->request.prompt.size(), per_page);
            // Alone, a request always fits (the pool holds a whole context); beside others it waits for pages.
            if ((!running_.empty() || !taken.empty()) && need > free_pages) break;
            free_pages -= need;
            if (!resuming) held_back_steps_ = 0;
            taken.push_back(std::move(queue.front()));
            queue.pop_front();
        }
        if (held_back) ++held_back_steps_;
        running_.insert(running_.end(), taken.begin(), taken.end());
    }
    for (const JobPtr& j : taken) {
        try {
            start_job(*j);
        } catch (const std::bad_alloc&) {
            fail_job(*j, "out of memory while starting the request");
        } catch (const std::exception& e) {
            fail_job(*j, e.what());
        }
    }
}

void BatchEngine::start_job(Job& j) {
    const bool first = !j.decoder;
    if (first) {
        j.started = Clock::now();
        j.target = j.request.prompt;
        j.options = generate_options(j.request, &j.cancel);
        j.decoder = std::make_unique<RequestDecoder>(backend_, tokenizer_, j.request.prompt, j.options,
                                                     j.text_callback(), model_path_);
    }
    // The longest start of `target` a held or running sequence holds (never the last token: its row is
    // what the request samples or continues from), shared instead of recomputed.
    int32_t from = -1;
    size_t common = 0;
    const auto consider = [&](int32_t seq, const std::vector<int32_t>& tokens) {
        const size_t n = shared_prefix(tokens, j.target, j.target.size() - 1);
        if (n > common) {
            common = n;
            from = seq;
        }
    };
    if (options_.share_prefixes) {
        for (const Held& h : held_) consider(h.seq, h.tokens);
        for (const JobPtr& r : running_)
            if (r.get() != &j && r->seq >= 0) consider(r->seq, r->kv);
    }
    const int32_t seq = new_seq_id();
    if (common > 0)
        backend_.seq_fork(from, seq, static_cast<int32_t>(common));
    else
        backend_.seq_create(seq);
    j.seq = seq;
    j.kv.assign(j.target.begin(), j.target.begin() + static_cast<std::ptrdiff_t>(common));
    j.decoding = false;
    const size_t n_from_memory = j.kv.size();
    restore_from_disk(j);
    if (first) {
        j.n_reused = static_cast<int32_t>(j.kv.size());
        j.n_from_disk = static_cast<int32_t>(j.kv.size() - n_from_memory);
    }
}

void BatchEngine::restore_from_disk(Job& j) {
    if (!prompt_cache_) return;
    // Never the last token of `target`: its row is what the request samples or continues from.
    const PrefixCache::Restored disk = prompt_cache_->restore(backend_, j.target, static_cast<int32_t>(j.kv.size()),
                                                              static_cast<int32_t>(j.target.size()) - 1, j.seq);
    // A block that starts inside the shared prefix replaces its positions from the block's start.
    j.kv.assign(j.target.begin(), j.target.begin() + disk.n_held);
}

void BatchEngine::store_prompt(const Job& j) {
    if (!prompt_cache_) return;
    try {
        store_prompt_blocks(*prompt_cache_, backend_, j.request.prompt, j.kv, j.seq);
    } catch (const std::exception&) {
        // The cache is an optimisation: a failing directory costs its blocks, never the request.
    }
}

int32_t BatchEngine::new_seq_id() const {
    for (int32_t id = 1;; ++id) {
        const bool used =
            std::any_of(running_.begin(), running_.end(), [id](const JobPtr& j) { return j->seq == id; }) ||
            std::any_of(held_.begin(), held_.end(), [id](const Held& h) { return h.seq == id; });
        if (!used) return id;
    }
}

bool BatchEngine::forward_step(std::vector<JobPtr>& spanned, std::vector<int32_t>& chunk) {
    std::vector<int32_t> tokens;
    std::vector<SequenceSpan> spans;
    for (;;) {
        tokens.clear();
        spans.clear();
        spanned.clear();
        chunk.clear();
        BatchStepInfo info;
        // Every decoding request's newest token, then prompt chunks under the step's budget, oldest first.
        for (const JobPtr& j : running_) {
            if (!j->decoding || j->seq < 0) continue;
            tokens.push_back(j->decoder->stream().generated().back());
            spans.push_back({j->seq, 1, LogitsWanted::last});
            spanned.push_back(j);
            chunk.push_back(1);
            ++info.decode_tokens;
        }
        int64_t budget = static_cast<int64_t>(std::max(options_.step_tokens, 1)) - info.decode_tokens;
        for (const JobPtr& j : running_) {
            if (j->decoding || j->seq < 0 || budget <= 0) continue;
            const auto left = static_cast<int64_t>(j->target.size() - j->kv.size());   // prompt tokens not yet in KV
            const auto n = static_cast<int32_t>(std::min<int64_t>(budget, left));
            const auto first = j->target.begin() + static_cast<std::ptrdiff_t>(j->kv.size());
            tokens.insert(tokens.end(), first, first + n);
            spans.push_back({j->seq, n, LogitsWanted::last});
            spanned.push_back(j);
            chunk.push_back(n);
            budget -= n;
            info.prefill_tokens += n;
            ++info.prefill_sequences;
        }
        if (spans.empty()) return false;

        ForwardBatch batch;
        batch.tokens = tokens;
        batch.spans = spans;
        try {
            backend_.forward(batch);
        } catch (const KvPoolExhausted&) {
            // Nothing was written: free pages and run the step again, without the youngest request if need be.
            if (drop_oldest_held()) continue;
            if (running_.size() > 1) {
                preempt(*running_.back());
                continue;
            }
            fail_job(*running_.front(), "the KV cache pool cannot hold this request");
            return false;
        } catch (const std::bad_alloc&) {
            for (const JobPtr& j : spanned) fail_job(*j, "out of memory while generating");
            return false;
        } catch (const std::exception& e) {
            const std::string what = e.what();
            for (const JobPtr& j : spanned) fail_job(*j, what);
            return false;
        }
        size_t t = 0;
        for (size_t s = 0; s < spanned.size(); ++s) {
            Job& j = *spanned[s];
            j.kv.insert(j.kv.end(), tokens.begin() + static_cast<std::ptrdiff_t>(t),
                        tokens.begin() + static_cast<std::ptrdiff_t>(t + static_cast<size_t>(chunk[s])));
            t += static_cast<size_t>(chunk[s]);
        }
        info.sequences = static_cast<int32_t>(spans.size());
        {
            std::lock_guard<std::mutex> lock(mutex_);
            ++stats_.steps;
        }
        call_quietly(options_.on_step, info);
        return true;
    }
}

void BatchEngine::preempt(Job& j) {
    release_seq(j, false);
    j.kv.clear();
    j.decoding = false;
    // On resumption it recomputes all it had: the prompt and the generated tokens but the newest, which
    // is forwarded as its next decode step.
    const CompletionStream& stream = j.decoder->stream();
    const std::span<const int32_t> history = stream.history();
    j.target.assign(history.begin(), history.end() - (stream.n_generated() > 0 ? 1 : 0));
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = std::find_if(running_.begin(), running_.end(), [&j](const JobPtr& r) { return r.get() == &j; });
    if (it == running_.end()) return;
    resume_.push_front(std::move(*it));
    running_.erase(it);
    ++stats_.preempted;
}

void BatchEngine::release_seq(Job& j, bool keep) {
    if (j.seq < 0) return;
    const int32_t seq = j.seq;
    j.seq = -1;
    if (keep && options_.share_prefixes && !j.kv.empty()) {
        held_.push_back({seq, std::move(j.kv)});
        j.kv.clear();
        while (held_.size() > static_cast<size_t>(stats_.parallel)) drop_oldest_held();
        return;
    }
    try {
        backend_.seq_free(seq);
    } catch (...) {
    }
}

bool BatchEngine::drop_oldest_held() {
    if (held_.empty()) return false;
    const int32_t seq = held_.front().seq;
    held_.erase(held_.begin());
    try {
        backend_.seq_free(seq);
    } catch (...) {
    }
    return true;
}

void BatchEngine::finish_job(Job& j, StopReason reason) {
    BatchResult r;
    r.id = j.id;
    r.n_prompt = static_cast<int32_t>(j.request.prompt.size());
    r.n_reused = j.n_reused;
    r.n_from_disk = j.n_from_disk;
    r.stop_reason = reason;
    if (j.decoder) {
        Completion c = j.decoder->finish(reason);
        r.stop_reason = c.stop_reason;
        r.tokens = std::move(c.tokens);
        r.text = std::move(c.text);
        r.logprobs = std::move(c.logprobs);
    }
    const Clock::time_point done = Clock::now();
    const Clock::time_point started = j.decoder ? j.started : done;
    r.timings.queue_ms = ms_between(j.submitted, started);
    r.timings.prefill_ms = j.prefilled ? j.prefill_ms : ms_between(started, done);
    r.timings.decode_ms = j.prefilled ? ms_between(j.decode_started, done) : 0.0;
    r.timings.first_token_ms = ms_between(j.submitted, j.shown ? j.first_piece : done);
    r.timings.total_ms = ms_between(j.submitted, done);
    const bool keep_prefix = r.stop_reason != StopReason::cancelled;
    retire(j, std::move(r), keep_prefix);
}

void BatchEngine::fail_job(Job& j, std::string message) {
    BatchResult r;
    r.id = j.id;
    r.n_prompt = static_cast<int32_t>(j.request.prompt.size());
    r.error = BatchError::runtime;
    r.message = std::move(message);
    const Clock::time_point done = Clock::now();
    r.timings.queue_ms = ms_between(j.submitted, j.decoder ? j.started : done);
    r.timings.first_token_ms = ms_between(j.submitted, j.shown ? j.first_piece : done);
    r.timings.total_ms = ms_between(j.submitted, done);
    retire(j, std::move(r), false);   // a forward that failed half-way leaves its positions in an unknown state
}

// The request leaves the running set: its sequence released (kept for its prefix when keep_prefix), then on_done.
void BatchEngine::retire(Job& j, BatchResult r, bool keep_prefix) {
    release_seq(j, keep_prefix);
    JobPtr keep_alive;   // j lives until finish() returns
    {
        std::lock_guard<std::mutex> lock(mutex_);
        const auto it = std::find_if(running_.begin(), running_.end(), [&j](const JobPtr& p) { return p.get() == &j; });
        if (it != running_.end()) {
            keep_alive = std::move(*it);
            running_.erase(it);
        }
    }
    finish(j, std::move(r));
}

void BatchEngine::update_kv_stats() {
    const KvPoolUse use = backend_.kv_pool();
    stats_.kv_capacity = static_cast<int64_t>(use.pages) * use.positions_per_page;
    stats_.kv_used = static_cast<int64_t>(use.pages_in_use) * use.positions_per_page;
}

// ---------------------------------------------------------------------------------------------

void BatchEngine::finish(Job& job, BatchResult r) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (batched_)
            update_kv_stats();
        else
            stats_.kv_used = static_cast<int64_t>(solo_->kv_tokens().size());
        if (!r.ok()) {
            ++stats_.failed;
        } else {
            if (r.stop_reason == StopReason::cancelled)
                ++stats_.cancelled;
            else
                ++stats_.completed;
            stats_.prompt_tokens += static_cast<uint64_t>(r.n_prompt);
            stats_.reused_tokens += static_cast<uint64_t>(r.n_reused);
            stats_.disk_tokens += static_cast<uint64_t>(r.n_from_disk);
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
    std::vector<JobPtr> dropped;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        draining_ = true;
        dropped.assign(std::make_move_iterator(waiting_.begin()), std::make_move_iterator(waiting_.end()));
        waiting_.clear();
        for (const JobPtr& j : running_) j->cancel.store(true, std::memory_order_relaxed);
        for (const JobPtr& j : resume_) j->cancel.store(true, std::memory_order_relaxed);
    }
    wake_.notify_all();
    deliver_cancelled(std::move(dropped));
}

void BatchEngine::join() {
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

bool BatchEngine::idle() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return !has_work();
}

BatchStats BatchEngine::stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    BatchStats s = stats_;
    s.running = static_cast<int32_t>(running_.size());
    s.waiting = static_cast<int32_t>(waiting_.size() + resume_.size());
    s.draining = draining_;
    return s;
}

} // namespace tern
