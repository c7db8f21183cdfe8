#pragma once
// tern run --batch FILE: one request per JSON line in ({"prompt": ..} or {"messages": [..]}, with an
// optional "id" and per-request sampling fields: app/serve/request_fields.h), one JSON line out per
// request, in input order (--unordered: as they finish), through a BatchEngine. A line that cannot
// run (bad JSON, a field of the wrong type, a prompt longer than the context) gets an output line
// with an "error" object and the rest go on. Progress goes to stderr: a bar on a terminal, else a
// line every 10 seconds; a summary line at the end.
//
// Exit status: 0 when every request ran, 2 when some line was refused (its output line says why), 3
// when the engine failed on some request, 130 when interrupted (the lines finished so far are written).
#include <cstdint>
#include <string>

#include "app/common_options.h"
#include "app/serve/request_fields.h"
#include "engine/generation/repeat_guard.h"

namespace tern::app {

struct BatchRunOptions {
    bool unordered = false;
    int32_t parallel = 1;
    RequestDefaults defaults;        // -n, sampling flags, --seed, --stop
    RepeatGuardParams repeat_guard;
    bool chat = false;               // --chat: "prompt" lines become one user turn
    std::string system;              // --system, with --chat
    std::string chat_template;       // --chat-template
    std::string reasoning_effort;    // --reasoning-effort
    bool parse_special = true;       // "prompt" lines' control-token texts are those tokens (--no-parse-special)
};

// The batch input, read before the model loads: FILE, or stdin for "-". Regular files only, capped
// like every text input (formats/input_file.h); InputError (exit 2) otherwise.
std::string read_batch_input(const std::string& file);

// Runs every line of `input` on the loaded model; returns the exit status.
int run_batch(const std::string& input, LoadedSession& loaded, const BatchRunOptions& options);

} // namespace tern::app
