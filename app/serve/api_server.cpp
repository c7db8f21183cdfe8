#include "app/serve/api_server.h"

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <memory>
#include <optional>
#include <random>

#include <httplib.h>

#include "app/serve/api_error.h"
#include "app/serve/api_response.h"
#include "app/serve/connection_queue.h"
#include "base/error.h"
#include "base/terminal_text.h"

namespace tern::app {

// httplib's server with a longer queue of connections not yet accepted: the Debian library listens
// with a backlog of 5, so a burst of clients would see their connection attempts dropped and retried
// for seconds. listen() again on the bound socket sets the new length (the kernel caps it at somaxconn).
class HttpServer : public httplib::Server {
public:
    void widen_backlog(int n) {
        if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, n);
    }
};

namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// How long a waiting answer sleeps between looks at whether its client is still connected: a client that went
// away stops its generation within this (a small model makes thousands of tokens a second).
constexpr auto kPollInterval = 50ms;

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(dump_json(e.body()), "application/json");
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
    std::string pending;               // streamed text not yet written
    std::string pending_reasoning;     // ... of a channelled reply's reasoning (before `pending` in time)
    std::unique_ptr<ReplyChannels> channels;   // a chat reply in channels (gpt-oss), split as it streams
    std::optional<BatchResult> result;
    bool finished = false;             // on_done ran (result may have been taken since)
    std::atomic<bool> abandoned{false};   // the client went away: on_text says stop
    RequestId id = 0;
    bool stream = false;
    bool chat = false;
    bool include_usage = false;
    bool logprobs = false;             // the answer carries its tokens' log-probabilities
    bool in_channels = false;          // the reply's text has its control tokens, to split into reasoning and answer
    std::string echo;                  // completions with echo: the prompt, written first
    ResponseHeader header;
};

ApiServer::ApiServer(BatchEngine& engine, const PromptMaker& prompts, ServeOptions options)
    : engine_(engine), prompts_(prompts), options_(std::move(options)), server_(std::make_unique<HttpServer>()) {
    std::random_device rd;
    char tag[16];
    std::snprintf(tag, sizeof tag, "%08x", rd());
    id_tag_ = tag;
    routes();
}

ApiServer::~ApiServer() { stop(); }

bool ApiServer::authorized(const httplib::Request& req) const {
    if (options_.api_key.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
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
    c.connections_refused = refused_connections_.load();
    c.requests_in_flight = in_flight_.load();
    return c;
}

void ApiServer::routes() {
    httplib::Server& s = *server_;
    const size_t workers = std::max<size_t>(options_.max_connections, 1);
    s.new_task_queue = [this, workers] { return new ConnectionQueue(workers, workers, &refused_connections_); };
    s.set_payload_max_length(options_.max_body_bytes);
    s.set_keep_alive_max_count(100);
    s.set_keep_alive_timeout(3);   // an idle client's connection holds a worker this long; and drain waits for it
    s.set_read_timeout(10);
    s.set_write_timeout(10);       // a client that stops reading a stream for this long is gone
    s.set_tcp_nodelay(true);       // streamed pieces leave at once

    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (ConnectionQueue::refusing_here()) {
            send_error(res, error(503,
                                  "too many connections: " + std::to_string(options_.max_connections) +
                                      " are served at once and as many wait; try again",
                                  "server_error", "too_many_connections"));
            res.set_header("Retry-After", "1");
            res.set_header("Connection", "close");
            return httplib::Server::HandlerResponse::Handled;
        }
        if (req.path != "/health" && !authorized(req)) {
            send_error(res, error(401,
                                  req.has_header("Authorization")
                                      ? "incorrect API key provided (the server was started with --api-key)"
                                      : "missing API key: send the header 'Authorization: Bearer KEY' (the server "
                                        "was started with --api-key)",
                                  "invalid_request_error", "invalid_api_key"));
            res.set_header("Connection", "close");   // its body, if any, was not read
            return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });

    // Statuses httplib decides itself (404 no route, 413, 400 a malformed request line) get OpenAI's body too.
    s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty() || res.has_header("Content-Type")) return httplib::Server::HandlerResponse::Unhandled;
        ApiError e;
        e.status = res.status;
        if (res.status == 404) {
            e.message = "unknown endpoint: " + terminal_safe(req.method.substr(0, 16)) + " " +
                        terminal_safe(req.path.substr(0, 100)) +
                        " (this server has POST /v1/chat/completions, POST /v1/completions, GET /v1/models, GET "
                        "/health, GET /metrics)";
            e.code = "unknown_url";
        } else if (res.status == 413) {
            e.message = "the request body is too large";
            e.code = "request_too_large";
        } else if (res.status == 414) {
            e.message = "the request URI is too long";
        } else {
            e.message = "bad request (HTTP status " + std::to_string(res.status) + ")";
            if (res.status >= 500) e.type = "server_error";
        }
        send_error(res, e);
        return httplib::Server::HandlerResponse::Handled;
    }));

    s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
            if (ep) std::rethrow_exception(ep);
        } catch (const std::bad_alloc&) {
            what = "out of memory";
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        send_error(res, error(500, "internal error: " + terminal_safe(what.substr(0, 200)), "server_error", "internal_error"));
    });

    s.set_logger([this](const httplib::Request&, const httplib::Response& res) {
        std::lock_guard<std::mutex> lock(counters_mutex_);
        ++responses_[res.status];
    });

    s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        const BatchStats st = engine_.stats();
        json j = {{"status", draining_ ? "draining" : "ok"}, {"requests_running", st.running}, {"requests_waiting", st.waiting}};
        res.status = draining_ ? 503 : 200;
        res.set_content(dump_json(j), "application/json");
    });
    s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(prometheus_text(engine_.stats(), counters()), "text/plain; version=0.0.4");
    });
    s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(dump_json(models_json(options_.model_name, options_.created)), "application/json");
    });
    s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
        const std::string name = req.matches[1];
        if (!known_model(name))
            return send_error(res, error(404,
                                         "the model '" + terminal_safe(name.substr(0, 100)) +
                                             "' does not exist (this server serves '" + options_.model_name + "')",
                                         "invalid_request_error", "model_not_found", "model"));
        res.set_content(dump_json(model_json(options_.model_name, options_.created)), "application/json");
    });
    s.Post("/v1/chat/completions",
           [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
               generation(req, res, reader, RequestKind::chat_completions);
           });
    s.Post("/v1/completions",
           [this](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
               generation(req, res, reader, RequestKind::completions);
           });
}

void ApiServer::generation(const httplib::Request&, httplib::Response& res, const httplib::ContentReader& reader,
                           RequestKind kind) {
    InFlight counted(in_flight_);   // from here on, a drain waits for this answer
    std::string body;
    bool too_large = false;
    const bool read = reader([&](const char* data, size_t n) {
        // Bounded here too: a chunked or compressed body has no Content-Length for httplib to check.
        if (body.size() + n > options_.max_body_bytes) {
            too_large = true;
            return false;
        }
        body.append(data, n);
        return true;
    });
    if (too_large || res.status == 413) {
        res.set_header("Connection", "close");
        return send_error(res, error(413,
                                     "the request body is larger than " + std::to_string(options_.max_body_bytes) +
                                         " bytes (--max-body)",
                                     "invalid_request_error", "request_too_large"));
    }
    if (!read) {
        res.set_header("Connection", "close");
        return send_error(res, error(400, "could not read the request body", "invalid_request_error", "invalid_body"));
    }
    if (draining_)
        return send_error(res, error(503, "the server is shutting down and takes no new requests", "server_error",
                                     "shutting_down"));

    try {
        const json j = parse_request_json(body);
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
        ex->header.id = std::string(ex->chat ? "chatcmpl-" : "cmpl-") + id_tag_ + "-" + std::to_string(next_response_id_++);
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
        if (br.special_text && ex->stream)   // on the engine thread only: on_text and on_done
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
            } else if (ex->stream) {   // a whole answer is written from the result: nothing to wake it for
                {
                    std::lock_guard<std::mutex> lock(ex->mutex);
                    ex->pending.append(piece);
                }
                ex->cv.notify_all();
            }
            return !ex->abandoned.load();
        };
        br.on_done = [ex](BatchResult r) {
            if (ex->channels) ex->channels->finish();   // what it held back as a possible marker
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
                res.set_header("Retry-After", "1");
                return send_error(res, error(429, sub.message, "rate_limit_error", "queue_full"));
            }
            if (sub.refused == BatchError::shutting_down)
                return send_error(res, error(503, sub.message, "server_error", "shutting_down"));
            return send_error(res, error(400, sub.message, "invalid_request_error", "invalid_request"));
        }
        ex->id = sub.id;
        counted.hand_over();   // answer()'s releaser counts it down
        answer(ex, res);
    } catch (const ApiException& e) {
        send_error(res, e.error());
    }
}

void ApiServer::answer(const std::shared_ptr<Exchange>& ex, httplib::Response& res) {
    BatchEngine* engine = &engine_;
    std::atomic<int64_t>* in_flight = &in_flight_;
    // Runs once the answer is written or abandoned (httplib calls it when the response dies): a request
    // still in the engine then belongs to a client that is gone.
    const auto release = [ex, engine, in_flight](bool) {
        bool finished = false;
        {
            std::lock_guard<std::mutex> lock(ex->mutex);
            finished = ex->finished;
        }
        if (!finished) {
            ex->abandoned = true;
            engine->cancel(ex->id);
        }
        --*in_flight;
    };
    auto started = std::make_shared<bool>(false);
    const Tokenizer* tokenizer = &prompts_.tokenizer();   // read only, and it outlives every exchange
    const auto provide = [ex, engine, started, tokenizer](size_t, httplib::DataSink& sink) -> bool {
        const auto give_up = [&] {
            ex->abandoned = true;
            engine->cancel(ex->id);   // not under ex->mutex: a waiting request's on_done runs right here
            return false;
        };
        const auto write = [&](const std::string& bytes) { return bytes.empty() || sink.write(bytes.data(), bytes.size()); };
        if (!*started) {
            *started = true;
            if (ex->stream) {
                std::string first;
                if (ex->chat)
                    first = sse_event(chat_role_chunk(ex->header));
                else if (!ex->echo.empty())
                    first = sse_event(completion_chunk(ex->header, ex->echo));
                if (!write(first)) return give_up();
            }
            return true;
        }
        std::string text, reasoning;
        std::optional<BatchResult> done;
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
        if (ex->stream && !reasoning.empty())   // a reply's reasoning comes before its answer
            if (!write(sse_event(chat_reasoning_chunk(ex->header, reasoning)))) return give_up();
        if (ex->stream && !text.empty()) {
            const json chunk = ex->chat ? chat_content_chunk(ex->header, text) : completion_chunk(ex->header, text);
            if (!write(sse_event(chunk))) return give_up();
        }
        if (!done) {
            // Nothing new: is anyone still listening? (A closed socket reads as end of file.)
            if (text.empty() && reasoning.empty() && !sink.is_writable()) return give_up();
            return true;
        }

        std::optional<ApiError> failure;
        if (!done->ok())
            failure = error(500, "generation failed: " + done->message, "server_error", "engine_failure");
        else if (done->stop_reason == StopReason::cancelled)
            failure = error(503, "the request was cancelled: the server is shutting down", "server_error", "cancelled");
        std::string out;
        if (ex->stream) {
            if (failure) {
                out = sse_event(failure->body());
            } else {
                out = sse_event(ex->chat ? chat_finish_chunk(ex->header, done->stop_reason)
                                         : completion_finish_chunk(ex->header, done->stop_reason));
                if (ex->include_usage) out += sse_event(usage_chunk(ex->header, ex->chat, done->n_prompt, done->n_gen()));
            }
            out += kSseDone;
        } else if (failure) {
            out = dump_json(failure->body());
        } else {
            json logprobs = nullptr;
            if (ex->logprobs) {
                const TokenText text = [tokenizer](int32_t id) { return tokenizer->token_to_piece(id); };
                logprobs = ex->chat ? chat_logprobs_json(done->logprobs, text)
                                    : completion_logprobs_json(done->logprobs, text, ex->echo.size());
            }
            std::optional<SplitReply> split;
            if (ex->in_channels) split = split_reply_channels(done->text);
            out = dump_json(ex->chat ? chat_completion_json(ex->header, *done, logprobs, split ? &*split : nullptr)
                                     : text_completion_json(ex->header, *done, ex->echo + done->text, logprobs));
        }
        if (!write(out)) return false;
        sink.done();
        return true;
    };
    res.status = 200;
    if (ex->stream) {
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider("text/event-stream", provide, release);
    } else {
        res.set_chunked_content_provider("application/json", provide, release);
    }
}

int ApiServer::bind() {
    errno = 0;
    int port = options_.port;
    bool ok = false;
    if (port == 0) {
        port = server_->bind_to_any_port(options_.host);
        ok = port > 0;
    } else {
        ok = server_->bind_to_port(options_.host, port);
    }
    if (!ok) {
        const int err = errno;
        std::string why = err ? std::strerror(err) : "the address cannot be resolved or bound";
        throw UsageError("--host/--port: cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                         " (" + why + "; is another server using the port? --port 0 picks a free one)");
    }
    server_->widen_backlog(4096);
    options_.port = port;
    return port;
}

void ApiServer::start() {
    listener_ = std::thread([this] {
        server_->listen_after_bind();
        listener_ended_ = true;
    });
}

void ApiServer::begin_drain() { draining_ = true; }

void ApiServer::stop() {
    stopping_ = true;
    if (listener_.joinable()) {
        // httplib's stop() does nothing before the loop has begun: wait for it (or for its end).
        while (!server_->is_running() && !listener_ended_) std::this_thread::sleep_for(1ms);
        server_->stop();
        listener_.join();
    }
}

} // namespace tern::app
