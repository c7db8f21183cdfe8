#include "engine/generation/session.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>
#include <utility>

#include "base/error.h"
#include "engine/model.h"
#include "engine/speculative/drafter.h"
#include "formats/mapped_file.h"

namespace tern {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

bool cancelled(const GenerateOptions& o) { return o.cancel && o.cancel->load(std::memory_order_relaxed); }

} // namespace

std::string_view stop_reason_name(StopReason r) {
    switch (r) {
    case StopReason::eos: return "eos";
    case StopReason::length: return "length";
    case StopReason::stop: return "stop";
    case StopReason::context: return "context";
    case StopReason::repetition: return "repetition";
    case StopReason::cancelled: return "cancelled";
    }
    return "unknown";
}

// ---------------------------------------------------------------------------------------------

Session::Session(std::unique_ptr<Backend> backend, std::unique_ptr<Tokenizer> tokenizer, int32_t n_ctx,
                 std::shared_ptr<const Model> model)
    : owned_model_(std::move(model)), owned_backend_(std::move(backend)), owned_tokenizer_(std::move(tokenizer)),
      model_(owned_model_.get()), backend_(owned_backend_.get()), tokenizer_(owned_tokenizer_.get()), n_ctx_(n_ctx) {
    if (!backend_ || !tokenizer_) throw std::invalid_argument("Session: backend and tokenizer are required");
    kv_tokens_.reserve(static_cast<size_t>(std::max(n_ctx_, 0)));
}

Session::Session(Backend& backend, const Tokenizer& tokenizer, int32_t n_ctx, PrefixCache* prefix_cache,
                 const Model* model)
    : model_(model), backend_(&backend), tokenizer_(&tokenizer), prefix_cache_(prefix_cache), n_ctx_(n_ctx) {
    kv_tokens_.reserve(static_cast<size_t>(std::max(n_ctx_, 0)));
}

void Session::reset() {
    backend_->kv_truncate(0);
    kv_tokens_.clear();
    kv_shifted_ = false;
}

void Session::erase(int32_t begin, int32_t end) {
    if (begin < 0 || end < begin || end > static_cast<int32_t>(kv_tokens_.size()))
        throw std::invalid_argument("Session::erase: range outside the cached tokens");
    if (begin == end) return;
    backend_->kv_erase(begin, end);
    kv_tokens_.erase(kv_tokens_.begin() + begin, kv_tokens_.begin() + end);
    kv_shifted_ = true;
}

void Session::restore(const KvSnapshot& snapshot, std::span<const int32_t> tokens, bool shifted) {
    if (snapshot.n_past != static_cast<int32_t>(tokens.size()) || snapshot.n_past > n_ctx_)
        throw UsageError("the KV snapshot holds " + std::to_string(snapshot.n_past) + " positions for " +
                         std::to_string(tokens.size()) + " tokens in a " + std::to_string(n_ctx_) +
                         "-token context");
    backend_->kv_load(snapshot);
    if (const int32_t held = backend_->n_past(); held != snapshot.n_past) {   // bytes that disagree with their count
        reset();   // the count is taken first: reset() empties the cache
        throw UsageError("the KV snapshot's data holds " + std::to_string(held) + " positions but " +
                         std::to_string(snapshot.n_past) + " tokens were given for it");
    }
    kv_tokens_.assign(tokens.begin(), tokens.end());
    kv_shifted_ = shifted;
}

void Session::prefill(std::span<const int32_t> tokens, const GenerateOptions& options) {
    const size_t chunk = static_cast<size_t>(std::max(options.prefill_chunk, 1));
    for (size_t i = 0; i < tokens.size(); i += chunk) {
        // Stopping between chunks leaves the KV consistent with kv_tokens_, so a cancelled
        // prefill still counts as a cached prefix next time.
        if (i > 0 && cancelled(options)) return;
        const std::span<const int32_t> part = tokens.subspan(i, std::min(chunk, tokens.size() - i));
        ForwardBatch batch;
        batch.tokens = part;
        batch.pos0 = static_cast<int32_t>(kv_tokens_.size());
        batch.wanted = LogitsWanted::last;
        backend_->forward(batch);
        kv_tokens_.insert(kv_tokens_.end(), part.begin(), part.end());
    }
}

GenerateResult Session::generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                                 const TextCallback& on_text) {
    if (prompt.empty()) throw UsageError("the prompt is empty (no tokens to start from; give some text or keep BOS)");
    if (std::string misfit = prompt_over_context(prompt.size(), n_ctx_); !misfit.empty())
        throw UsageError(std::move(misfit));

    GenerateResult r;
    r.prompt_tokens.assign(prompt.begin(), prompt.end());

    const auto t_prefill = Clock::now();
    const size_t common = reuse_prefix(prompt, r);
    prefill(prompt.subspan(common), options);
    r.n_prefilled = static_cast<int32_t>(kv_tokens_.size() - common);
    // The drafter reads the prompt too (a draft model prefills it): part of the prefill's time.
    if (options.drafter && kv_tokens_.size() == prompt.size()) options.drafter->begin(prompt);
    r.prefill_ms = ms_since(t_prefill);
    if (kv_tokens_.size() != prompt.size()) {   // cancelled between chunks
        r.stop_reason = StopReason::cancelled;
        return r;
    }

    const auto t_decode = Clock::now();
    const std::string_view model_path = model_ ? std::string_view(model_->file.path()) : std::string_view();
    RequestDecoder decoder(*backend_, *tokenizer_, prompt, options, on_text, model_path);
    Completion c = decoder.finish(decode(decoder, options));
    r.decode_ms = ms_since(t_decode);
    r.stop_reason = c.stop_reason;
    r.repeat_cut = c.repeat_cut;
    r.tokens = std::move(c.tokens);
    r.logprobs = std::move(c.logprobs);
    r.text = std::move(c.text);
    r.n_drafted = decoder.n_drafted();
    r.n_accepted = decoder.n_accepted();
    if (prefix_cache_ && !kv_shifted_) store_prompt_blocks(*prefix_cache_, *backend_, prompt, kv_tokens_, 0);
    return r;
}

StopReason Session::decode(RequestDecoder& decoder, const GenerateOptions& options) {
    forwarded(decoder, 1);       // the prefill's last row
    std::vector<int32_t> step;   // the last decode forward: the newest token, then its drafts
    for (;;) {
        const std::span<const int32_t> drafts =
            step.empty() ? std::span<const int32_t>() : std::span<const int32_t>(step).subspan(1);
        const AcceptedDrafts accepted = decoder.accept(drafts, row_argmax_);
        forget_last(drafts.size() - static_cast<size_t>(accepted.accepted));
        if (accepted.stop) return *accepted.stop;
        if (!make_room(options)) return StopReason::context;
        // Drafts fit in the cache behind the newest token.
        decoder.next_step(static_cast<int64_t>(n_ctx_) - static_cast<int64_t>(kv_tokens_.size()) - 1, draft_cost_,
                          step);
        forward_step(step, options);
        forwarded(decoder, step.size());
    }
}

void Session::forwarded(RequestDecoder& decoder, size_t rows) {
    check_mapped_files();
    decoder.check_rows(0, rows, static_cast<int32_t>(kv_tokens_.size() - rows));
    if (!decoder.wants_argmax()) return;
    row_argmax_.resize(rows);
    backend_->argmax(row_argmax_);
}

size_t Session::reuse_prefix(std::span<const int32_t> prompt, GenerateResult& r) {
    // Never beyond what the backend holds: a batching engine on the same backend may have emptied it.
    size_t common = shared_prefix(kv_tokens_, prompt,
                                  std::min(prompt.size() - 1, static_cast<size_t>(std::max(backend_->n_past(), 0))));
    if (common != kv_tokens_.size() || backend_->n_past() != static_cast<int32_t>(common)) {
        backend_->kv_truncate(static_cast<int32_t>(common));
        kv_tokens_.resize(common);
    }
    // The on-disk cache may hold more of the prompt (another run's): restore it, block by block.
    if (prefix_cache_ && !kv_shifted_) {
        const PrefixCache::Restored disk = prefix_cache_->restore(
            *backend_, prompt, static_cast<int32_t>(common), static_cast<int32_t>(prompt.size()) - 1);
        common = static_cast<size_t>(disk.n_held);
        kv_tokens_.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(common));
        r.n_from_disk = disk.n_disk;
    }
    r.n_reused = static_cast<int32_t>(common);
    return common;
}

void Session::forget_last(size_t n) {
    if (n == 0) return;
    kv_tokens_.resize(kv_tokens_.size() - n);
    backend_->kv_truncate(static_cast<int32_t>(kv_tokens_.size()));
}

bool Session::make_room(const GenerateOptions& options) {
    // The new token goes to position kv_tokens_.size() (a context shift may have moved it down).
    if (static_cast<int64_t>(kv_tokens_.size()) < n_ctx_) return true;
    if (options.on_context_full) options.on_context_full(*this);
    return static_cast<int64_t>(kv_tokens_.size()) < n_ctx_;
}

void Session::forward_step(std::span<const int32_t> step, const GenerateOptions& options) {
    ForwardBatch batch;
    batch.tokens = step;
    batch.pos0 = static_cast<int32_t>(kv_tokens_.size());
    batch.wanted = step.size() > 1 ? LogitsWanted::all : LogitsWanted::last;
    const auto t_forward = Clock::now();
    backend_->forward(batch);
    if (options.drafter) draft_cost_.record(static_cast<int32_t>(step.size()), ms_since(t_forward));
    kv_tokens_.insert(kv_tokens_.end(), step.begin(), step.end());
}

} // namespace tern
