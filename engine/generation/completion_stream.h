#pragma once
// The completion as it grows, one generated token at a time: token -> text (incremental
// detokenization, a UTF-8 character split across tokens held until complete), stop strings
// (stop_filter.h), the repetition guard (repeat_guard.h) and the text it holds back, and the
// callback that shows the text. Session::generate samples tokens and pushes them here; what to do
// next is the verdict of push(), and finish() ends the text.
//
// The stream keeps each generated token and each byte of text once: the result's tokens and text
// are taken from it. Text reaches the callback only once it is final: never part of a stop string,
// never a split character, never the tail of a loop the guard could still cut.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/generation/generate_options.h"
#include "engine/generation/repeat_guard.h"
#include "engine/generation/stop_filter.h"
#include "engine/text/tokenizer.h"

namespace tern {

// Receives each piece of completion text once it is final. Returning false stops generation
// (stop_reason cancelled): a closed stdout, for instance.
using TextCallback = std::function<bool(std::string_view)>;

// What one token did to the completion: empty, generation goes on; else the rule that ended it.
using Verdict = std::optional<StopReason>;

class CompletionStream {
public:
    // `prompt`: what the completion continues (the guard does not cut loops copied from it, and
    // history() starts with it). `on_text` may be empty: nobody is listening.
    // `special_text`: control tokens appear in the text as their own strings (GenerateOptions::special_text).
    CompletionStream(const Tokenizer& tokenizer, std::span<const int32_t> prompt, std::vector<std::string> stops,
                     const RepeatGuardParams& guard, TextCallback on_text = {}, bool special_text = false);

    // Appends one generated token (not an end-of-generation one) and shows what became final.
    // Stops with: cancelled (the callback returned false), stop (a stop string appeared: the text
    // ends before it), repetition (the guard cut a loop: tokens and text keep one occurrence,
    // repeat_cut() says what was cut).
    Verdict push(int32_t token);

    // Generation ended for `reason` (push()'s verdict, or the caller's own: eos, length, context,
    // cancelled). Releases what the decoder and the stop filter still hold (a trailing partial
    // character becomes U+FFFD) and shows the rest of the text. A Ctrl-C (`cancelled` while the
    // callback still listens) instead drops the tokens whose text the guard was holding back: the
    // reply ends where the user saw it stop. Returns the final reason: stop when the released text
    // completed a stop string.
    StopReason finish(StopReason reason);

    // The prompt, then the generated tokens: what the sampler's penalties and a drafter read.
    std::span<const int32_t> history() const { return tokens_; }
    std::span<const int32_t> generated() const { return history().subspan(n_prompt_); }
    int32_t n_generated() const { return static_cast<int32_t>(tokens_.size() - n_prompt_); }
    // The text of the generated tokens so far, stop string trimmed (held-back text not included).
    const std::string& text() const { return text_; }
    // Bytes of text() passed to the callback.
    size_t shown() const { return shown_; }
    // After a repetition verdict: what the guard cut.
    const RepeatCut& repeat_cut() const { return repeat_cut_; }

    // The result, moved out (the stream is spent afterwards).
    std::vector<int32_t> take_generated();
    std::string take_text() { return std::move(text_); }

private:
    // Passes text_[shown_, upto) to the callback; false once the callback refused text.
    bool show(size_t upto);
    // Keeps the first `n` generated tokens; the text becomes theirs as if generation ended there.
    void keep_generated(size_t n);

    const Tokenizer& tokenizer_;
    bool special_text_;
    size_t n_prompt_;
    std::vector<int32_t> tokens_;   // prompt + generated
    StreamDecoder decoder_;
    StopStringFilter filter_;
    RepeatGuard guard_;
    HeldText held_;
    RepeatCut repeat_cut_;
    TextCallback on_text_;
    std::string text_;
    size_t shown_ = 0;
    bool listening_ = true;      // the callback has not refused text
    bool text_final_ = false;    // text_ was re-derived from kept tokens: nothing more to release
};

} // namespace tern
