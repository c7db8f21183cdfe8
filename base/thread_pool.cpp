// The forward pass's thread pool (thread_pool.h).
#include "base/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace tern {
namespace {

// Set while a thread runs a slot (or posts a job): a parallel call from there runs serially.
thread_local bool t_in_job = false;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// Polls done() for up to spin_ns; true as soon as it holds. The clock is read every 64 polls (a pause is
// 10-150 cycles depending on the core, so a fixed count would mean very different times).
template <class Done> bool spin_until(Done done, int64_t spin_ns) {
    if (done()) return true;
    if (spin_ns <= 0) return false;
    const int64_t deadline = now_ns() + spin_ns;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            cpu_relax();
            if (done()) return true;
        }
        if (now_ns() >= deadline) return false;
    }
}

constexpr uint64_t pack_claim(uint32_t epoch, uint32_t slot) { return (static_cast<uint64_t>(epoch) << 32) | slot; }

} // namespace

ThreadPool::ThreadPool(int64_t spin_ns) : spin_ns_(std::max<int64_t>(0, spin_ns)) {}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(post_mutex_);
        stop_.store(true, std::memory_order_seq_cst);
        epoch_.fetch_add(1, std::memory_order_seq_cst);
    }
    epoch_.notify_all();
    for (std::thread& w : workers_) w.join();
}

ThreadPool& ThreadPool::shared() {
    // Never destroyed: workers asleep in the kernel at exit cost nothing, and joining them from a static
    // destructor would race other static destructors that may still post work.
    static ThreadPool* const pool = new ThreadPool();
    return *pool;
}

void ThreadPool::start_workers(int wanted) {
    wanted = std::min(wanted, kMaxWorkers);
    const uint32_t epoch = epoch_.load(std::memory_order_relaxed);   // post_mutex_ held: no job is being posted
    while (static_cast<int>(workers_.size()) < wanted) {
        try {
            workers_.emplace_back([this, epoch] { worker_main(epoch); });
        } catch (const std::system_error&) {
            break;   // out of threads: the ones there are (and the caller) claim every slot
        }
    }
}

void ThreadPool::worker_main(uint32_t epoch_seen) {
    t_in_job = true;   // a worker only ever runs slots: anything parallel inside them runs inline
    for (;;) {
        auto posted = [&] { return epoch_.load(std::memory_order_acquire) != epoch_seen; };
        if (!spin_until(posted, spin_ns_)) {
            // Sleep. The counter is raised before the epoch is read again, and the poster publishes the
            // epoch before it reads the counter (both seq_cst), so one of the two sees the other.
            sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
            while (epoch_.load(std::memory_order_seq_cst) == epoch_seen) epoch_.wait(epoch_seen, std::memory_order_seq_cst);
            sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
        }
        if (stop_.load(std::memory_order_acquire)) return;
        epoch_seen = epoch_.load(std::memory_order_acquire);
        take_slots(epoch_seen);
    }
}

void ThreadPool::take_slots(uint32_t epoch) {
    const SlotFn fn = fn_.load(std::memory_order_relaxed);
    void* const ctx = ctx_.load(std::memory_order_relaxed);
    const uint32_t n = static_cast<uint32_t>(n_slots_.load(std::memory_order_relaxed));
    uint64_t c = claim_.load(std::memory_order_acquire);
    for (;;) {
        // The CAS fails unless claim_ still holds this job's epoch, so fn, ctx and n read above belong to
        // the slot claimed (a later job is posted only after every slot of this one has returned).
        if (static_cast<uint32_t>(c >> 32) != epoch || static_cast<uint32_t>(c) >= n) return;
        if (!claim_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
        try {
            fn(ctx, static_cast<int>(static_cast<uint32_t>(c)));
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex_);
            if (!error_) error_ = std::current_exception();
        }
        if (unfinished_.fetch_sub(1, std::memory_order_seq_cst) == 1 && poster_sleeping_.load(std::memory_order_seq_cst))
            unfinished_.notify_one();
        c = claim_.load(std::memory_order_acquire);
    }
}

void ThreadPool::wait_all_done() {
    auto done = [&] { return unfinished_.load(std::memory_order_acquire) == 0; };
    if (spin_until(done, spin_ns_)) return;
    poster_sleeping_.store(true, std::memory_order_seq_cst);
    for (uint32_t left; (left = unfinished_.load(std::memory_order_seq_cst)) != 0;)
        unfinished_.wait(left, std::memory_order_seq_cst);
    poster_sleeping_.store(false, std::memory_order_relaxed);
}

void ThreadPool::run_erased(int n_slots, SlotFn fn, void* ctx) {
    if (n_slots <= 0) return;
    std::unique_lock<std::mutex> lock(post_mutex_, std::defer_lock);
    if (n_slots == 1 || t_in_job || !lock.try_lock()) {
        for (int s = 0; s < n_slots; ++s) fn(ctx, s);
        return;
    }
    start_workers(n_slots - 1);

    fn_.store(fn, std::memory_order_relaxed);
    ctx_.store(ctx, std::memory_order_relaxed);
    n_slots_.store(n_slots, std::memory_order_relaxed);
    unfinished_.store(static_cast<uint32_t>(n_slots), std::memory_order_relaxed);
    const uint32_t epoch = epoch_.load(std::memory_order_relaxed) + 1;
    claim_.store(pack_claim(epoch, 0), std::memory_order_release);
    epoch_.store(epoch, std::memory_order_seq_cst);
    if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();

    t_in_job = true;
    take_slots(epoch);   // the caller claims slots like any worker, so no slot waits for a sleeping one
    wait_all_done();
    t_in_job = false;

    std::exception_ptr error;
    {
        std::lock_guard<std::mutex> elock(error_mutex_);
        std::swap(error, error_);
    }
    lock.unlock();
    if (error) std::rethrow_exception(error);
}

} // namespace tern
