#include "engine/chat/reply_channels.h"

namespace tern {

namespace {

// The longest marker the format has ("<|constrain|>"), with room: a "<|" further than this from its "|>" is text.
constexpr size_t kMaxMarker = 24;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

} // namespace

bool ReplyChannels::emit(std::string_view text) {
    if (text.empty()) return listening_;
    (part_ == ReplyPart::answer ? answer_ : reasoning_).append(text);
    if (listening_ && on_part_ && !on_part_(part_, text)) listening_ = false;
    return listening_;
}

bool ReplyChannels::push(std::string_view text) {
    pending_.append(text);
    return drain(false);
}

bool ReplyChannels::finish() { return drain(true); }

bool ReplyChannels::drain(bool at_end) {
    size_t done = 0;   // pending_[0, done) is consumed
    // Text outside a marker, in the current state.
    auto take_text = [&](size_t end) {
        const std::string_view t = std::string_view(pending_).substr(done, end - done);
        done = end;
        switch (state_) {
        case State::body: emit(t); break;
        case State::channel_name:
            for (size_t i = 0; i < t.size(); ++i) {
                if (is_space(t[i])) {
                    if (!channel_.empty()) {
                        state_ = State::channel_rest;
                        break;
                    }
                } else {
                    channel_ += t[i];
                }
            }
            break;
        case State::header:
        case State::channel_rest: break;
        }
    };
    while (done < pending_.size()) {
        const size_t open = pending_.find("<|", done);
        if (open == std::string::npos) {
            // A trailing '<' may be the first half of "<|".
            const size_t end = !at_end && pending_.back() == '<' ? pending_.size() - 1 : pending_.size();
            take_text(end);
            break;
        }
        take_text(open);
        const size_t close = pending_.find("|>", open + 2);
        if (close == std::string::npos || close + 2 - open > kMaxMarker) {
            if (close == std::string::npos && !at_end && pending_.size() - open < kMaxMarker) break;   // wait
            take_text(open + 2);   // not a marker: "<|" is text
            continue;
        }
        const std::string_view marker = std::string_view(pending_).substr(open, close + 2 - open);
        if (marker == "<|channel|>") {
            state_ = State::channel_name;
            channel_.clear();
        } else if (marker == "<|message|>") {
            part_ = channel_.empty() || channel_ == "final" ? ReplyPart::answer : ReplyPart::reasoning;
            state_ = State::body;
        } else if (marker == "<|constrain|>") {
            if (state_ == State::channel_name) state_ = State::channel_rest;
        } else if (marker == "<|start|>" || marker == "<|end|>" || marker == "<|return|>" || marker == "<|call|>") {
            state_ = State::header;
            channel_.clear();
        } else {   // another control token's text: part of whatever it appears in
            take_text(close + 2);
            continue;
        }
        done = close + 2;
    }
    pending_.erase(0, done);
    if (at_end) pending_.clear();
    return listening_;
}

SplitReply split_reply_channels(std::string_view text) {
    ReplyChannels channels;
    channels.push(text);
    channels.finish();
    return {channels.reasoning(), channels.answer()};
}

} // namespace tern
