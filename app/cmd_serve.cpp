// tern serve: an OpenAI-compatible HTTP server for one model (app/serve/api_server.h) on a BatchEngine
// (engine/batch/batch_engine.h). stdout stays empty; the listening line, notes and the drain go to stderr.
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/serve/api_server.h"
#include "app/serve/http_socket.h"
#include "app/serve/prompt_maker.h"
#include "app/signals.h"
#include "base/error.h"
#include "base/terminal_text.h"
#include "engine/batch/batch_engine.h"
#include "engine/model.h"
#include "engine/prefix_cache/prefix_cache.h"

namespace tern::app {

namespace {

struct ServeFlags {
    ModelOptions model;
    SamplingOptions sampling;
    RepeatGuardParams repeat_guard;
    PromptCacheOptions prompt_cache;   // requests that start like an earlier run's read its blocks from disk
    int32_t n_predict = -1;
    std::string chat_template;
    std::string reasoning_effort;   // gpt-oss: the default of requests without reasoning_effort
    std::string host = "127.0.0.1";
    int port = 8080;
    int32_t parallel = 1;
    int32_t max_queue = 64;
    int32_t max_connections = 128;
    std::string max_body = "8M";
    std::optional<std::string> api_key; // --api-key as given (else $TERN_API_KEY): checked_api_key
    std::string alias;
    bool no_parse_special = false; // /v1/completions prompts' control-token texts are text
};

int64_t file_mtime(const std::string& path) {
    struct stat st = {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_mtime) : 0;
}

// The key every request but /health must carry: --api-key, else $TERN_API_KEY (an explicit flag wins over the
// environment, as CLI11's own envname does). The server is open only when neither is set: an empty, blank or
// control-character key is refused, because it comes from a deployment that meant to set one (an unset
// variable in a template, a stray newline) and reading it as "no key" would serve everyone.
std::string checked_api_key(const std::optional<std::string>& flag) {
    const char* env = std::getenv("TERN_API_KEY");
    if (!flag && !env) return "";
    const std::string name = flag ? "--api-key" : "TERN_API_KEY";
    const std::string key = flag ? *flag : env;
    const std::string hint = " (to serve without a key, leave both --api-key and TERN_API_KEY unset)";
    if (key.empty()) throw UsageError(name + ": empty; an empty key is never a key" + hint);
    const std::string printable = "give a key of printable characters";
    if (key.find_first_not_of(" \t") == std::string::npos)
        throw UsageError(name + ": holds only whitespace; " + printable + hint);
    for (size_t i = 0; i < key.size(); ++i) {
        const auto c = static_cast<unsigned char>(key[i]);
        if (c < 0x20 || c == 0x7f)
            throw UsageError(name + ": holds a control character (byte " + std::to_string(c) + " at offset " +
                             std::to_string(i) + "), which no Authorization header can carry; " + printable + hint);
    }
    if (key.front() == ' ' || key.back() == ' ')
        throw UsageError(name + ": begins or ends with a space, which an Authorization header drops; " + printable +
                         " without it" + hint);
    return key;
}

int serve(const ServeFlags& f) {
    // Flags first, so a typo does not wait for the model to load.
    const std::string api_key = checked_api_key(f.api_key);
    resolve_sampling(f.sampling);
    check_repeat_guard(f.repeat_guard);
    prompt_cache_size_bytes(f.prompt_cache);
    const std::optional<uint64_t> max_body = parse_byte_size(f.max_body);
    if (!max_body || *max_body < 1024 || *max_body > (uint64_t{1} << 30))
        throw UsageError("--max-body: '" + terminal_safe(f.max_body) + "' is not a size between 1K and 1G (examples: 512K, 8M)");
    if (f.host.empty()) throw UsageError("--host: empty (give an address such as 127.0.0.1, or 0.0.0.0 for every interface)");

    ModelOptions model = f.model;
    model.sequences = f.parallel;   // the KV pool holds a full context for each sequence
    LoadedSession loaded = load_session(model);
    attach_prompt_cache(loaded, f.model, f.prompt_cache); // the BatchEngine reads and writes it (served_model)
    Session& session = *loaded.session;
    PromptMaker prompts(session.tokenizer(), resolve_chat_template(session, f.chat_template, f.reasoning_effort),
                        loaded.n_ctx, {.parse_special = !f.no_parse_special});

    ServeOptions so;
    so.host = f.host;
    so.port = f.port;
    so.api_key = api_key;
    so.max_connections = static_cast<size_t>(f.max_connections);
    so.max_body_bytes = static_cast<size_t>(*max_body);
    const std::filesystem::path path(f.model.model);
    const std::string stem = path.stem().string();
    so.model_name = f.alias.empty() ? stem : f.alias;
    for (const std::string& name : {stem, path.filename().string(), f.model.model})
        if (name != so.model_name) so.model_aliases.push_back(name);
    if (const Model* m = session.model()) {
        const std::string general = m->file.get_string("general.name", "");
        if (!general.empty() && general != so.model_name) so.model_aliases.push_back(general);
    }
    so.created = file_mtime(f.model.model);
    so.defaults.sampling = f.sampling.params;
    so.defaults.seed = f.sampling.seed;
    so.defaults.n_predict = f.n_predict;
    so.repeat_guard = f.repeat_guard;

    BatchEngine engine(served_model(session), {.parallel = f.parallel, .max_waiting = f.max_queue});
    ApiServer server(engine, prompts, so);
    ShutdownSignals signals;   // before any thread starts, so none runs with the old handlers' intent
    const int port = server.bind();
    server.start();
    std::cerr << "tern: serving " << terminal_safe(so.model_name) << " at http://"
              << terminal_safe(host_for_url(f.host)) << ":" << port << "/v1 (" << loaded.device << ", context "
              << loaded.n_ctx << ", parallel " << f.parallel << ", queue " << f.max_queue
              << (api_key.empty() ? "" : ", API key required")
              << "); Ctrl-C or SIGTERM finishes the requests in progress and exits\n";

    // The engine runs on this thread, the one that loaded the model: a GPU's current device is a
    // per-thread setting of the CUDA runtime. A supervisor thread watches the signals and the listener.
    std::atomic<bool> cancelled{false};
    std::atomic<bool> failed{false};
    std::atomic<bool> quit{false};
    std::thread supervisor([&] {
        bool draining = false;
        while (!quit) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const int n = signals.count();
            if (n >= 1 && !draining) {
                draining = true;
                server.begin_drain();
                engine.drain();
                const BatchStats st = engine.stats();
                std::cerr << "tern: shutting down: finishing " << st.running + st.waiting
                          << " requests, refusing new ones (Ctrl-C again cancels them)\n";
            }
            if (n >= 2 && !cancelled) {
                cancelled = true;
                engine.stop();
                std::cerr << "tern: cancelling the requests in progress\n";
            }
            // The engine stopped for good (a model file changed under it) and failed every request: answer
            // them, then exit with its error.
            if (!draining && !engine.fatal_error().empty()) {
                draining = true;
                server.begin_drain();
            }
            if (server.failed() && !failed) {
                failed = true;
                engine.stop();
                return;
            }
            // Drained: the engine is idle and every answer written.
            if (draining && engine.idle() && server.in_flight() == 0) return;
        }
    });
    struct JoinOnThrow {   // run() does not throw, but a thread left joinable would end the process
        std::atomic<bool>& quit;
        std::thread& t;
        ~JoinOnThrow() {
            quit = true;
            if (t.joinable()) t.join();
        }
    } join_on_throw{quit, supervisor};
    engine.run();         // until drained, or stopped by a second signal or a failed listener
    supervisor.join();    // returns once every answer is written
    if (failed)
        throw RuntimeFailure("--host/--port: the server stopped accepting connections on " + f.host + ":" +
                             std::to_string(port));
    server.stop();
    if (const std::string fatal = engine.fatal_error(); !fatal.empty()) throw RuntimeFailure(fatal);
    const BatchStats st = engine.stats();
    std::cerr << "tern: served " << st.completed << " requests (" << st.cancelled << " cancelled, " << st.failed
              << " failed, " << st.refused << " refused), generated " << st.generated_tokens << " tokens\n";
    return cancelled ? static_cast<int>(ExitCode::interrupted) : 0;
}

} // namespace

Command add_serve_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("serve", "an OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions)");
    auto f = std::make_shared<ServeFlags>();
    add_model_options(*cmd, f->model);
    cmd->add_option("--host", f->host, "address to listen on (default 127.0.0.1: this machine only)");
    cmd->add_option("--port", f->port, "port to listen on; 0 picks a free one (default 8080)")
        ->check(integer_in_range(0, 65535, "0 = any free port"));
    cmd->add_option("--api-key", f->api_key,
                    "require 'Authorization: Bearer KEY' on every request but /health (default: $TERN_API_KEY; "
                    "an empty key is refused)");
    cmd->add_option("--parallel", f->parallel, "sequences decoded together (default 1)")
        ->check(integer_in_range(1, 256, "sequences"));
    cmd->add_option("--max-queue", f->max_queue,
                    "requests that may wait for their turn; more are answered 429 (default 64)")
        ->check(integer_in_range(0, 100000, "requests"));
    cmd->add_option("--max-connections", f->max_connections,
                    "requests answered at once, as many more may wait, 4x as many connections open; beyond, 503 at "
                    "once (default 128)")
        ->check(integer_in_range(1, 4096, "connections"));
    cmd->add_option("--max-body", f->max_body, "largest request body, suffixes K, M (default 8M)");
    cmd->add_flag("--no-parse-special", f->no_parse_special,
                  "read control-token texts such as <start_of_turn> in a /v1/completions prompt as text (chat "
                  "messages always are)");
    cmd->add_option("--alias", f->alias, "the model's name in the API (default: the file name without .gguf)");
    cmd->add_option("-n,--n-predict", f->n_predict,
                    "tokens to generate when a request gives no max_tokens; -1 = until EOS or the context is full "
                    "(default -1)")
        ->check(n_predict_range());
    add_sampling_options(*cmd, f->sampling);
    add_repeat_guard_options(*cmd, f->repeat_guard);
    add_prompt_cache_options(*cmd, f->prompt_cache);
    std::string names;
    for (const std::string& n : ChatTemplate::names()) names += (names.empty() ? "" : ", ") + n;
    cmd->add_option("--chat-template", f->chat_template,
                    "chat format for /v1/chat/completions instead of the model's template: " + names)
        ->check(chat_template_check());
    add_reasoning_effort_option(*cmd, f->reasoning_effort);
    return {cmd, [f] { return serve(*f); }};
}

} // namespace tern::app
