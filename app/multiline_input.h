#pragma once
// One chat message typed over several lines: a `"""` line opens a block that runs to the next line
// ending with `"""`; a line ending with `\` continues on the next one (the backslash becomes a
// newline). Pure string logic, apart from the terminal (app/repl.h), so it is tested alone.
#include <string>
#include <string_view>

namespace tern::app {

class MultiLineInput {
public:
    // Adds a line (without its newline). True when the message is complete.
    bool feed(std::string_view line);
    // The message so far; taking it starts a new one.
    std::string take();
    bool in_progress() const { return started_; }

private:
    std::string text_;
    bool started_ = false;
    bool in_block_ = false;
    bool has_line_ = false;
};

} // namespace tern::app
