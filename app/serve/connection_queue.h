#pragma once
// The HTTP server's workers (an httplib TaskQueue): `workers` threads serve connections, up to
// `backlog` more accepted connections wait for one, and beyond that a connection is not left to pile
// up: one extra thread reads its request and answers 503 at once (the server's pre-routing handler
// asks refusing_here()). So 1000 clients at once cost at most workers + backlog threads' worth of
// waiting, never an unbounded queue, and every client gets an answer.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <httplib.h>

namespace tern::app {

class ConnectionQueue : public httplib::TaskQueue {
public:
    // `refused` (may be null) counts the connections answered 503 at once.
    ConnectionQueue(size_t workers, size_t backlog, std::atomic<uint64_t>* refused = nullptr);
    ~ConnectionQueue() override;

    void enqueue(std::function<void()> fn) override;
    // Serves what was queued, then joins every thread (httplib calls it when listening ends).
    void shutdown() override;

    // True on the thread that answers the connections beyond the backlog.
    static bool refusing_here();

private:
    void work(bool refuser);

    std::mutex mutex_;
    std::condition_variable job_ready_;        // one worker wakes per connection
    std::condition_variable overflow_ready_;
    std::deque<std::function<void()>> jobs_;      // served by the workers
    std::deque<std::function<void()>> overflow_;  // answered 503 by the refuser
    size_t backlog_;
    bool shutdown_ = false;
    std::vector<std::thread> threads_;
    std::atomic<uint64_t>* refused_;
};

} // namespace tern::app
