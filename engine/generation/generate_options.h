#pragma once
// What one Session::generate() call is asked to do, and what it reports back.
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generation/repeat_guard.h"
#include "engine/generation/sampler.h"
#include "engine/generation/token_logprobs.h"

namespace tern {

class Drafter;   // speculative decoding (engine/speculative/drafter.h); see GenerateOptions::drafter
class Session;   // GenerateOptions::on_context_full

enum class StopReason {
    eos,          // the model produced an end-of-generation token (EOS, EOT, <end_of_turn>, ...)
    length,       // n_predict tokens were generated
    stop,         // a --stop string appeared (it is trimmed from the text)
    context,      // the KV cache is full
    repetition,   // the repetition guard cut a looping tail (GenerateResult::repeat_cut)
    cancelled,    // the cancel flag was raised (Ctrl-C) or the text callback asked to stop
};
// "eos", "length", "stop", "context", "repetition", "cancelled": the names of CLI.md's --json.
std::string_view stop_reason_name(StopReason r);

struct GenerateOptions {
    int32_t n_predict = 256;   // -1: until an end-of-generation token or the end of the context
    SamplingParams sampling;
    std::vector<std::string> stop;   // stop strings; empty ones are ignored
    // Checked before every decode step and between prefill chunks; set from a signal handler.
    const std::atomic<bool>* cancel = nullptr;
    int32_t prefill_chunk = 512;   // prompt tokens per forward: bounds the activation memory
    // Speculative decoding: a drafter proposes tokens that one forward of 1+K tokens verifies
    // (DESIGN.md). Null: plain decoding. Greedy or sampled, the output is the same either way (a
    // draft is kept only where the sampler, with the same RNG draws, picked that very token).
    Drafter* drafter = nullptr;
    // The KV cache is full and the next token needs a position: the hook may free some with
    // Session::erase (a context shift: engine/generation/context_shift.h, `tern chat`'s oldest turns) and
    // generation goes on where it did. Null, or nothing freed: stop with StopReason::context.
    std::function<void(Session&)> on_context_full;
    // Stop and trim a looping tail (engine/generation/repeat_guard.h). Off here, so engine-level comparisons
    // with llama.cpp see the model's raw output; the CLI turns it on.
    RepeatGuardParams repeat_guard;
    // >= 0: report the log-probability of every generated token and those of its step's `logprobs` most likely
    // tokens (GenerateResult::logprobs; engine/generation/token_logprobs.h). Reads each step's whole logit row.
    // -1: off.
    int32_t logprobs = -1;
    // Control tokens appear in the text as their own strings ("<|channel|>"): a reply whose control tokens carry
    // meaning, gpt-oss's harmony channels, is split into reasoning and answer from it (engine/chat/reply_channels.h).
    bool special_text = false;
};

struct GenerateResult {
    std::vector<int32_t> prompt_tokens;
    std::vector<int32_t> tokens;   // generated ids, the end-of-generation token excluded
    std::string text;              // the completion as streamed: stop string trimmed
    StopReason stop_reason = StopReason::length;
    int32_t n_reused = 0;          // prompt tokens whose KV was kept from earlier calls (prefix cache)
    int32_t n_from_disk = 0;       // of the reused ones, read from the on-disk prefix cache
    int32_t n_prefilled = 0;       // prompt tokens run through the model in this call
    double prefill_ms = 0.0;
    double decode_ms = 0.0;        // from the first sample to the end, sampling included
    int32_t n_drafted = 0;         // speculative decoding: tokens drafted and verified
    int32_t n_accepted = 0;        // drafted tokens that were kept
    RepeatCut repeat_cut;          // stop_reason repetition: what the guard cut (tokens/text hold one occurrence)
    std::vector<TokenLogprobs> logprobs;   // GenerateOptions::logprobs >= 0: one per entry of `tokens`

    int32_t n_prompt() const { return static_cast<int32_t>(prompt_tokens.size()); }
    int32_t n_gen() const { return static_cast<int32_t>(tokens.size()); }
    double prefill_tps() const { return prefill_ms > 0 ? n_prefilled * 1000.0 / prefill_ms : 0.0; }
    double decode_tps() const { return decode_ms > 0 ? n_gen() * 1000.0 / decode_ms : 0.0; }
};

} // namespace tern
