#pragma once
// The HTTP/1.1 server under `tern serve` (api_server.h): POSIX sockets, one epoll thread, a pool of
// workers. Written for clients that are slow, flooding or crafted as much as for well-behaved ones.
//
// Threads
//   reception (one, epoll)  accepts, and owns every connection with no request in progress: new ones,
//                           idle keep-alive ones, and those whose head is still arriving. It reads heads
//                           without blocking into the connection's parser (http_request.h), and hands a
//                           connection to the workers only once its head is complete and valid.
//   workers (`workers`)     read the body, call the handler, write the answer, then serve a pipelined
//                           next request already read (answers in order) or give the connection back.
//
// Limits, and what a client meets beyond them
//   head            request line 8 KiB (414), 100 fields or 32 KiB in all (431), malformed (400),
//                   checked byte by byte as it arrives: nothing larger is held
//   head deadline   10 s from a head's first byte to its end (408): 1 byte a second never gets in
//   idle            a connection with no request begun (new, or kept alive) is closed after 5 s
//   body            max_body_bytes (413, before reading when Content-Length says so); 10 s without a
//                   byte or 60 s in all (408)
//   writes          a client that takes nothing of an answer for 10 s is gone (its request cancelled)
//   waiting         `queue` complete requests wait for a worker; beyond that 503 with Retry-After,
//                   answered by the reception thread at once
//   open            `max_open` connections in all (default 4 x workers: served, waiting and as many
//                   again reading heads or idle); beyond that accept() is answered 503 at once and
//                   closed, the request never read
// An error the server answers itself closes the connection (one "Connection: close"); so does an
// answer sent before a body was read. Closing after an answer is graceful: the write side is shut,
// and up to 64 KiB of what the client still sends is read and dropped for up to 1 s, so the client
// reads the answer rather than a reset.
//
// Drain: begin_drain() stops accepting and closes at once every connection with no request in
// progress (idle, or a head still arriving); requests in progress finish, their connection closed
// after the answer. stop() ends everything and joins the threads.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "app/serve/http_request.h"
#include "app/serve/http_response.h"

namespace tern::app {

struct HttpServerOptions {
    size_t workers = 128;  // requests answered at once (`tern serve --max-connections`)
    size_t queue = 128;    // complete requests waiting for a worker
    size_t max_open = 512; // open connections in all
    uint64_t max_body_bytes = uint64_t{8} << 20;
    HttpLimits limits;
    std::chrono::milliseconds head_timeout{10'000};
    std::chrono::milliseconds idle_timeout{5'000};
    std::chrono::milliseconds body_stall_timeout{10'000};
    std::chrono::milliseconds body_timeout{60'000};
    std::chrono::milliseconds write_timeout{10'000};
};

class HttpServer;

// A request as a handler sees it.
struct HttpRequest {
    RequestHead head;
    std::string path; // head.path(): the target without its query, percent-decoded
    std::string body; // empty in HttpHandlers::screen (not read yet)

    const std::string* header(std::string_view name) const { return head.header(name); }
};

// How a handler answers, on its worker thread: one whole answer (send), or a streamed one
// (start_stream, write..., finish). Every call returns false once the client is gone or stopped
// reading; the connection is then closed.
class HttpResponder {
public:
    bool send(const HttpReply& reply);
    // Chunked (an HTTP/1.0 client: the body ends when the connection closes).
    bool start_stream(int status, std::string_view content_type, const std::vector<HttpHeader>& headers = {});
    bool write(std::string_view bytes);
    bool finish();

    // Whether the client hung up, cheaply and without reading: a pipelined request waiting is not gone.
    bool client_gone() const;
    bool started() const { return started_; }

private:
    friend class HttpServer;
    HttpResponder(int fd, const RequestHead& head, bool must_close, const HttpServer& server);
    bool put(std::string_view bytes);
    ConnectionAfter begin(int status);

    int fd_;
    bool head_only_; // HEAD: the fields but no body
    bool http10_;
    bool keep_alive_;          // what the request asked for, and nothing forbids
    const HttpServer& server_; // its write timeout, whether it drains (then the answer closes), its counters
    bool started_ = false;
    bool streaming_ = false;
    bool chunked_ = false;
    bool closes_ = true;  // the answer said "Connection: close" (or ends with the connection)
    bool broken_ = false; // a write failed
};

struct HttpHandlers {
    // With the head only, before the body is read: an answer that ends the request instead (401, 404),
    // or none to read the body and call serve. Runs before any 100 Continue is sent.
    std::function<std::optional<HttpReply>(const HttpRequest&)> screen;
    // With the body read: answers through the responder (nothing answered: 500).
    std::function<void(const HttpRequest&, HttpResponder&)> serve;
    // The answer to an error the server finds itself (400, 408, 413, 414, 417, 431, 501, 503, 505).
    std::function<HttpReply(const HttpError&)> error_reply;
    // Each answer's status as its head is written (for counters); may be empty.
    std::function<void(int status)> on_response;
};

class HttpServer {
public:
    HttpServer(HttpServerOptions options, HttpHandlers handlers);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Listens on host:port (IPv4 or IPv6; 0: any free port) and returns the port, or -1 with `why`.
    int listen(const std::string& host, int port, std::string& why);
    // Starts the reception thread and the workers.
    void start();
    void begin_drain();
    // Closes every connection, joins every thread. A handler still running sees its writes fail.
    void stop();
    // The reception loop ended by itself (epoll failed): nothing is accepted any more.
    bool failed() const { return failed_.load(); }
    // Connections answered 503 at once: over max_open, or every worker busy and the queue full.
    uint64_t connections_refused() const { return refused_.load(); }
    size_t open_connections() const { return open_.load(); }

private:
    friend class HttpResponder;
    struct Connection;
    using ConnectionPtr = std::unique_ptr<Connection>;
    enum class After { resume, close_gracefully, close_now };

    // Reception thread.
    void reception();
    void accept_all();
    void on_readable(Connection& c);
    void took_head_bytes(Connection& c, std::string_view bytes);
    void dispatch(int fd);
    void answer_and_linger(int fd, const HttpError& error);
    void linger(Connection& c);
    void adopt(ConnectionPtr c);
    void set_deadline(Connection& c, std::chrono::steady_clock::time_point when);
    void close_owned(int fd);
    void expire(std::chrono::steady_clock::time_point now);
    void take_returned();
    int next_wait_ms() const;
    void wake();

    // Workers.
    void work();
    After serve_connection(Connection& c);
    After serve_request(Connection& c, HttpRequest& req);
    After read_body(Connection& c, HttpRequest& req, BodyDecoder& body);
    HttpReply error_reply(const HttpError& e) const;

    HttpServerOptions options_;
    HttpHandlers handlers_;
    std::function<void(int)> on_response_;
    int listen_fd_ = -1;
    int epoll_fd_ = -1;
    int wake_fd_ = -1;
    std::thread reception_;
    std::vector<std::thread> workers_;
    std::atomic<bool> draining_{false};
    std::atomic<bool> stopping_{false};
    std::atomic<bool> failed_{false};
    std::atomic<uint64_t> refused_{0};
    std::atomic<size_t> open_{0};

    // The reception thread's own.
    std::unordered_map<int, ConnectionPtr> owned_;
    std::set<std::pair<std::chrono::steady_clock::time_point, int>> deadlines_;
    size_t lingering_ = 0;
    bool drained_ = false; // begin_drain's closing done
    std::optional<std::chrono::steady_clock::time_point> accept_paused_until_;

    // Shared with the workers.
    std::mutex mutex_;
    std::condition_variable ready_cv_;
    std::deque<ConnectionPtr> ready_;                       // complete heads waiting for a worker
    std::vector<std::pair<ConnectionPtr, After>> returned_; // from the workers to the reception thread
    std::unordered_set<int> serving_;                       // the workers' sockets (stop() shuts them)
};

} // namespace tern::app
