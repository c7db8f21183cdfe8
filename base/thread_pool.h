#pragma once
// The threads of the CPU forward pass: one persistent pool whose workers spin briefly after each job and
// then sleep in the kernel, and whose jobs are slots that any thread may claim.
//
// Why not OpenMP: a forward pass runs a few hundred parallel regions per token, tens of microseconds each.
// libgomp's threads spin at every barrier and between regions, which is right on an idle machine and ruinous
// on a busy one: a spinning thread keeps its core while the thread it waits for is descheduled, and a static
// split makes every region wait for the slowest thread's whole share (2-4 tok/s instead of 84 with one build
// running beside a decode; OMP_WAIT_POLICY=passive gives the speed back under load but costs ~25% when quiet).
//
// Here a job is n slots, each run exactly once. The caller claims slots too and never waits for a slot that
// nobody has started: a worker that is descheduled when a job is posted simply finds every slot taken when
// it runs again. So a region waits only for slots already running (keep them short: parallel_for.h splits
// work so that a running claim is small), and a worker that is not needed costs nothing. Workers spin for a
// bounded time after a job (back-to-back regions find them awake) and then sleep on a futex until the next.
//
// Work outside the forward pass (quantize, synth, the bandwidth probe of `tern bench`) stays on OpenMP: none of
// it runs between two of the pool's jobs, and libgomp's threads stop spinning a few milliseconds after their
// last region, so they never compete with the pool for long.
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace tern {

class ThreadPool {
public:
    // spin_ns: how long an idle worker (and a caller waiting for running slots) polls before it sleeps.
    explicit ThreadPool(int64_t spin_ns = kDefaultSpinNs);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    // The pool the kernels use; created on first use, never destroyed (its workers sleep when idle).
    static ThreadPool& shared();

    // Calls body(slot) once for every slot in [0, n_slots), on the calling thread and up to n_slots - 1
    // workers; at most n_slots run at once, never two with the same slot. Returns when every slot has
    // returned. If a body throws, the other slots still run and the first exception is rethrown here.
    // Called from inside a slot (nested), or while another thread's job holds the pool, the slots run one
    // after another on the calling thread, in order (an exception then stops them at once).
    template <class Body> void run(int n_slots, Body&& body) {
        run_erased(n_slots, &call_body<std::remove_reference_t<Body>>, &body);
    }

    int workers() const { return static_cast<int>(workers_.size()); }

    // Most workers a pool starts: slots beyond them are claimed by the threads that exist.
    static constexpr int kMaxWorkers = 255;
    // 50 us: the gap between two regions of a decode step is a few microseconds, and a futex wake costs the
    // poster a few microseconds and the woken thread tens, so anything shorter than a region is worth
    // polling for; a sampling step or a prompt's detokenization is not.
    static constexpr int64_t kDefaultSpinNs = 50'000;

private:
    using SlotFn = void (*)(void*, int);
    template <class Body> static void call_body(void* body, int slot) { (*static_cast<Body*>(body))(slot); }

    void run_erased(int n_slots, SlotFn fn, void* ctx);
    void start_workers(int wanted);
    void worker_main(uint32_t epoch_seen);
    // Claims and runs slots of job `epoch` until none is left or a later job has replaced it.
    void take_slots(uint32_t epoch);
    void wait_all_done();

    const int64_t spin_ns_;

    // The job: fn_, ctx_ and n_slots_ are written by the poster before claim_ and epoch_ publish it. claim_
    // holds the job's epoch (high 32 bits) and its next unclaimed slot (low 32): a claim is a CAS that also
    // checks the epoch, so a worker that read a job late can never run a slot of another one.
    alignas(64) std::atomic<uint64_t> claim_{0};
    alignas(64) std::atomic<uint32_t> epoch_{0};   // workers sleep on this word
    std::atomic<SlotFn> fn_{nullptr};
    std::atomic<void*> ctx_{nullptr};
    std::atomic<int> n_slots_{0};
    std::atomic<int> sleeping_workers_{0};
    std::atomic<bool> stop_{false};
    alignas(64) std::atomic<uint32_t> unfinished_{0};   // slots not yet returned; the poster sleeps on it
    std::atomic<bool> poster_sleeping_{false};

    std::mutex error_mutex_;
    std::exception_ptr error_;

    std::mutex post_mutex_;   // one job at a time; another thread's job runs serially instead of waiting
    std::vector<std::thread> workers_;
};

// Calls body(slot) for slot in [0, n_threads) on the shared pool (n_threads <= 1: once, inline).
template <class Body> void parallel_slots(int n_threads, Body&& body) {
    if (n_threads <= 1) {
        body(0);
        return;
    }
    ThreadPool::shared().run(n_threads, body);
}

} // namespace tern
