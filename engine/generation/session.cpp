#include "engine/generation/session.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <utility>

#include "base/error.h"
#include "engine/generation/accept_drafts.h"
#include "engine/generation/sampler.h"
#include "engine/generation/token_logprobs.h"
#include "engine/logit_guard.h"
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

bool penalties_off(const SamplingParams& p) {
    return p.repeat_last_n == 0 ||
           (p.repeat_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f);
}

bool length_reached(const GenerateOptions& o, const CompletionStream& stream) {
    return o.n_predict >= 0 && stream.n_generated() >= o.n_predict;
}

// The target's token for each logit row of the last forward: the backend's argmax when sampling is
// greedy without penalties; the row's best candidates after the penalties (Backend::top_logits, a few
// hundred bytes from a GPU) when the chain depends on no more of them (Sampler::candidates_needed); else
// the sampler over the whole row.
class TargetTokens {
public:
    // `model`: the file named when a row is not finite.
    TargetTokens(Backend& backend, const SamplingParams& params, std::string_view model)
        : backend_(backend), sampler_(params), device_argmax_(sampler_.greedy() && penalties_off(params)),
          top_(static_cast<size_t>(device_argmax_ ? 0 : sampler_.candidates_needed())), model_(model) {}

    // A forward left `rows` rows of logits, the first for the token at KV position `first_pos`. Before any
    // is sampled, the model files must be unchanged since they were opened (check_mapped_files) and every
    // row finite (check_logit_row: a draft's row that is not means damage as much as the newest token's).
    void forwarded(size_t rows, int32_t first_pos) {
        check_mapped_files();
        for (size_t r = 0; r < rows; ++r)
            check_logit_row(backend_, static_cast<int>(r), first_pos + static_cast<int32_t>(r), model_);
        if (!device_argmax_) return;
        row_argmax_.resize(rows);
        backend_.argmax(row_argmax_);
    }
    // `history`: what the penalties look at.
    int32_t at(size_t row, std::span<const int32_t> history) {
        if (device_argmax_) return row_argmax_[row];
        if (top_.empty()) return sampler_.sample(backend_.logits(static_cast<int>(row)), history);
        const size_t n = backend_.top_logits(static_cast<int>(row), penalties_of(history, sampler_.params()), top_);
        return sampler_.sample_top(std::span<const LogitCandidate>(top_).first(n));
    }

    // The log-probabilities of `token`, chosen from row `row`, and of the row's top_n most likely tokens.
    TokenLogprobs logprobs(size_t row, int32_t token, size_t top_n) {
        return token_logprobs(backend_.logits(static_cast<int>(row)), token, top_n);
    }

private:
    Backend& backend_;
    Sampler sampler_;
    bool device_argmax_;
    std::vector<int32_t> row_argmax_;   // device_argmax_: the argmax of each row
    std::vector<LogitCandidate> top_;   // the candidates the sampler needs; empty: it needs the row
    std::string_view model_;
};

// One token from logit row `row`, through every stop rule in the order plain decoding applies them. `logprobs`:
// where its log-probabilities go when the options ask for them.
ProducedToken next_token(size_t row, TargetTokens& target, CompletionStream& stream, const Tokenizer& tokenizer,
                         const GenerateOptions& options, std::vector<TokenLogprobs>& logprobs) {
    if (cancelled(options)) return {std::nullopt, StopReason::cancelled};
    if (length_reached(options, stream)) return {std::nullopt, StopReason::length};
    const int32_t token = target.at(row, stream.history());
    if (tokenizer.is_eog(token)) return {std::nullopt, StopReason::eos};
    if (options.logprobs >= 0) logprobs.push_back(target.logprobs(row, token, static_cast<size_t>(options.logprobs)));
    Verdict verdict = stream.push(token);
    if (!verdict && length_reached(options, stream)) verdict = StopReason::length;
    return {token, verdict};   // a full cache is checked where the token would be forwarded
}

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
    : model_(std::move(model)), backend_(std::move(backend)), tokenizer_(std::move(tokenizer)), n_ctx_(n_ctx) {
    if (!backend_ || !tokenizer_) throw std::invalid_argument("Session: backend and tokenizer are required");
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
    if (static_cast<int64_t>(prompt.size()) > n_ctx_)
        throw UsageError("the prompt has " + std::to_string(prompt.size()) + " tokens but the context is " +
                         std::to_string(n_ctx_));

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
    CompletionStream stream(*tokenizer_, prompt, options.stop, options.repeat_guard, on_text, options.special_text);
    r.stop_reason = stream.finish(decode(stream, options, r));
    r.decode_ms = ms_since(t_decode);
    r.repeat_cut = stream.repeat_cut();
    r.tokens = stream.take_generated();
    // The repetition guard keeps one occurrence of a looping tail: the log-probabilities follow the tokens kept.
    if (r.logprobs.size() > r.tokens.size()) r.logprobs.resize(r.tokens.size());
    r.text = stream.take_text();
    store_prefix(prompt);
    return r;
}

StopReason Session::decode(CompletionStream& stream, const GenerateOptions& options, GenerateResult& r) {
    const std::string_view model_path = model_ ? std::string_view(model_->file.path()) : std::string_view();
    TargetTokens target(*backend_, options.sampling, model_path);
    target.forwarded(1, static_cast<int32_t>(kv_tokens_.size()) - 1);   // the prefill's last row
    std::vector<int32_t> step;   // the last decode forward: the newest token, then its drafts
    for (;;) {
        const std::span<const int32_t> drafts =
            step.empty() ? std::span<const int32_t>() : std::span<const int32_t>(step).subspan(1);
        const AcceptedDrafts accepted = accept_drafts(
            drafts, [&](size_t row) { return next_token(row, target, stream, *tokenizer_, options, r.logprobs); });
        forget_last(drafts.size() - static_cast<size_t>(accepted.accepted));
        if (!drafts.empty()) {
            r.n_drafted += static_cast<int32_t>(drafts.size());
            r.n_accepted += accepted.accepted;
            options.drafter->observe(static_cast<int32_t>(drafts.size()), accepted.accepted);
        }
        if (accepted.stop) return *accepted.stop;
        if (!make_room(options)) return StopReason::context;
        next_step(stream, options, step);
        forward_step(step, options);
        target.forwarded(step.size(), static_cast<int32_t>(kv_tokens_.size() - step.size()));
    }
}

size_t Session::reuse_prefix(std::span<const int32_t> prompt, GenerateResult& r) {
    size_t common = 0;
    const size_t limit = std::min(kv_tokens_.size(), prompt.size() - 1);
    while (common < limit && kv_tokens_[common] == prompt[common]) ++common;
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

void Session::next_step(const CompletionStream& stream, const GenerateOptions& options, std::vector<int32_t>& step) {
    step.assign(1, stream.generated().back());
    Drafter* drafter = options.drafter;
    if (!drafter) return;
    // At most as many drafts as could still be generated after the token (n_predict) and as fit in the
    // cache behind it.
    int64_t room = static_cast<int64_t>(n_ctx_) - static_cast<int64_t>(kv_tokens_.size()) - 1;
    if (options.n_predict >= 0) room = std::min<int64_t>(room, options.n_predict - stream.n_generated() - 1);
    if (room <= 0) return;
    drafter->propose(stream.history(), static_cast<int32_t>(std::min<int64_t>(room, INT32_MAX)), draft_cost_, drafts_);
    if (static_cast<int64_t>(drafts_.size()) > room) drafts_.resize(static_cast<size_t>(room));
    step.insert(step.end(), drafts_.begin(), drafts_.end());
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

void Session::store_prefix(std::span<const int32_t> prompt) {
    if (!prefix_cache_ || kv_shifted_) return;
    size_t n_valid = 0;   // leading prompt positions the cache holds
    const size_t limit = std::min(prompt.size(), kv_tokens_.size());
    while (n_valid < limit && kv_tokens_[n_valid] == prompt[n_valid]) ++n_valid;
    prefix_cache_->store(*backend_, prompt, static_cast<int32_t>(n_valid));
}

} // namespace tern
