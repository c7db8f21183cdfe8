#pragma once
// RequestDecoder: one request's decoding, the single place its rules live. `tern run` and `tern chat`
// (Session::generate) and `run --batch` and `tern serve` (BatchEngine's scheduler) each run the forwards
// their own way; after each one they hand the decoder the logit rows that belong to the request, and the
// decoder picks the tokens (the backend's argmax, its top candidates after the penalties, or the sampler
// over the whole row), applies the stop rules in one order (cancel flag, n_predict, end of generation,
// stop strings, the repetition guard: completion_stream.h), keeps the log-probabilities asked for, and
// says whether generation goes on. Speculative decoding goes through it too: it asks the drafter for the
// next drafts within the request's limits, and accepts those the target's tokens confirm
// (accept_drafts.h). Also here: the empty-prompt rule (a prompt of no tokens starts from BOS) and the
// prefix reuse rule (how much of a prompt a cache's tokens serve), which both request paths share.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/generation/accept_drafts.h"
#include "engine/generation/completion_stream.h"
#include "engine/generation/generate_options.h"
#include "engine/generation/sampler.h"
#include "engine/logit_candidates.h"
#include "engine/speculative/drafter.h"
#include "engine/text/tokenizer.h"

namespace tern {

class PrefixCache;

// The empty-prompt rule, wherever a prompt becomes tokens: a prompt that encodes to no tokens starts from
// the vocabulary's BOS (when `bos_allowed`: `tern run --no-bos` forbids it). False when it stays empty
// (no BOS to start from): the caller refuses it, naming its flag or field before empty_prompt_refusal().
bool start_empty_prompt(std::vector<int32_t>& tokens, const Tokenizer& tokenizer, bool bos_allowed = true);
// "the prompt is empty and the model has no BOS token to start from".
std::string_view empty_prompt_refusal();

// The context rule of both request paths: "the prompt has N tokens but the context is M" when a prompt of
// `n_tokens` does not fit a context of `n_ctx` positions; "" when it does.
std::string prompt_over_context(size_t n_tokens, int32_t n_ctx);

// The prefix reuse rule: how many leading tokens of `prompt` the K/V of `held` (a cache's tokens, in
// position order) serve, at most `limit`.
size_t shared_prefix(std::span<const int32_t> held, std::span<const int32_t> prompt, size_t limit);
// After a prompt was prefilled into sequence `seq`, whose cache holds `held`: the prompt's blocks the on-disk
// prefix cache lacks go there (only those whose K/V the sequence holds).
void store_prompt_blocks(PrefixCache& cache, const Backend& backend, std::span<const int32_t> prompt,
                         std::span<const int32_t> held, int32_t seq);

// What a finished request produced.
struct Completion {
    StopReason stop_reason = StopReason::length;
    std::vector<int32_t> tokens;         // generated ids, the end-of-generation token excluded
    std::string text;                    // stop string trimmed
    std::vector<TokenLogprobs> logprobs; // GenerateOptions::logprobs >= 0: one per entry of `tokens`
    RepeatCut repeat_cut;                // stop_reason repetition: what the guard cut
};

class RequestDecoder {
public:
    // `options` must outlive the decoder (it reads n_predict, the cancel flag and the drafter as it goes).
    // `prompt`: what the completion continues. `model`: the file named when a row is not finite ("": none).
    RequestDecoder(Backend& backend, const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                   const GenerateOptions& options, TextCallback on_text, std::string_view model);

    // Greedy without penalties: the request's token is the backend's argmax of its row, which the caller
    // reads (Backend::argmax, one call for every row of a forward) and passes to next().
    bool wants_argmax() const { return device_argmax_; }

    // Rows [first_row, first_row + rows) of the last forward belong to this request, the first for the
    // token at KV position `first_pos`. Each must be finite (check_logit_row) before any is sampled: a
    // drafted token's row that is not means damage as much as the newest token's.
    void check_rows(int first_row, size_t rows, int32_t first_pos);

    // The next token from logit row `row` (`argmax`: the backend's argmax of it, read when wants_argmax()),
    // through every stop rule in order: the cancel flag, n_predict, an end-of-generation token, then what
    // the completion stream says (stop strings, the repetition guard, a callback that stopped listening)
    // and n_predict again. A full cache is the caller's to check, where the token would be forwarded.
    ProducedToken next(int row, int32_t argmax);

    // Speculative decoding. The next decode forward: the newest token, then what the drafter guesses
    // follows it, at most as many as could still be generated after it (n_predict) and as `cache_room`
    // (free positions behind it) holds. Without a drafter: the newest token alone.
    void next_step(int64_t cache_room, const DraftCost& cost, std::vector<int32_t>& step);
    // The tokens of the rows a forward of the newest token and `drafts` left (rows 0 .. drafts.size(),
    // `row_argmax` their argmax when wants_argmax()), accepting the drafts they confirm.
    AcceptedDrafts accept(std::span<const int32_t> drafts, std::span<const int32_t> row_argmax);
    int32_t n_drafted() const { return n_drafted_; }
    int32_t n_accepted() const { return n_accepted_; }

    // The prompt, then the generated tokens; the generated ones alone.
    const CompletionStream& stream() const { return stream_; }

    // Generation ended for `reason` (next()'s stop, or the caller's own: context, cancelled): the text is
    // released (CompletionStream::finish) and the result taken. The decoder is spent afterwards.
    Completion finish(StopReason reason);

private:
    Backend& backend_;
    const Tokenizer& tokenizer_;
    const GenerateOptions& options_;
    std::string model_;
    Sampler sampler_;
    bool device_argmax_;
    std::vector<LogitCandidate> top_; // the candidates the sampler needs; empty: it needs the whole row
    CompletionStream stream_;
    std::vector<TokenLogprobs> logprobs_;
    std::vector<int32_t> drafts_; // next_step()'s scratch: the drafter's latest proposal
    int32_t n_drafted_ = 0;
    int32_t n_accepted_ = 0;
};

} // namespace tern
