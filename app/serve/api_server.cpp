#include "app/serve/api_server.h"

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <random>

#include "app/serve/api_error.h"
#include "app/serve/api_response.h"
#include "base/error.h"
#include "base/terminal_text.h"

namespace tern::app {

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// Open connections per request answered at once: the served, the waiting and as many again reading their
// heads or kept alive. Beyond that, accept() answers 503.
constexpr size_t kOpenPerWorker = 4;

// How long a waiting answer sleeps between looks at whether its client is still connected: a client that went
// away stops its generation within this (a small model makes thousands of tokens a second).
constexpr auto kPollInterval = 50ms;

HttpReply json_reply(int status, const json& body) {
    HttpReply r;
    r.status = status;
    r.content_type = "application/json";
    r.body = dump_json(body);
    return r;
}

HttpReply error_body(const ApiError& e) {
    return json_reply(e.status, e.body());
}

ApiError error(int status, std::string message, std::string type, std::string code, std::string param = "") {
    ApiError e;
    e.status = status;
    e.message = std::move(message);
    e.type = std::move(type);
    e.code = std::move(code);
    e.param = std::move(param);
    return e;
}

// Whether `given` is the key, in a time that does not depend on where they differ.
bool same_secret(const std::string& given, const std::string& key) {
    if (key.empty()) return false;
    unsigned char diff = given.size() == key.size() ? 0 : 1;
    for (size_t i = 0; i < given.size(); ++i)
        diff |= static_cast<unsigned char>(given[i] ^ key[i % key.size()]);
    return diff == 0;
}

// The increment of a counter that the code which takes over the request (the answer's resource
// releaser) must undo; undone here when nobody took it over.
class InFlight {
public:
    explicit InFlight(std::atomic<int64_t>& n) : n_(&n) { ++*n_; }
    ~InFlight() {
        if (n_) --*n_;
    }
    void hand_over() { n_ = nullptr; }

private:
    std::atomic<int64_t>* n_;
};

} // namespace

struct ApiServer::Exchange {
    std::mutex mutex;
    std::condition_variable cv;
    std::string pending;                     // streamed text not yet written
    std::string pending_reasoning;           // ... of a channelled reply's reasoning (before `pending` in time)
    std::unique_ptr<ReplyChannels> channels; // a chat reply in channels (gpt-oss), split as it streams
    std::optional<BatchResult> result;
    bool finished = false;              // on_done ran (result may have been taken since)
    std::atomic<bool> abandoned{false}; // the client went away: on_text says stop
    RequestId id = 0;
    bool stream = false;
    bool chat = false;
    bool include_usage = false;
    bool logprobs = false;    // the answer carries its tokens' log-probabilities
    bool in_channels = false; // the reply's text has its control tokens, to split into reasoning and answer
    std::string echo;         // completions with echo: the prompt, written first
    ResponseHeader header;
};

ApiServer::ApiServer(BatchEngine& engine, const PromptMaker& prompts, ServeOptions options)
    : engine_(engine), prompts_(prompts), options_(std::move(options)) {
    std::random_device rd;
    char tag[16];
    std::snprintf(tag, sizeof tag, "%08x", rd());
    id_tag_ = tag;
    HttpServerOptions http;
    http.workers = std::max<size_t>(options_.max_connections, 1);
    http.queue = http.workers;
    http.max_open = kOpenPerWorker * http.workers;
    http.max_body_bytes = options_.max_body_bytes;
    server_ = std::make_unique<HttpServer>(http, handlers());
}

ApiServer::~ApiServer() {
    stop();
}

bool ApiServer::authorized(const HttpRequest& req) const {
    if (options_.api_key.empty()) return true;
    const std::string* given = req.header("Authorization");
    const std::string auth = given ? *given : "";
    const std::string prefix = "Bearer ";
    if (auth.size() < prefix.size() || auth.compare(0, prefix.size(), prefix) != 0) return false;
    return same_secret(auth.substr(prefix.size()), options_.api_key);
}

bool ApiServer::known_model(const std::string& name) const {
    if (name == options_.model_name) return true;
    for (const std::string& a : options_.model_aliases)
        if (name == a) return true;
    return false;
}

HttpCounters ApiServer::counters() const {
    HttpCounters c;
    {
        std::lock_guard<std::mutex> lock(counters_mutex_);
        c.responses = responses_;
    }
    c.connections_refused = server_->connections_refused();
    c.requests_in_flight = in_flight_.load();
    return c;
}

HttpHandlers ApiServer::handlers() {
    HttpHandlers h;
    h.screen = [this](const HttpRequest& req) { return screen(req); };
    h.serve = [this](const HttpRequest& req, HttpResponder& out) { serve(req, out); };
    h.error_reply = [this](const HttpError& e) { return error_reply(e); };
    h.on_response = [this](int status) {
        std::lock_guard<std::mutex> lock(counters_mutex_);
        ++responses_[status];
    };
    return h;
}

namespace {

enum class Route { none, health, metrics, models, model, chat_completions, completions };

constexpr std::string_view kModelPrefix = "/v1/models/";

Route route_of(const HttpRequest& req) {
    const std::string& m = req.head.method;
    const std::string& p = req.path;
    if (m == "GET" || m == "HEAD") {
        if (p == "/health") return Route::health;
        if (p == "/metrics") return Route::metrics;
        if (p == "/v1/models") return Route::models;
        if (p.size() > kModelPrefix.size() && p.compare(0, kModelPrefix.size(), kModelPrefix) == 0) return Route::model;
    } else if (m == "POST") {
        if (p == "/v1/chat/completions") return Route::chat_completions;
        if (p == "/v1/completions") return Route::completions;
    }
    return Route::none;
}

} // namespace

std::optional<HttpReply> ApiServer::screen(const HttpRequest& req) const {
    if (req.path != "/health" && !authorized(req))
        return error_body(error(401,
                                req.header("Authorization")
                                    ? "incorrect API key provided (the server was started with --api-key)"
                                    : "missing API key: send the header 'Authorization: Bearer KEY' (the server was "
                                      "started with --api-key)",
                                "invalid_request_error", "invalid_api_key"));
    if (route_of(req) == Route::none)
        return error_body(
            error(404,
                  "unknown endpoint: " + terminal_safe(req.head.method.substr(0, 16)) + " " +
                      terminal_safe(req.path.substr(0, 100)) +
                      " (this server has POST /v1/chat/completions, POST /v1/completions, GET /v1/models, "
                      "GET /health, GET /metrics)",
                  "invalid_request_error", "unknown_url"));
    return std::nullopt;
}

HttpReply ApiServer::error_reply(const HttpError& e) const {
    ApiError a;
    a.status = e.status;
    a.message = terminal_safe(e.message); // an exception's text may quote the request
    switch (e.status) {
    case 408:
        a.code = "request_timeout";
        break;
    case 413:
        a.message =
            "the request body is larger than " + std::to_string(options_.max_body_bytes) + " bytes (--max-body)";
        a.code = "request_too_large";
        break;
    case 414:
        a.code = "uri_too_long";
        break;
    case 417:
        a.code = "expectation_failed";
        break;
    case 431:
        a.code = "headers_too_large";
        break;
    case 501:
        a.code = "not_implemented";
        break;
    case 503:
        a.code = "too_many_connections";
        break;
    case 505:
        a.code = "http_version_not_supported";
        break;
    case 500:
        a.code = "internal_error";
        break;
    default:
        a.code = "invalid_request";
        break;
    }
    if (e.status >= 500) a.type = "server_error";
    return error_body(a);
}

void ApiServer::serve(const HttpRequest& req, HttpResponder& out) {
    switch (route_of(req)) {
    case Route::health: {
        const BatchStats st = engine_.stats();
        const json j = {{"status", draining_ ? "draining" : "ok"},
                        {"requests_running", st.running},
                        {"requests_waiting", st.waiting}};
        out.send(json_reply(draining_ ? 503 : 200, j));
        return;
    }
    case Route::metrics: {
        HttpReply r;
        r.content_type = "text/plain; version=0.0.4";
        r.body = prometheus_text(engine_.stats(), counters());
        out.send(r);
        return;
    }
    case Route::models:
        out.send(json_reply(200, models_json(options_.model_name, options_.created)));
        return;
    case Route::model: {
        const std::string name = req.path.substr(kModelPrefix.size());
        if (!known_model(name))
            out.send(error_body(error(404,
                                      "the model '" + terminal_safe(name.substr(0, 100)) +
                                          "' does not exist (this server serves '" + options_.model_name + "')",
                                      "invalid_request_error", "model_not_found", "model")));
        else
            out.send(json_reply(200, model_json(options_.model_name, options_.created)));
        return;
    }
    case Route::chat_completions:
        return generation(req, out, RequestKind::chat_completions);
    case Route::completions:
        return generation(req, out, RequestKind::completions);
    case Route::none:
        break; // screen() answered it
    }
}

void ApiServer::generation(const HttpRequest& req, HttpResponder& out, RequestKind kind) {
    InFlight counted(in_flight_); // from here on, a drain waits for this answer
    const auto send_error = [&out](const ApiError& e) { out.send(error_body(e)); };
    if (draining_)
        return send_error(
            error(503, "the server is shutting down and takes no new requests", "server_error", "shutting_down"));

    try {
        const json j = parse_request_json(req.body);
        const GenerationRequest g = read_generation_request(j, kind, options_.defaults);
        if (!g.model.empty() && !known_model(g.model))
            throw ApiException(error(404,
                                     "the model '" + terminal_safe(g.model.substr(0, 100)) +
                                         "' does not exist (this server serves '" + options_.model_name + "')",
                                     "invalid_request_error", "model_not_found", "model"));
        PreparedPrompt p = prompts_.prepare(g);

        auto ex = std::make_shared<Exchange>();
        ex->stream = g.stream;
        ex->chat = kind == RequestKind::chat_completions;
        ex->include_usage = g.include_usage;
        ex->logprobs = g.logprobs >= 0;
        if (g.echo) ex->echo = g.prompt;
        ex->header.id =
            std::string(ex->chat ? "chatcmpl-" : "cmpl-") + id_tag_ + "-" + std::to_string(next_response_id_++);
        ex->header.model = options_.model_name;
        ex->header.created = static_cast<int64_t>(std::time(nullptr));

        BatchRequest br;
        br.prompt = std::move(p.tokens);
        br.n_predict = g.max_tokens;
        br.sampling = g.sampling;
        br.stop = g.stop;
        br.repeat_guard = options_.repeat_guard;
        br.logprobs = g.logprobs;
        br.special_text = ex->in_channels = ex->chat && prompts_.chat_template().reply_has_channels();
        if (br.special_text && ex->stream) // on the engine thread only: on_text and on_done
            ex->channels = std::make_unique<ReplyChannels>([ex](ReplyPart part, std::string_view text) {
                {
                    std::lock_guard<std::mutex> lock(ex->mutex);
                    (part == ReplyPart::reasoning ? ex->pending_reasoning : ex->pending).append(text);
                }
                ex->cv.notify_all();
                return true;
            });
        br.on_text = [ex](std::string_view piece) {
            if (ex->channels) {
                ex->channels->push(piece);
            } else if (ex->stream) { // a whole answer is written from the result: nothing to wake it for
                {
                    std::lock_guard<std::mutex> lock(ex->mutex);
                    ex->pending.append(piece);
                }
                ex->cv.notify_all();
            }
            return !ex->abandoned.load();
        };
        br.on_done = [ex](BatchResult r) {
            if (ex->channels) ex->channels->finish(); // what it held back as a possible marker
            {
                std::lock_guard<std::mutex> lock(ex->mutex);
                ex->result = std::move(r);
                ex->finished = true;
            }
            ex->cv.notify_all();
        };
        const Submission sub = engine_.submit(std::move(br));
        if (!sub) {
            if (sub.refused == BatchError::queue_full) {
                HttpReply r = error_body(error(429, sub.message, "rate_limit_error", "queue_full"));
                r.headers.push_back({"Retry-After", "1"});
                out.send(r);
                return;
            }
            if (sub.refused == BatchError::shutting_down)
                return send_error(error(503, sub.message, "server_error", "shutting_down"));
            return send_error(error(400, sub.message, "invalid_request_error", "invalid_request"));
        }
        ex->id = sub.id;
        counted.hand_over(); // answer() counts it down
        answer(ex, out);
    } catch (const ApiException& e) {
        send_error(e.error());
    }
}

void ApiServer::answer(const std::shared_ptr<Exchange>& ex, HttpResponder& out) {
    // However this ends (written, client gone, a write failed, an exception), a request still in the
    // engine belongs to a client that is gone, and the in-flight count goes down.
    struct Release {
        const std::shared_ptr<Exchange>& ex;
        BatchEngine& engine;
        std::atomic<int64_t>& in_flight;
        ~Release() {
            bool finished = false;
            {
                std::lock_guard<std::mutex> lock(ex->mutex);
                finished = ex->finished;
            }
            if (!finished) {
                ex->abandoned = true;
                engine.cancel(ex->id); // not under ex->mutex: a waiting request's on_done runs right here
            }
            --in_flight;
        }
    } release{ex, engine_, in_flight_};

    const auto write = [&](const std::string& bytes) { return bytes.empty() || out.write(bytes); };
    if (ex->stream) {
        if (!out.start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}})) return;
        std::string first;
        if (ex->chat)
            first = sse_event(chat_role_chunk(ex->header));
        else if (!ex->echo.empty())
            first = sse_event(completion_chunk(ex->header, ex->echo));
        if (!write(first)) return;
    }
    // A whole answer is written once its result is known, so a failure gets its own status (500, 503)
    // rather than the 200 a stream has already sent; until then the client is only watched.

    std::optional<BatchResult> done;
    while (!done) {
        std::string text, reasoning;
        {
            std::unique_lock<std::mutex> lock(ex->mutex);
            ex->cv.wait_for(lock, kPollInterval, [&] {
                return !ex->pending.empty() || !ex->pending_reasoning.empty() || ex->result.has_value();
            });
            text.swap(ex->pending);
            reasoning.swap(ex->pending_reasoning);
            if (ex->result) {
                done = std::move(ex->result);
                ex->result.reset();
            }
        }
        if (ex->stream && !reasoning.empty()) // a reply's reasoning comes before its answer
            if (!write(sse_event(chat_reasoning_chunk(ex->header, reasoning)))) return;
        if (ex->stream && !text.empty()) {
            const json chunk = ex->chat ? chat_content_chunk(ex->header, text) : completion_chunk(ex->header, text);
            if (!write(sse_event(chunk))) return;
        }
        // Nothing new: is anyone still listening?
        if (!done && text.empty() && reasoning.empty() && out.client_gone()) return;
    }

    std::optional<ApiError> failure;
    if (!done->ok())
        failure = error(500, "generation failed: " + done->message, "server_error", "engine_failure");
    else if (done->stop_reason == StopReason::cancelled)
        failure = error(503, "the request was cancelled: the server is shutting down", "server_error", "cancelled");
    std::string body;
    if (ex->stream) {
        if (failure) {
            body = sse_event(failure->body());
        } else {
            body = sse_event(ex->chat ? chat_finish_chunk(ex->header, done->stop_reason)
                                      : completion_finish_chunk(ex->header, done->stop_reason));
            if (ex->include_usage) body += sse_event(usage_chunk(ex->header, ex->chat, done->n_prompt, done->n_gen()));
        }
        body += kSseDone;
    } else if (failure) {
        out.send(error_body(*failure));
        return;
    } else {
        json logprobs = nullptr;
        if (ex->logprobs) {
            const Tokenizer& tokenizer = prompts_.tokenizer();
            const TokenText text = [&tokenizer](int32_t id) { return tokenizer.token_to_piece(id); };
            logprobs = ex->chat ? chat_logprobs_json(done->logprobs, text)
                                : completion_logprobs_json(done->logprobs, text, ex->echo.size());
        }
        std::optional<SplitReply> split;
        if (ex->in_channels) split = split_reply_channels(done->text);
        out.send(json_reply(200, ex->chat ? chat_completion_json(ex->header, *done, logprobs, split ? &*split : nullptr)
                                          : text_completion_json(ex->header, *done, ex->echo + done->text, logprobs)));
        return;
    }
    if (write(body)) out.finish();
}

int ApiServer::bind() {
    std::string why;
    const int port = server_->listen(options_.host, options_.port, why);
    if (port < 0)
        throw UsageError("--host/--port: cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                         " (" + why + "; is another server using the port? --port 0 picks a free one)");
    options_.port = port;
    return port;
}

void ApiServer::start() {
    server_->start();
}

void ApiServer::begin_drain() {
    draining_ = true;
    server_->begin_drain();
}

void ApiServer::stop() {
    stopping_ = true;
    server_->stop();
}

} // namespace tern::app
