#include "app/serve/http_server.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <new>

#include "app/serve/http_socket.h"

namespace tern::app {

namespace {

using namespace std::chrono_literals;

// A graceful close reads and drops what the client still sends, so that its kernel does not answer our
// close with a reset that would throw away the answer it has not read yet; bounded in bytes and time
// because that client may be an attacker with a lot to send.
constexpr size_t kLingerBytes = 64 * 1024;
constexpr auto kLingerTime = 1s;
// How long accept() rests when the process is out of file descriptors (EMFILE): the listening socket stays
// readable meanwhile, and a level-triggered loop would spin on it.
constexpr auto kAcceptPause = 100ms;
// One read of a socket: heads are at most 32 KiB, and a body is read in pieces of this size.
constexpr size_t kReadSize = 16 * 1024;
constexpr int kEpollBatch = 64;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

SteadyClock::time_point now() {
    return SteadyClock::now();
}

// A small answer written by the reception thread without waiting: a fresh or idle socket's send buffer
// has room for it, and a client that left none gets no answer rather than a thread.
void send_now(int fd, std::string_view bytes) {
    (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Enough descriptors for the connections allowed: the soft limit is often 1024, below 512 open
// connections plus lingering ones plus the model's files.
void raise_fd_limit(size_t want) {
    rlimit r = {};
    if (::getrlimit(RLIMIT_NOFILE, &r) != 0 || r.rlim_cur >= want) return;
    r.rlim_cur = r.rlim_max == RLIM_INFINITY ? want : std::min<rlim_t>(r.rlim_max, want);
    ::setrlimit(RLIMIT_NOFILE, &r);
}

} // namespace

struct HttpServer::Connection {
    Connection(int fd, HttpLimits limits, std::atomic<size_t>* open) : fd(fd), parser(limits), open(open) {
        if (open) ++*open;
    }
    ~Connection() {
        ::close(fd);
        if (open) --*open;
    }
    Connection(const Connection&) = delete;
    Connection& operator=(const Connection&) = delete;

    int fd;
    HeadParser parser;
    std::string pending; // read beyond the head being parsed: a body's first bytes, pipelined requests
    bool lingering = false;
    size_t discarded = 0;
    SteadyClock::time_point deadline{};
    std::atomic<size_t>* open; // counts this connection toward max_open (null: a refused one)
};

// ---------------------------------------------------------------------------------------------------
// HttpResponder

HttpResponder::HttpResponder(int fd, const RequestHead& head, bool must_close, const HttpServer& server)
    : fd_(fd), head_only_(head.method == "HEAD"), http10_(head.minor_version == 0),
      keep_alive_(head.keep_alive && !must_close), server_(server) {}

bool HttpResponder::put(std::string_view bytes) {
    if (broken_) return false;
    if (!send_all(fd_, bytes, server_.options_.write_timeout)) broken_ = true;
    return !broken_;
}

ConnectionAfter HttpResponder::begin(int status) {
    started_ = true;
    if (server_.on_response_) server_.on_response_(status);
    closes_ = !keep_alive_ || server_.draining_;
    if (closes_) return ConnectionAfter::close;
    return http10_ ? ConnectionAfter::keep_alive_http10 : ConnectionAfter::keep_alive;
}

bool HttpResponder::send(const HttpReply& reply) {
    if (started_) return false;
    const ConnectionAfter after = begin(reply.status);
    std::string out = response_head(reply.status, reply.content_type, reply.headers, reply.body.size(), false, after);
    if (!head_only_) out += reply.body;
    return put(out);
}

bool HttpResponder::start_stream(int status, std::string_view content_type, const std::vector<HttpHeader>& headers) {
    if (started_) return false;
    if (http10_) keep_alive_ = false; // no chunked coding in HTTP/1.0: the end of the body is the end of the connection
    const ConnectionAfter after = begin(status);
    streaming_ = true;
    chunked_ = !http10_ && !head_only_;
    return put(response_head(status, content_type, headers, std::nullopt, chunked_, after));
}

bool HttpResponder::write(std::string_view bytes) {
    if (!streaming_ || bytes.empty()) return !broken_;
    if (head_only_) return true;
    return put(chunked_ ? chunk(bytes) : std::string(bytes));
}

bool HttpResponder::finish() {
    if (!streaming_) return !broken_;
    streaming_ = false;
    return chunked_ ? put(kLastChunk) : !broken_;
}

bool HttpResponder::client_gone() const {
    return broken_ || peer_gone(fd_);
}

// ---------------------------------------------------------------------------------------------------
// Setup and teardown

HttpServer::HttpServer(HttpServerOptions options, HttpHandlers handlers)
    : options_(std::move(options)), handlers_(std::move(handlers)), on_response_(handlers_.on_response) {
    options_.workers = std::max<size_t>(options_.workers, 1);
    options_.max_open = std::max<size_t>(options_.max_open, 1);
}

HttpServer::~HttpServer() {
    stop();
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
}

int HttpServer::listen(const std::string& host, int port, std::string& why) {
    // The kernel caps the backlog at net.core.somaxconn; a long one lets a burst of clients wait in the
    // kernel instead of retrying for seconds.
    constexpr int kBacklog = 4096;
    listen_fd_ = listen_socket(host, port, kBacklog, why);
    if (listen_fd_ < 0) return -1;
    // Refused and lingering connections, the workers' and the process's own files on top of max_open.
    raise_fd_limit(2 * options_.max_open + options_.workers + 256);
    return port;
}

void HttpServer::start() {
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = wake_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    ev.data.fd = listen_fd_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    for (size_t i = 0; i < options_.workers; ++i)
        workers_.emplace_back([this] { work(); });
    reception_ = std::thread([this] { reception(); });
}

void HttpServer::wake() {
    if (wake_fd_ < 0) return;
    const uint64_t one = 1;
    (void)::write(wake_fd_, &one, sizeof one);
}

void HttpServer::begin_drain() {
    draining_ = true;
    wake();
}

void HttpServer::stop() {
    if (stopping_.exchange(true)) return;
    draining_ = true;
    wake();
    if (reception_.joinable()) reception_.join();
    {
        std::lock_guard<std::mutex> lock(mutex_);
        for (int fd : serving_)
            ::shutdown(fd, SHUT_RDWR); // a worker's blocked read or write returns
    }
    ready_cv_.notify_all();
    for (std::thread& t : workers_)
        t.join();
    workers_.clear();
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.clear();
    returned_.clear();
}

HttpReply HttpServer::error_reply(const HttpError& e) const {
    HttpReply r;
    if (handlers_.error_reply) {
        r = handlers_.error_reply(e);
    } else {
        r.content_type = "text/plain";
        r.body = e.message + "\n";
    }
    r.status = e.status;
    if (e.status == 503 && std::none_of(r.headers.begin(), r.headers.end(),
                                        [](const HttpHeader& h) { return same_field_name(h.name, "Retry-After"); }))
        r.headers.push_back({"Retry-After", "1"});
    return r;
}

// ---------------------------------------------------------------------------------------------------
// The reception thread

void HttpServer::reception() {
    epoll_event events[kEpollBatch];
    while (!stopping_) {
        const int n = ::epoll_wait(epoll_fd_, events, kEpollBatch, next_wait_ms());
        if (n < 0 && errno != EINTR) {
            failed_ = true;
            break;
        }
        for (int i = 0; i < n; ++i) {
            const int fd = events[i].data.fd;
            if (fd == wake_fd_) {
                uint64_t count;
                (void)::read(wake_fd_, &count, sizeof count);
            } else if (fd == listen_fd_) {
                accept_all();
            } else if (auto it = owned_.find(fd); it != owned_.end()) {
                on_readable(*it->second);
            }
        }
        take_returned();
        if (draining_ && !drained_) {
            drained_ = true;
            ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
            ::close(listen_fd_);
            listen_fd_ = -1;
            std::vector<int> idle; // no request in progress: idle, or a head still arriving
            for (const auto& [fd, c] : owned_)
                if (!c->lingering) idle.push_back(fd);
            for (int fd : idle)
                close_owned(fd);
        }
        expire(now());
    }
    while (!owned_.empty())
        close_owned(owned_.begin()->first);
    std::lock_guard<std::mutex> lock(mutex_);
    returned_.clear();
}

int HttpServer::next_wait_ms() const {
    std::optional<SteadyClock::time_point> next;
    if (!deadlines_.empty()) next = deadlines_.begin()->first;
    if (accept_paused_until_ && (!next || *accept_paused_until_ < *next)) next = accept_paused_until_;
    if (!next) return -1;
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(*next - now()).count();
    return static_cast<int>(std::clamp<long long>(ms, 0, 60'000));
}

void HttpServer::accept_all() {
    for (;;) {
        const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
                accept_paused_until_ = now() + kAcceptPause;
            }
            return; // EAGAIN: all taken
        }
        prepare_accepted(fd);
        if (draining_) {
            ::close(fd);
            continue;
        }
        const bool over = open_.load() >= options_.max_open;
        auto c = std::make_unique<Connection>(fd, options_.limits, over ? nullptr : &open_);
        adopt(std::move(c));
        if (over) {
            ++refused_;
            answer_and_linger(
                fd, {503, "too many connections: " + std::to_string(options_.max_open) + " are open; try again"});
        } else {
            set_deadline(*owned_.at(fd), now() + options_.idle_timeout);
        }
    }
}

void HttpServer::adopt(ConnectionPtr c) {
    const int fd = c->fd;
    epoll_event ev = {};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    owned_[fd] = std::move(c);
}

void HttpServer::set_deadline(Connection& c, SteadyClock::time_point when) {
    deadlines_.erase({c.deadline, c.fd});
    c.deadline = when;
    deadlines_.insert({when, c.fd});
}

void HttpServer::close_owned(int fd) {
    auto it = owned_.find(fd);
    if (it == owned_.end()) return;
    deadlines_.erase({it->second->deadline, fd});
    if (it->second->lingering) --lingering_;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
    owned_.erase(it); // closes the socket
}

void HttpServer::on_readable(Connection& c) {
    char buf[kReadSize];
    const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) return close_owned(c.fd); // the client left (or the socket failed): nobody to answer
    if (c.lingering) {
        c.discarded += static_cast<size_t>(n);
        if (c.discarded > kLingerBytes) close_owned(c.fd);
        return;
    }
    took_head_bytes(c, std::string_view(buf, static_cast<size_t>(n)));
}

void HttpServer::took_head_bytes(Connection& c, std::string_view bytes) {
    const bool was_started = c.parser.started();
    const size_t used = c.parser.feed(bytes);
    switch (c.parser.state()) {
    case ParseState::need_more:
        if (!was_started && c.parser.started()) set_deadline(c, now() + options_.head_timeout);
        return;
    case ParseState::failed:
        return answer_and_linger(c.fd, c.parser.error());
    case ParseState::complete:
        c.pending.assign(bytes.substr(used));
        return dispatch(c.fd);
    }
}

void HttpServer::dispatch(int fd) {
    if (draining_) return close_owned(fd);
    auto it = owned_.find(fd);
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (ready_.size() < options_.queue) {
            deadlines_.erase({it->second->deadline, fd});
            ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
            ready_.push_back(std::move(it->second));
            owned_.erase(it);
            ready_cv_.notify_one();
            return;
        }
    }
    ++refused_;
    answer_and_linger(fd, {503, "too many requests: " + std::to_string(options_.workers) + " are being answered and " +
                                    std::to_string(options_.queue) + " wait; try again"});
}

void HttpServer::answer_and_linger(int fd, const HttpError& error) {
    Connection& c = *owned_.at(fd);
    const HttpReply r = error_reply(error);
    if (on_response_) on_response_(r.status);
    send_now(fd,
             response_head(r.status, r.content_type, r.headers, r.body.size(), false, ConnectionAfter::close) + r.body);
    linger(c);
}

void HttpServer::linger(Connection& c) {
    if (c.lingering) return;
    // Never more lingering sockets than open ones may be: past that, a flood of refused clients gets plain closes.
    if (lingering_ >= options_.max_open) return close_owned(c.fd);
    ::shutdown(c.fd, SHUT_WR);
    c.lingering = true;
    c.pending.clear();
    c.pending.shrink_to_fit();
    c.parser.reset();
    ++lingering_;
    set_deadline(c, now() + kLingerTime);
}

void HttpServer::expire(SteadyClock::time_point t) {
    if (accept_paused_until_ && *accept_paused_until_ <= t) {
        accept_paused_until_.reset();
        if (listen_fd_ >= 0) {
            epoll_event ev = {};
            ev.events = EPOLLIN;
            ev.data.fd = listen_fd_;
            ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
        }
    }
    while (!deadlines_.empty() && deadlines_.begin()->first <= t) {
        const int fd = deadlines_.begin()->second;
        Connection& c = *owned_.at(fd);
        if (c.lingering || !c.parser.started()) {
            close_owned(fd); // done lingering, or idle: nothing to answer
        } else {
            const auto secs = std::chrono::duration_cast<std::chrono::seconds>(options_.head_timeout).count();
            answer_and_linger(fd, {408, "the request head did not arrive within " + std::to_string(secs) + " s"});
        }
    }
}

void HttpServer::take_returned() {
    std::vector<std::pair<ConnectionPtr, After>> back;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        back.swap(returned_);
    }
    for (auto& [c, after] : back) {
        Connection& conn = *c;
        if (draining_ && after == After::resume) continue; // dropped: closes it
        const bool started = conn.parser.started();
        adopt(std::move(c));
        if (after == After::close_gracefully) {
            linger(conn);
        } else {
            set_deadline(conn, now() + (started ? options_.head_timeout : options_.idle_timeout));
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Workers

void HttpServer::work() {
    for (;;) {
        ConnectionPtr c;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            ready_cv_.wait(lock, [&] { return !ready_.empty() || stopping_; });
            if (stopping_) return;
            c = std::move(ready_.front());
            ready_.pop_front();
            serving_.insert(c->fd);
        }
        After after = After::close_now;
        try {
            after = serve_connection(*c);
        } catch (...) { // out of memory building an answer: this connection ends, the server goes on
        }
        std::lock_guard<std::mutex> lock(mutex_);
        serving_.erase(c->fd);
        if (after == After::close_now || stopping_) {
            c.reset();
        } else {
            returned_.emplace_back(std::move(c), after);
            wake();
        }
    }
}

HttpServer::After HttpServer::serve_connection(Connection& c) {
    for (;;) {
        HttpRequest req;
        req.head = std::move(c.parser.head());
        req.path = req.head.path();
        const After after = serve_request(c, req);
        if (after != After::resume || draining_) return after == After::close_now ? after : After::close_gracefully;
        // Next request: one already read (pipelined) is answered here, in order.
        c.parser.reset();
        const size_t used = c.parser.feed(c.pending);
        c.pending.erase(0, used);
        switch (c.parser.state()) {
        case ParseState::need_more:
            return After::resume; // the reception thread reads the rest
        case ParseState::failed: {
            const HttpReply r = error_reply(c.parser.error());
            HttpResponder out(c.fd, RequestHead{}, true, *this);
            out.send(r);
            return After::close_gracefully;
        }
        case ParseState::complete:
            continue;
        }
    }
}

HttpServer::After HttpServer::serve_request(Connection& c, HttpRequest& req) {
    const bool has_body = req.head.framing != BodyFraming::none;
    if (handlers_.screen) {
        if (std::optional<HttpReply> early = handlers_.screen(req)) {
            // Its body is not read, so the connection cannot go on.
            HttpResponder out(c.fd, req.head, has_body, *this);
            if (!out.send(*early)) return After::close_now;
            return has_body ? After::close_gracefully : After::resume;
        }
    }
    BodyDecoder body(req.head, options_.max_body_bytes, options_.limits);
    if (has_body && body.state() != ParseState::failed) {
        if (req.head.expect_continue && c.pending.empty() && !send_all(c.fd, kContinue, options_.write_timeout))
            return After::close_now;
        if (const After a = read_body(c, req, body); a != After::resume) return a; // gone, or timed out
    }
    if (body.state() == ParseState::failed) {
        HttpResponder out(c.fd, req.head, true, *this);
        out.send(error_reply(body.error()));
        return After::close_gracefully;
    }

    HttpResponder out(c.fd, req.head, false, *this);
    try {
        handlers_.serve(req, out);
    } catch (const std::exception& e) {
        if (out.started()) return After::close_now;
        const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
        out.send(error_reply(
            {500, "internal error: " + (oom ? std::string("out of memory") : std::string(e.what()).substr(0, 200))}));
    }
    if (!out.started()) out.send(error_reply({500, "internal error: the request got no answer"}));
    if (out.broken_) return After::close_now;
    if (out.streaming_) return After::close_now; // a stream left unfinished cannot be followed by anything
    return out.closes_ ? After::close_gracefully : After::resume;
}

HttpServer::After HttpServer::read_body(Connection& c, HttpRequest& req, BodyDecoder& body) {
    size_t used = body.feed(c.pending, req.body);
    c.pending.erase(0, used);
    const auto whole_deadline = now() + options_.body_timeout;
    char buf[kReadSize];
    while (body.state() == ParseState::need_more) {
        const auto deadline = std::min(whole_deadline, now() + options_.body_stall_timeout);
        const long n = recv_some(c.fd, buf, sizeof buf, deadline);
        if (n == 0 || n == -1) return After::close_now; // the client left, or the socket failed
        if (n == kRecvTimedOut) {
            HttpResponder out(c.fd, req.head, true, *this);
            out.send(error_reply({408, "the request body did not arrive in time"}));
            return After::close_gracefully;
        }
        const std::string_view got(buf, static_cast<size_t>(n));
        used = body.feed(got, req.body);
        c.pending.append(got.substr(used));
    }
    return After::resume;
}

} // namespace tern::app
