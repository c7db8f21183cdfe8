#include "engine/text/prompt_text.h"

#include <algorithm>

namespace tern {

PromptText& PromptText::markup(std::string_view s) {
    text_ += s;
    return *this;
}

PromptText& PromptText::content(std::string_view s) {
    if (s.empty()) return *this;
    const size_t begin = text_.size();
    text_ += s;
    if (!content_.empty() && content_.back().second == begin)
        content_.back().second = text_.size();
    else
        content_.emplace_back(begin, text_.size());
    return *this;
}

PromptText& PromptText::append(const PromptText& other) {
    size_t at = 0;
    for (const auto& [begin, end] : other.content_) {
        markup(std::string_view(other.text_).substr(at, begin - at));
        content(std::string_view(other.text_).substr(begin, end - begin));
        at = end;
    }
    markup(std::string_view(other.text_).substr(at));
    return *this;
}

bool PromptText::is_markup(size_t begin, size_t end) const {
    // The first content range that ends after `begin`: it overlaps [begin, end) when it starts before `end`.
    const auto it = std::upper_bound(content_.begin(), content_.end(), begin,
                                     [](size_t pos, const std::pair<size_t, size_t>& r) { return pos < r.second; });
    return it == content_.end() || it->first >= end;
}

PromptText PromptText::slice(size_t begin, size_t end) const {
    end = std::min(end, text_.size());
    PromptText out;
    if (begin >= end) return out;
    size_t at = begin;
    for (const auto& [cb, ce] : content_) {
        if (ce <= at) continue;
        if (cb >= end) break;
        const size_t b = std::max(cb, at), e = std::min(ce, end);
        out.markup(std::string_view(text_).substr(at, b - at));
        out.content(std::string_view(text_).substr(b, e - b));
        at = e;
    }
    out.markup(std::string_view(text_).substr(at, end - at));
    return out;
}

} // namespace tern
