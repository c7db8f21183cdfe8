#include "app/repl.h"

#include <histedit.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace tern::app {

namespace {

constexpr int kHistorySize = 1000;
// A paste reaches us in bursts: lines that arrive within this long of the previous one's end
// belong to the same message. Far below human typing speed, far above a terminal's burst gaps.
constexpr int kPasteGapMs = 15;

bool input_pending(int timeout_ms) {
    pollfd p{STDIN_FILENO, POLLIN, 0};
    return ::poll(&p, 1, timeout_ms) > 0 && (p.revents & POLLIN);
}

} // namespace

std::string default_history_path() {
    namespace fs = std::filesystem;
    fs::path dir;
    if (const char* state = std::getenv("XDG_STATE_HOME"); state && *state)
        dir = fs::path(state) / "tern";
    else if (const char* home = std::getenv("HOME"); home && *home)
        dir = fs::path(home) / ".local/state/tern";
    else
        return {};
    return (dir / "chat_history").string();
}

// ---------------------------------------------------------------------------------------------

struct LineEditor::Impl {
    EditLine* el = nullptr;
    History* history = nullptr;
    std::string history_path;
    std::string prompt;   // what the prompt callback returns
    bool color = false;
    bool ctrl_c = false;
    bool ctrl_c_empty = false;

    enum class Raw { line, interrupt, eof };
    Raw read_line(const std::string& shown, std::string& out);
    void remember(const std::string& text);
};

namespace {

LineEditor::Impl* impl_of(EditLine* el) {
    void* data = nullptr;
    el_get(el, EL_CLIENTDATA, &data);
    return static_cast<LineEditor::Impl*>(data);
}

char* prompt_of(EditLine* el) { return impl_of(el)->prompt.data(); }

// Ctrl-C at the prompt arrives as a key (the terminal's ISIG is off while editing, see the
// constructor): it ends the line like EOF does, and read() tells the two apart by this flag.
unsigned char on_ctrl_c(EditLine* el, int) {
    LineEditor::Impl* impl = impl_of(el);
    const LineInfo* li = el_line(el);
    impl->ctrl_c = true;
    impl->ctrl_c_empty = li->lastchar == li->buffer;
    return CC_EOF;
}

} // namespace

LineEditor::Impl::Raw LineEditor::Impl::read_line(const std::string& shown, std::string& out) {
    // \1 brackets the colour escapes so libedit does not count them as prompt columns.
    prompt = color ? "\1\033[1;32m\1" + shown + "\1\033[0m\1" : shown;
    ctrl_c = false;
    int count = 0;
    const char* s = nullptr;
    do {
        errno = 0;
        s = el_gets(el, &count);
    } while (!s && !ctrl_c && count < 0 && errno == EINTR);
    if (!s) return ctrl_c ? Raw::interrupt : Raw::eof;
    out.assign(s, static_cast<size_t>(count));
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return Raw::line;
}

void LineEditor::Impl::remember(const std::string& text) {
    if (text.empty()) return;
    HistEvent ev;
    ::history(history, &ev, H_ENTER, text.c_str());
    // Saved after every entry, so a killed session keeps its history; failures are ignored.
    if (!history_path.empty()) ::history(history, &ev, H_SAVE, history_path.c_str());
}

LineEditor::LineEditor(std::string history_path, bool color) : impl_(std::make_unique<Impl>()) {
    // libedit reads multibyte (UTF-8) input only under a matching LC_CTYPE.
    std::setlocale(LC_CTYPE, "");
    impl_->color = color;
    impl_->history_path = std::move(history_path);
    impl_->history = history_init();
    HistEvent ev;
    ::history(impl_->history, &ev, H_SETSIZE, kHistorySize);
    ::history(impl_->history, &ev, H_SETUNIQUE, 1);
    if (!impl_->history_path.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(std::filesystem::path(impl_->history_path).parent_path(), ec);
        ::history(impl_->history, &ev, H_LOAD, impl_->history_path.c_str());   // absent on first use
    }

    EditLine* el = el_init("tern", stdin, stdout, stderr);
    impl_->el = el;
    el_set(el, EL_CLIENTDATA, impl_.get());
    el_set(el, EL_EDITOR, "emacs");
    el_set(el, EL_PROMPT_ESC, prompt_of, '\1');
    el_set(el, EL_HIST, ::history, impl_->history);
    // The wide call: libedit keeps these static strings as they are, where the narrow el_set copies
    // them (wcsdup) and never frees the copies (LeakSanitizer reports them at exit).
    el_wset(el, EL_ADDFN, L"tern-interrupt", L"Ctrl-C: drop the line; on an empty line twice, quit", on_ctrl_c);
    el_set(el, EL_BIND, "^C", "tern-interrupt", nullptr);
    // While a line is edited, Ctrl-C is a key (above), not SIGINT; during a reply the terminal is
    // back in its normal mode and Ctrl-C raises the cancel flag (app/signals.h).
    el_set(el, EL_SETTY, "-d", "-isig", nullptr);
    el_source(el, nullptr);   // the user's ~/.editrc, as every libedit program reads it
}

LineEditor::~LineEditor() {
    if (impl_->el) el_end(impl_->el);
    if (impl_->history) history_end(impl_->history);
}

EditorInput LineEditor::read() {
    MultiLineInput multi;
    EditorInput in;
    std::string line;
    for (;;) {
        const Impl::Raw raw = impl_->read_line(multi.in_progress() ? "... " : ">>> ", line);
        if (raw == Impl::Raw::interrupt) {
            in.kind = EditorInput::Kind::interrupt;
            in.was_empty = impl_->ctrl_c_empty && !multi.in_progress();
            return in;
        }
        if (raw == Impl::Raw::eof) {
            if (multi.in_progress()) {   // Ctrl-D inside a block: send what was typed
                in.kind = EditorInput::Kind::line;
                in.text = multi.take();
                impl_->remember(in.text);
                return in;
            }
            in.kind = EditorInput::Kind::eof;
            return in;
        }
        if (!multi.feed(line)) continue;
        in.text = multi.take();
        // Pasted lines: the rest of the paste is already waiting; keep it in this message.
        while (input_pending(kPasteGapMs)) {
            if (impl_->read_line("... ", line) != Impl::Raw::line) break;
            in.text += '\n';
            in.text += line;
        }
        in.kind = EditorInput::Kind::line;
        impl_->remember(in.text);
        return in;
    }
}

} // namespace tern::app
