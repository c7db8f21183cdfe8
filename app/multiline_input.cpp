#include "app/multiline_input.h"

namespace tern::app {

namespace {

constexpr std::string_view kQuotes = R"(""")";

} // namespace

bool MultiLineInput::feed(std::string_view line) {
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    auto add = [this](std::string_view l) {
        if (!text_.empty() || has_line_) text_ += '\n';
        text_ += l;
        has_line_ = true;
    };
    if (in_block_) {
        if (line.ends_with(kQuotes)) {
            const std::string_view last = line.substr(0, line.size() - kQuotes.size());
            if (!last.empty()) add(last);
            in_block_ = false;
            return true;
        }
        add(line);
        return false;
    }
    if (!started_ && line.starts_with(kQuotes)) {
        started_ = true;
        const std::string_view rest = line.substr(kQuotes.size());
        if (rest.size() >= kQuotes.size() && rest.ends_with(kQuotes)) {   // """one line"""
            add(rest.substr(0, rest.size() - kQuotes.size()));
            return true;
        }
        in_block_ = true;
        if (!rest.empty()) add(rest);
        return false;
    }
    started_ = true;
    if (line.ends_with('\\')) {
        add(line.substr(0, line.size() - 1));
        return false;
    }
    add(line);
    return true;
}

std::string MultiLineInput::take() {
    std::string out = std::move(text_);
    text_.clear();
    started_ = in_block_ = has_line_ = false;
    return out;
}

} // namespace tern::app
