#include "engine/generation/session.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <stdexcept>
#include <utility>

#include "engine/speculative/drafter.h"
#include "engine/generation/repeat_guard.h"
#include "engine/generation/stop_filter.h"
#include "base/error.h"

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

// The text that streaming `tokens` through a fresh decoder and stop-string filter gives, flushed:
// the completion's text after the repetition guard cut its tail.
std::string stream_text(const Tokenizer& tokenizer, std::span<const int32_t> tokens,
                        const std::vector<std::string>& stops) {
    StreamDecoder decoder(tokenizer);
    StopStringFilter filter(stops);
    std::string text;
    for (int32_t t : tokens) text += filter.push(decoder.push(t));
    text += filter.push(decoder.flush());
    text += filter.flush();
    return text;
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
    if (backend_->n_past() != snapshot.n_past) {   // bytes that disagree with their own count
        reset();
        throw UsageError("the KV snapshot's data holds " + std::to_string(backend_->n_past()) +
                         " positions, not the " + std::to_string(snapshot.n_past) + " it claims");
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
        throw UsageError("--ctx-size: the prompt has " + std::to_string(prompt.size()) +
                         " tokens but the context is " + std::to_string(n_ctx_) + " (raise -c)");

    GenerateResult r;
    r.prompt_tokens.assign(prompt.begin(), prompt.end());

    // --- prefix reuse: keep the KV of the longest common prefix. At least the last prompt
    // token is run again, because its logits choose the first generated token.
    const auto t_prefill = Clock::now();
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

    prefill(prompt.subspan(common), options);
    r.n_prefilled = static_cast<int32_t>(kv_tokens_.size() - common);
    // The drafter reads the prompt too (a draft model prefills it): part of the prefill's time.
    if (options.drafter && kv_tokens_.size() == prompt.size()) options.drafter->begin(prompt);
    r.prefill_ms = ms_since(t_prefill);
    if (kv_tokens_.size() != prompt.size()) {   // cancelled between chunks
        r.stop_reason = StopReason::cancelled;
        return r;
    }

    // --- decode: sample -> stop checks -> stream -> forward the token. With a drafter the forward
    // also carries the drafted tokens; the following rows of its logits then give the tokens
    // after each draft, and a draft is kept while it is exactly the token sampled there.
    const auto t_decode = Clock::now();
    Sampler sampler(options.sampling);
    // Greedy without penalties needs no logits on the host: the backend's argmax can stay on
    // the device.
    const bool device_argmax = sampler.greedy() && penalties_off(options.sampling);
    std::vector<int32_t> history(prompt.begin(), prompt.end());   // what the penalties look at
    StreamDecoder decoder(*tokenizer_);
    StopStringFilter filter(options.stop);
    // The repetition guard: r.text grows with every token, but the text of tokens that a cut could
    // still remove is held back from on_text until the repetition breaks (never shown if cut).
    RepeatGuard guard(options.repeat_guard, prompt);
    HeldText held;
    size_t shown = 0;   // bytes of r.text passed to on_text
    bool output_open = true;
    auto show = [&](size_t upto) {
        if (upto <= shown || !output_open) return output_open;
        const std::string_view piece = std::string_view(r.text).substr(shown, upto - shown);
        shown = upto;
        if (on_text && !on_text(piece)) output_open = false;
        return output_open;
    };
    // Appends one generated token (not an end-of-generation one) and streams it; false once a
    // stop rule fired, with r.stop_reason set.
    auto commit = [&](int32_t token) {
        r.tokens.push_back(token);
        history.push_back(token);
        r.text += filter.push(decoder.push(token));
        const std::optional<RepeatCut> loop = guard.push(r.tokens);
        held.token_streamed(r.text.size());
        if (!show(held.showable(guard.at_risk(), r.text.size()))) {
            r.stop_reason = StopReason::cancelled;
            return false;
        }
        if (filter.matched()) {
            r.stop_reason = StopReason::stop;
            return false;
        }
        if (loop) {   // keep one occurrence: the text is that of the kept tokens, as if they ended here
            r.tokens.resize(r.tokens.size() - static_cast<size_t>(loop->cut));
            r.text = stream_text(*tokenizer_, r.tokens, options.stop);
            r.repeat_cut = *loop;
            r.stop_reason = StopReason::repetition;
            return false;
        }
        if (options.n_predict >= 0 && r.n_gen() >= options.n_predict) {
            r.stop_reason = StopReason::length;
            return false;
        }
        return true;   // a full cache is checked where the token would be forwarded
    };

    Drafter* drafter = options.drafter;
    std::vector<int32_t> step;         // the last forward's tokens: one generated token, then drafts
    std::vector<int32_t> row_argmax;   // device_argmax: the argmax of each of its logit rows
    std::vector<int32_t> drafts;
    if (device_argmax) {
        row_argmax.resize(1);
        backend_->argmax(row_argmax);
    }
    bool done = false;
    while (!done) {
        // Tokens from the rows of the last forward: row i follows step[0..i]. Each sampled token
        // is committed exactly as plain decoding would (same RNG draws, same stop checks); it
        // confirms draft step[i+1] when equal, and the first one that does not is the next
        // step[0]. So the output does not depend on the drafts, only the number of forwards.
        const size_t n_drafts = step.empty() ? 0 : step.size() - 1;
        size_t accepted = 0;
        for (;;) {
            if (cancelled(options)) {
                r.stop_reason = StopReason::cancelled;
                done = true;
                break;
            }
            if (options.n_predict >= 0 && r.n_gen() >= options.n_predict) {
                r.stop_reason = StopReason::length;
                done = true;
                break;
            }
            const size_t row = accepted;
            const int32_t token =
                device_argmax ? row_argmax[row] : sampler.sample(backend_->logits(static_cast<int>(row)), history);
            if (tokenizer_->is_eog(token)) {
                r.stop_reason = StopReason::eos;
                done = true;
                break;
            }
            const bool confirms = accepted < n_drafts && token == step[accepted + 1];
            const bool more = commit(token);
            if (confirms) ++accepted;   // its K/V, written by the last forward, are right: keep them
            if (!more) {
                done = true;
                break;
            }
            if (!confirms) break;   // a new token, not in the cache yet
        }
        // Forget the K/V of the rejected drafts.
        if (accepted < n_drafts) {
            kv_tokens_.resize(kv_tokens_.size() - (n_drafts - accepted));
            backend_->kv_truncate(static_cast<int32_t>(kv_tokens_.size()));
        }
        if (drafter && n_drafts > 0) {
            r.n_drafted += static_cast<int32_t>(n_drafts);
            r.n_accepted += static_cast<int32_t>(accepted);
            drafter->observe(static_cast<int32_t>(n_drafts), static_cast<int32_t>(accepted));
        }
        if (done) break;

        // The new token goes to position kv_tokens_.size() (a context shift may have moved it
        // down): a full cache stops here unless the hook frees positions.
        if (static_cast<int64_t>(kv_tokens_.size()) >= n_ctx_) {
            if (options.on_context_full) options.on_context_full(*this);
            if (static_cast<int64_t>(kv_tokens_.size()) >= n_ctx_) {
                r.stop_reason = StopReason::context;
                break;
            }
        }

        // Forward the new token and what the drafter guesses follows it. At most as many drafts as
        // could still be generated after it (-n) and as fit in the cache behind it.
        step.assign(1, r.tokens.back());
        if (drafter) {
            int64_t room = static_cast<int64_t>(n_ctx_) - static_cast<int64_t>(kv_tokens_.size()) - 1;
            if (options.n_predict >= 0) room = std::min<int64_t>(room, options.n_predict - r.n_gen() - 1);
            if (room > 0) {
                drafter->propose(history, static_cast<int32_t>(std::min<int64_t>(room, INT32_MAX)), draft_cost_,
                                 drafts);
                if (static_cast<int64_t>(drafts.size()) > room) drafts.resize(static_cast<size_t>(room));
                step.insert(step.end(), drafts.begin(), drafts.end());
            }
        }
        ForwardBatch batch;
        batch.tokens = step;
        batch.pos0 = static_cast<int32_t>(kv_tokens_.size());
        batch.wanted = step.size() > 1 ? LogitsWanted::all : LogitsWanted::last;
        const auto t_forward = Clock::now();
        backend_->forward(batch);
        if (drafter) draft_cost_.record(static_cast<int32_t>(step.size()), ms_since(t_forward));
        kv_tokens_.insert(kv_tokens_.end(), step.begin(), step.end());
        if (device_argmax) {
            row_argmax.resize(step.size());
            backend_->argmax(row_argmax);
        }
    }

    // Stopped by the user (Ctrl-C) while the guard still held back the text of the last tokens:
    // the reply ends where the user saw it stop. Those tokens are dropped (their K/V are simply
    // not reused by the next prompt), so no text appears after the terminal's "^C".
    bool rederived = false;
    if (r.stop_reason == StopReason::cancelled && output_open && guard.at_risk() > 0) {
        r.tokens.resize(r.tokens.size() - std::min(r.tokens.size(), static_cast<size_t>(guard.at_risk())));
        r.text = stream_text(*tokenizer_, r.tokens, options.stop);
        rederived = true;
    }
    // Release what the decoder and the filter still hold (a trailing partial character becomes
    // U+FFFD), unless a stop string already ended the text, a cut or a cancel already re-derived
    // it, or nobody is listening; then show what the guard held back.
    if (output_open && !filter.matched() && r.stop_reason != StopReason::repetition && !rederived) {
        r.text += filter.push(decoder.flush());
        if (filter.matched()) {
            r.stop_reason = StopReason::stop;
        } else {
            r.text += filter.flush();
        }
    }
    show(r.text.size());
    r.decode_ms = ms_since(t_decode);
    store_prefix(prompt);
    return r;
}

void Session::store_prefix(std::span<const int32_t> prompt) {
    if (!prefix_cache_ || kv_shifted_) return;
    size_t n_valid = 0;   // leading prompt positions the cache holds
    const size_t limit = std::min(prompt.size(), kv_tokens_.size());
    while (n_valid < limit && kv_tokens_[n_valid] == prompt[n_valid]) ++n_valid;
    prefix_cache_->store(*backend_, prompt, static_cast<int32_t>(n_valid));
}

} // namespace tern
