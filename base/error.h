#pragma once
// Errors that carry the process exit code of ../shared/CLI.md, so the app layer can map any
// exception to the right status without guessing. Libraries throw; only app/ prints.
#include <stdexcept>
#include <string>

#include "base/terminal_text.h"

namespace tern {

enum class ExitCode : int {
    ok = 0,
    usage = 1,       // unknown flag, bad value
    bad_input = 2,   // missing / unreadable / malformed / unsupported file
    runtime = 3,     // out of memory, device error
    interrupted = 130,
};

// The message is made terminal-safe here, once for every error: it may quote file content (a
// metadata string, a tensor name, a path) and is printed as one line wherever it is caught.
class TernError : public std::runtime_error {
public:
    TernError(ExitCode code, const std::string& message) : std::runtime_error(terminal_safe(message)), code_(code) {}
    ExitCode code() const { return code_; }

private:
    ExitCode code_;
};

// A bad input file or unsupported content: exit 2.
struct InputError : TernError {
    explicit InputError(const std::string& message) : TernError(ExitCode::bad_input, message) {}
};

// A bad flag or value: exit 1.
struct UsageError : TernError {
    explicit UsageError(const std::string& message) : TernError(ExitCode::usage, message) {}
};

// Out of memory, device failure, disk full: exit 3.
struct RuntimeFailure : TernError {
    explicit RuntimeFailure(const std::string& message) : TernError(ExitCode::runtime, message) {}
};

} // namespace tern
