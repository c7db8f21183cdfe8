#pragma once
// A reply that names its channels in control tokens, as gpt-oss's harmony format does, split into its
// reasoning and its answer while it streams:
//
//   <|channel|>analysis<|message|>thinking ...<|end|><|start|>assistant<|channel|>final<|message|>answer
//
// The text comes from a CompletionStream that renders control tokens (GenerateOptions::special_text); the
// generation prompt ended with "<|start|>assistant", and the end-of-reply token (<|return|>, <|call|>) is not
// text. A message's channel is the first word after <|channel|> (a tool call adds " to=..." or <|constrain|>
// before <|message|>); the "final" channel is the answer and every other one (analysis, commentary) reasoning.
// Headers (the role after <|start|>, the channel line) are neither. Text before the first marker is answer: a
// model that ignores the format still shows what it says.
//
// Markers are whole tokens, but a stop-string filter upstream may hand a marker over in two pieces, so a piece
// that ends with what could be a marker's beginning is held until the next one decides.
#include <functional>
#include <string>
#include <string_view>

namespace tern {

enum class ReplyPart { reasoning, answer };

// Receives each piece of reasoning or answer text once; false stops the reply (as a TextCallback does).
using ReplyPartCallback = std::function<bool(ReplyPart, std::string_view)>;

class ReplyChannels {
public:
    explicit ReplyChannels(ReplyPartCallback on_part = {}) : on_part_(std::move(on_part)) {}

    // One piece of the reply's text, control tokens rendered. False once the callback refused text.
    bool push(std::string_view text);
    // The end of the reply: text held back as a possible marker is released into the open message.
    bool finish();

    const std::string& reasoning() const { return reasoning_; }
    const std::string& answer() const { return answer_; }

private:
    enum class State { body, header, channel_name, channel_rest };
    bool emit(std::string_view text);
    // Consumes pending_ up to the last place a marker could still begin.
    bool drain(bool at_end);

    ReplyPartCallback on_part_;
    State state_ = State::body;
    ReplyPart part_ = ReplyPart::answer;
    std::string channel_;   // the name being read after <|channel|>
    std::string pending_;
    std::string reasoning_, answer_;
    bool listening_ = true;
};

// A whole reply's reasoning and answer (the same split as streaming it through ReplyChannels).
struct SplitReply {
    std::string reasoning, answer;
};
SplitReply split_reply_channels(std::string_view text);

} // namespace tern
