#pragma once
// The input side of `tern chat` on a terminal: line editing and history (libedit), multi-line
// input (app/multiline_input.h), and Ctrl-C at the prompt as a key rather than a signal. Replies and everything else are
// cmd_chat.cpp's.
#include <memory>
#include <string>
#include <string_view>

#include "app/multiline_input.h"

namespace tern::app {

// $XDG_STATE_HOME/tern/chat_history, else ~/.local/state/tern/chat_history; "" when neither is known.
std::string default_history_path();

struct EditorInput {
    enum class Kind { line, interrupt, eof } kind = Kind::eof;
    std::string text;          // kind line: the message, multi-line input joined with '\n'
    bool was_empty = true;     // kind interrupt: nothing had been typed yet
};

// libedit on stdin/stdout with a history file. Lines pasted together (already waiting on stdin
// when one ends) are returned as one message, their newlines kept.
class LineEditor {
public:
    // `history_path` "" keeps history in memory only. A file that cannot be read or written is
    // ignored: history is a convenience, never a reason to fail.
    LineEditor(std::string history_path, bool color);
    ~LineEditor();
    LineEditor(const LineEditor&) = delete;
    LineEditor& operator=(const LineEditor&) = delete;

    EditorInput read();

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

} // namespace tern::app
