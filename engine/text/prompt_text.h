#pragma once
// A prompt made of two kinds of text: markup, whose control-token texts ("<start_of_turn>", "<|im_end|>")
// are those tokens (a chat template's own words), and content, read as plain text whatever it holds (a
// message someone wrote: typing "<end_of_turn>" must not end their turn and open a forged one, as with
// OpenAI's API). The renderer marks the spans: the hand-written chat formats today, and any renderer to
// come (a Jinja interpreter) the same way, its literal text as markup and every value taken from a
// message as content. Tokenizer::encode_prompt reads them.
//
// The spans are one string to the tokenizer: text runs on across a span boundary exactly as in the
// concatenation, so a prompt whose content holds no control-token text gets the very tokens of that
// string encoded with parse_special. Only where a control token may be recognised differs.
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tern {

class PromptText {
public:
    PromptText() = default;

    PromptText& markup(std::string_view s);
    PromptText& content(std::string_view s);
    PromptText& append(const PromptText& other); // other's spans keep their kinds

    const std::string& text() const { return text_; }
    bool empty() const { return text_.empty(); }
    size_t size() const { return text_.size(); }

    // Whether the bytes [begin, end) of text() are all markup (a control token found there is one).
    bool is_markup(size_t begin, size_t end) const;
    // The bytes [begin, end) of text() with their kinds (end is clamped to size()).
    PromptText slice(size_t begin, size_t end) const;
    // [begin, end) ranges of content in text(): ascending, disjoint, adjacent ones merged.
    const std::vector<std::pair<size_t, size_t>>& content_ranges() const { return content_; }

private:
    std::string text_;
    std::vector<std::pair<size_t, size_t>> content_;
};

} // namespace tern
