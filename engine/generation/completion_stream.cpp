#include "engine/generation/completion_stream.h"

#include <algorithm>
#include <utility>

namespace tern {

CompletionStream::CompletionStream(const Tokenizer& tokenizer, std::span<const int32_t> prompt,
                                   std::vector<std::string> stops, const RepeatGuardParams& guard, TextCallback on_text,
                                   bool special_text)
    : tokenizer_(tokenizer), special_text_(special_text), n_prompt_(prompt.size()),
      tokens_(prompt.begin(), prompt.end()), decoder_(tokenizer, special_text),
      filter_(std::move(stops)), guard_(guard, prompt), on_text_(std::move(on_text)) {}

Verdict CompletionStream::push(int32_t token) {
    tokens_.push_back(token);
    text_ += filter_.push(decoder_.push(token));
    const std::optional<RepeatCut> loop = guard_.push(generated());
    // The text of the tokens a cut could still remove waits until the repetition breaks.
    held_.token_streamed(text_.size());
    if (!show(held_.showable(guard_.at_risk(), text_.size()))) return StopReason::cancelled;
    if (filter_.matched()) return StopReason::stop;
    if (loop) {   // keep one occurrence: the text is that of the kept tokens, as if they ended here
        keep_generated(generated().size() - static_cast<size_t>(loop->cut));
        repeat_cut_ = *loop;
        return StopReason::repetition;
    }
    return std::nullopt;
}

StopReason CompletionStream::finish(StopReason reason) {
    // Stopped by the user (Ctrl-C) while the guard still held back the text of the last tokens:
    // those tokens are dropped (their K/V are simply not reused by the next prompt), so no text
    // appears after the terminal's "^C".
    if (reason == StopReason::cancelled && listening_ && guard_.at_risk() > 0)
        keep_generated(generated().size() - std::min(generated().size(), static_cast<size_t>(guard_.at_risk())));
    // Release what the decoder and the filter still hold, unless the text already ended (a stop
    // string, or re-derived after a cut) or nobody listens any more.
    if (listening_ && !filter_.matched() && !text_final_) {
        text_ += filter_.push(decoder_.flush());
        if (filter_.matched()) {
            reason = StopReason::stop;
        } else {
            text_ += filter_.flush();
        }
    }
    show(text_.size());
    return reason;
}

std::vector<int32_t> CompletionStream::take_generated() {
    tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(n_prompt_));
    n_prompt_ = 0;
    return std::move(tokens_);
}

bool CompletionStream::show(size_t upto) {
    if (upto <= shown_ || !listening_) return listening_;
    const std::string_view piece = std::string_view(text_).substr(shown_, upto - shown_);
    shown_ = upto;
    if (on_text_ && !on_text_(piece)) listening_ = false;
    return listening_;
}

void CompletionStream::keep_generated(size_t n) {
    tokens_.resize(n_prompt_ + n);
    // The text of the kept tokens through a fresh decoder and stop filter, flushed. Its start is
    // what was already shown: the same tokens gave it.
    StreamDecoder decoder(tokenizer_, special_text_);
    StopStringFilter filter(filter_.stops());
    text_.clear();
    for (int32_t t : generated()) text_ += filter.push(decoder.push(t));
    text_ += filter.push(decoder.flush());
    text_ += filter.flush();
    text_final_ = true;
}

} // namespace tern
