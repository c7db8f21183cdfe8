#include "engine/generation/request_decoder.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "engine/generation/token_logprobs.h"
#include "engine/logit_guard.h"
#include "engine/prefix_cache/prefix_cache.h"

namespace tern {

namespace {

bool penalties_off(const SamplingParams& p) {
    return p.repeat_last_n == 0 ||
           (p.repeat_penalty == 1.0f && p.frequency_penalty == 0.0f && p.presence_penalty == 0.0f);
}

} // namespace

bool start_empty_prompt(std::vector<int32_t>& tokens, const Tokenizer& tokenizer, bool bos_allowed) {
    if (!tokens.empty()) return true;
    // Only a vocabulary without BOS (or a prompt refused one) gets here: encoding adds it otherwise.
    const int32_t bos = tokenizer.bos();
    if (bos < 0 || !bos_allowed) return false;
    tokens.push_back(bos);
    return true;
}

std::string_view empty_prompt_refusal() {
    return "the prompt is empty and the model has no BOS token to start from";
}

std::string prompt_over_context(size_t n_tokens, int32_t n_ctx) {
    if (static_cast<int64_t>(n_tokens) <= n_ctx) return {};
    return "the prompt has " + std::to_string(n_tokens) + " tokens but the context is " + std::to_string(n_ctx);
}

size_t shared_prefix(std::span<const int32_t> held, std::span<const int32_t> prompt, size_t limit) {
    size_t n = 0;
    limit = std::min({limit, held.size(), prompt.size()});
    while (n < limit && held[n] == prompt[n])
        ++n;
    return n;
}

void store_prompt_blocks(PrefixCache& cache, const Backend& backend, std::span<const int32_t> prompt,
                         std::span<const int32_t> held, int32_t seq) {
    const size_t n_valid = shared_prefix(held, prompt, prompt.size()); // leading prompt positions the cache holds
    cache.store(backend, prompt, static_cast<int32_t>(n_valid), seq);
}

// ---------------------------------------------------------------------------------------------

RequestDecoder::RequestDecoder(Backend& backend, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                               const GenerateOptions& options, TextCallback on_text, std::string_view model)
    : backend_(backend), tokenizer_(tokenizer), options_(options), model_(model), sampler_(options.sampling),
      // Greedy without penalties: the backend's argmax. Else the row's best candidates after the penalties
      // (Backend::top_logits, a few hundred bytes from a GPU) when the chain depends on no more of them
      // (Sampler::candidates_needed); else the sampler over the whole row.
      device_argmax_(sampler_.greedy() && penalties_off(options.sampling)),
      top_(static_cast<size_t>(device_argmax_ ? 0 : sampler_.candidates_needed())),
      stream_(tokenizer, prompt, options.stop, options.repeat_guard, std::move(on_text), options.special_text) {}

void RequestDecoder::check_rows(int first_row, size_t rows, int32_t first_pos) {
    for (size_t r = 0; r < rows; ++r)
        check_logit_row(backend_, first_row + static_cast<int>(r), first_pos + static_cast<int32_t>(r), model_);
}

ProducedToken RequestDecoder::next(int row, int32_t argmax) {
    const auto length_reached = [&] { return options_.n_predict >= 0 && stream_.n_generated() >= options_.n_predict; };
    if (options_.cancel && options_.cancel->load(std::memory_order_relaxed))
        return {std::nullopt, StopReason::cancelled};
    if (length_reached()) return {std::nullopt, StopReason::length};
    int32_t token = argmax;
    if (!device_argmax_) {
        if (top_.empty()) {
            token = sampler_.sample(backend_.logits(row), stream_.history());
        } else {
            const size_t n = backend_.top_logits(row, penalties_of(stream_.history(), sampler_.params()), top_);
            token = sampler_.sample_top(std::span<const LogitCandidate>(top_).first(n));
        }
    }
    if (tokenizer_.is_eog(token)) return {std::nullopt, StopReason::eos};
    if (options_.logprobs >= 0)
        logprobs_.push_back(token_logprobs(backend_.logits(row), token, static_cast<size_t>(options_.logprobs)));
    Verdict verdict = stream_.push(token);
    if (!verdict && length_reached()) verdict = StopReason::length;
    return {token, verdict};
}

void RequestDecoder::next_step(int64_t cache_room, const DraftCost& cost, std::vector<int32_t>& step) {
    step.assign(1, stream_.generated().back());
    Drafter* drafter = options_.drafter;
    if (!drafter) return;
    int64_t room = cache_room;
    if (options_.n_predict >= 0) room = std::min<int64_t>(room, options_.n_predict - stream_.n_generated() - 1);
    if (room <= 0) return;
    drafter->propose(stream_.history(), static_cast<int32_t>(std::min<int64_t>(room, INT32_MAX)), cost, drafts_);
    if (static_cast<int64_t>(drafts_.size()) > room) drafts_.resize(static_cast<size_t>(room));
    step.insert(step.end(), drafts_.begin(), drafts_.end());
}

AcceptedDrafts RequestDecoder::accept(std::span<const int32_t> drafts, std::span<const int32_t> row_argmax) {
    const AcceptedDrafts accepted = accept_drafts(
        drafts, [&](size_t row) { return next(static_cast<int>(row), device_argmax_ ? row_argmax[row] : -1); });
    if (!drafts.empty()) {
        n_drafted_ += static_cast<int32_t>(drafts.size());
        n_accepted_ += accepted.accepted;
        options_.drafter->observe(static_cast<int32_t>(drafts.size()), accepted.accepted);
    }
    return accepted;
}

Completion RequestDecoder::finish(StopReason reason) {
    Completion c;
    c.stop_reason = stream_.finish(reason);
    c.repeat_cut = stream_.repeat_cut();
    c.tokens = stream_.take_generated();
    c.text = stream_.take_text();
    // The repetition guard keeps one occurrence of a looping tail: the log-probabilities follow the tokens kept.
    c.logprobs = std::move(logprobs_);
    if (c.logprobs.size() > c.tokens.size()) c.logprobs.resize(c.tokens.size());
    return c;
}

} // namespace tern
