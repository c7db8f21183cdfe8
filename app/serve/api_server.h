#pragma once
// `tern serve`'s HTTP side: OpenAI's API over our HTTP server (http_server.h) on top of a BatchEngine.
//
//   POST /v1/chat/completions, POST /v1/completions   streamed (server-sent events) or not
//   GET  /v1/models, /v1/models/{id}                  the one model served
//   GET  /health                                      200 {"status": "ok"}, 503 while draining
//   GET  /metrics                                     Prometheus text (metrics_text.h)
//
// Every error is OpenAI's error body with a fitting status (api_error.h). Limits: a request body of at
// most max_body_bytes (413), a prompt the context holds (400), max_connections requests answered at
// once plus as many waiting (beyond them 503 at once), 4 x max_connections open connections (503 at
// accept), the HTTP layer's caps on heads and deadlines (http_server.h), the engine's waiting queue
// (429 when full). With an API key every route but /health wants "Authorization: Bearer KEY" (401),
// checked on the head before any body is read. A client that goes away (closed socket, failed write)
// cancels its request in the engine.
//
// Answers are written on the HTTP server's worker threads: the engine's callbacks only append to the
// request's own buffer (they never block on a socket), and the worker waits on it, looking every 50 ms
// whether the client is still there. A non-streamed answer is written whole once its result is known,
// so an engine failure gets its status (500; 503 when cancelled by a shutdown) and an error body; a
// stream has sent 200 already, and a failure arrives as an SSE event {"error": ...}. This file knows
// nothing of sockets.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "app/serve/http_server.h"
#include "app/serve/metrics_text.h"
#include "app/serve/prompt_maker.h"
#include "app/serve/request_fields.h"
#include "engine/batch/batch_engine.h"
#include "engine/generation/repeat_guard.h"

namespace tern::app {

struct ServeOptions {
    std::string host = "127.0.0.1";
    int port = 8080;              // 0: any free port (bind() returns it)
    std::string api_key;          // empty: no authentication
    size_t max_connections = 128; // requests answered at once; as many more may wait
    size_t max_body_bytes = size_t{8} << 20;
    std::string model_name;                 // the id /v1/models lists
    std::vector<std::string> model_aliases; // other names a request may give (the file name, general.name)
    int64_t created = 0;                    // the model's "created" (the file's modification time)
    RequestDefaults defaults;               // for fields a request leaves out
    RepeatGuardParams repeat_guard;
};

class ApiServer {
public:
    ApiServer(BatchEngine& engine, const PromptMaker& prompts, ServeOptions options);
    ~ApiServer();
    ApiServer(const ApiServer&) = delete;
    ApiServer& operator=(const ApiServer&) = delete;

    // Binds host:port and returns the port. Throws UsageError naming --host/--port when it cannot.
    int bind();
    // Serves on a thread of its own until stop().
    void start();
    // New generation requests get 503 from now on (and /health says draining); admitted ones go on.
    void begin_drain();
    // Generation requests whose answer is still being written.
    int64_t in_flight() const { return in_flight_.load(); }
    // Closes every connection and joins the server's threads.
    void stop();
    // The server's reception loop ended by itself: it no longer answers.
    bool failed() const { return server_->failed() && !stopping_.load(); }

    HttpCounters counters() const;

private:
    struct Exchange;

    HttpHandlers handlers();
    std::optional<HttpReply> screen(const HttpRequest& req) const;
    void serve(const HttpRequest& req, HttpResponder& out);
    HttpReply error_reply(const HttpError& e) const;
    void generation(const HttpRequest& req, HttpResponder& out, RequestKind kind);
    void answer(const std::shared_ptr<Exchange>& ex, HttpResponder& out);
    bool authorized(const HttpRequest& req) const;
    bool known_model(const std::string& name) const;

    BatchEngine& engine_;
    const PromptMaker& prompts_;
    ServeOptions options_;
    std::unique_ptr<HttpServer> server_;
    std::atomic<bool> stopping_{false};
    std::atomic<bool> draining_{false};
    std::atomic<int64_t> in_flight_{0};
    std::atomic<uint64_t> next_response_id_{1};
    std::string id_tag_; // random per process, so response ids of two runs differ
    mutable std::mutex counters_mutex_;
    std::map<int, uint64_t> responses_;
};

} // namespace tern::app
