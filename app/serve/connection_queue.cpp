#include "app/serve/connection_queue.h"

#include <algorithm>

namespace tern::app {

namespace {
thread_local bool t_refusing = false;
} // namespace

ConnectionQueue::ConnectionQueue(size_t workers, size_t backlog, std::atomic<uint64_t>* refused)
    : backlog_(backlog), refused_(refused) {
    workers = std::max<size_t>(workers, 1);
    threads_.reserve(workers + 1);
    for (size_t i = 0; i < workers; ++i) threads_.emplace_back([this] { work(false); });
    threads_.emplace_back([this] { work(true); });
}

ConnectionQueue::~ConnectionQueue() { shutdown(); }

bool ConnectionQueue::refusing_here() { return t_refusing; }

void ConnectionQueue::enqueue(std::function<void()> fn) {
    bool overflow = false;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        overflow = jobs_.size() >= backlog_;
        if (!overflow) {
            jobs_.push_back(std::move(fn));
        } else {
            overflow_.push_back(std::move(fn));
            if (refused_) ++*refused_;
        }
    }
    (overflow ? overflow_ready_ : job_ready_).notify_one();
}

void ConnectionQueue::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (shutdown_ && threads_.empty()) return;
        shutdown_ = true;
    }
    job_ready_.notify_all();
    overflow_ready_.notify_all();
    for (std::thread& t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
}

void ConnectionQueue::work(bool refuser) {
    t_refusing = refuser;
    std::deque<std::function<void()>>& queue = refuser ? overflow_ : jobs_;
    std::condition_variable& ready = refuser ? overflow_ready_ : job_ready_;
    for (;;) {
        std::function<void()> fn;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            ready.wait(lock, [&] { return !queue.empty() || shutdown_; });
            if (queue.empty()) return;   // shut down with nothing left
            fn = std::move(queue.front());
            queue.pop_front();
        }
        fn();   // httplib's job: serve the connection, then close it
    }
}

} // namespace tern::app
