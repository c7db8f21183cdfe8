// base/thread_pool.h and parallel_for.h: every slot and every item runs exactly once, whatever the
// thread count, size and timing (also with far more threads than cores, and with a thread that the system
// keeps from running); nested and concurrent calls run serially instead of deadlocking; an exception in any
// slot reaches the caller after the other slots ran; the pool keeps working after all of these.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "base/parallel_for.h"
#include "base/thread_pool.h"

namespace tern {
namespace {

// Runs n_slots slots on `pool`; checks each ran once and that no two ran at the same time with one slot.
void check_slots_once(ThreadPool& pool, int n_slots) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(std::max(n_slots, 0)));
    std::atomic<int> running{0}, most_running{0};
    std::atomic<bool> out_of_range{false};
    pool.run(n_slots, [&](int slot) {
        const int now = running.fetch_add(1) + 1;
        int seen = most_running.load();
        while (now > seen && !most_running.compare_exchange_weak(seen, now)) {}
        if (slot < 0 || slot >= n_slots)
            out_of_range = true;
        else
            runs[static_cast<size_t>(slot)].fetch_add(1);
        running.fetch_sub(1);
    });
    CHECK_FALSE(out_of_range.load());
    CHECK(most_running.load() <= std::max(n_slots, 0));
    for (int s = 0; s < n_slots; ++s) {
        CAPTURE(s);
        REQUIRE(runs[static_cast<size_t>(s)].load() == 1);
    }
}

// parallel_for over n items: each item handed out once, in runs within [0, n).
void check_items_once(int64_t n, int n_threads, int64_t max_batch, bool jitter) {
    std::vector<std::atomic<int>> given(static_cast<size_t>(std::max<int64_t>(n, 0)));
    std::atomic<bool> bad{false};
    std::atomic<uint32_t> seed{1};
    parallel_for(n, n_threads, max_batch, [&](int64_t begin, int64_t end) {
        if (begin < 0 || end > n || begin >= end) bad = true;
        for (int64_t i = std::max<int64_t>(begin, 0); i < end && i < n; ++i) given[static_cast<size_t>(i)].fetch_add(1);
        if (jitter) {
            thread_local std::mt19937 rng(seed.fetch_add(1));
            const uint32_t roll = rng() % 16;
            if (roll == 0)
                std::this_thread::sleep_for(std::chrono::microseconds(30));
            else if (roll < 4)
                std::this_thread::yield();
        }
    });
    CHECK_FALSE(bad.load());
    for (size_t i = 0; i < given.size(); ++i) {
        CAPTURE(i);
        REQUIRE(given[i].load() == 1);
    }
}

TEST_CASE("every slot runs exactly once, for many slot counts, on pools with any spin time") {
    for (int64_t spin_ns : {int64_t{0}, int64_t{2000}, ThreadPool::kDefaultSpinNs}) {
        ThreadPool pool(spin_ns);
        for (int round = 0; round < 3; ++round)
            for (int n_slots : {0, 1, 2, 3, 4, 7, 16, 33}) {
                CAPTURE(spin_ns);
                CAPTURE(n_slots);
                check_slots_once(pool, n_slots);
            }
        CHECK(pool.workers() == 32);   // started on demand: one fewer than the most slots asked for
    }
}

TEST_CASE("parallel_for hands out every item once for many sizes, thread counts and batch sizes") {
    for (int n_threads : {0, 1, 2, 3, 4, 8})
        for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{2}, int64_t{5}, int64_t{64}, int64_t{1000}, int64_t{100003}})
            for (int64_t max_batch : {int64_t{1}, int64_t{3}, int64_t{64}})
                for (bool jitter : {false, true}) {
                    if (jitter && n > 1000) continue;   // the sleeps would take seconds
                    CAPTURE(n_threads);
                    CAPTURE(n);
                    CAPTURE(max_batch);
                    CAPTURE(jitter);
                    check_items_once(n, n_threads, max_batch, jitter);
                }
}

TEST_CASE("a worker that does not run does not hold up the job: the caller takes its share") {
    // Slot bodies that find the calling thread's work is done return at once; the caller must be able to run
    // every slot itself while the workers are busy elsewhere (here: asleep in the kernel, spin time 0).
    ThreadPool pool(0);
    check_slots_once(pool, 4);   // starts the workers; they go to sleep at once
    for (int round = 0; round < 200; ++round) check_slots_once(pool, 4);
    // parallel_for's stealing: one thread stalls 200 ms inside its first batch; the others finish every
    // other item long before it wakes (the items it holds are the only ones the region waits for).
    std::vector<std::atomic<int>> given(4000);
    std::atomic<bool> stalled{false};
    std::atomic<int64_t> done_while_stalled{0};
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(4000, 2, 1, [&](int64_t begin, int64_t end) {
        bool expected = false;
        if (stalled.compare_exchange_strong(expected, true)) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
        } else if (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(150)) {
            done_while_stalled += end - begin;
        }
        for (int64_t i = begin; i < end; ++i) given[static_cast<size_t>(i)].fetch_add(1);
    });
    for (size_t i = 0; i < given.size(); ++i) REQUIRE(given[i].load() == 1);
    CHECK(done_while_stalled.load() >= 3000);
}

TEST_CASE("a parallel call from inside a slot runs serially on that thread, in order") {
    ThreadPool pool;
    std::vector<std::atomic<int>> inner_runs(4 * 5);
    std::atomic<bool> out_of_order{false};
    pool.run(4, [&](int outer) {
        const std::thread::id self = std::this_thread::get_id();
        int last = -1;
        pool.run(5, [&](int inner) {
            if (std::this_thread::get_id() != self || inner != last + 1) out_of_order = true;
            last = inner;
            inner_runs[static_cast<size_t>(outer * 5 + inner)].fetch_add(1);
        });
        // The shared pool too (the kernels' parallel_for inside a slot of another job).
        parallel_for(100, 4, 1, [&](int64_t, int64_t) {
            if (std::this_thread::get_id() != self) out_of_order = true;
        });
    });
    CHECK_FALSE(out_of_order.load());
    for (auto& r : inner_runs) REQUIRE(r.load() == 1);
    check_slots_once(pool, 4);   // still works afterwards
}

TEST_CASE("calls from several threads at once each run every slot once") {
    ThreadPool pool;
    std::vector<std::thread> callers;
    std::atomic<int> failures{0};
    for (int c = 0; c < 4; ++c)
        callers.emplace_back([&, c] {
            for (int round = 0; round < 300; ++round) {
                const int n_slots = 2 + (round + c) % 4;
                std::vector<std::atomic<int>> runs(static_cast<size_t>(n_slots));
                pool.run(n_slots, [&](int s) { runs[static_cast<size_t>(s)].fetch_add(1); });
                for (auto& r : runs)
                    if (r.load() != 1) failures++;
                check_items_once(257, 3, 4, false);   // the shared pool, from several threads
            }
        });
    for (std::thread& t : callers) t.join();
    CHECK(failures.load() == 0);
}

TEST_CASE("an exception in a slot reaches the caller after the other slots ran, and the pool goes on") {
    ThreadPool pool;
    for (int thrower : {0, 1, 3}) {
        CAPTURE(thrower);
        std::vector<std::atomic<int>> runs(4);
        CHECK_THROWS_WITH_AS(pool.run(4,
                                      [&](int s) {
                                          runs[static_cast<size_t>(s)].fetch_add(1);
                                          if (s == thrower) throw std::runtime_error("slot failed");
                                      }),
                             "slot failed", std::runtime_error);
        for (auto& r : runs) CHECK(r.load() == 1);
        check_slots_once(pool, 4);
    }
    // Every slot throwing: one of the exceptions arrives, none is lost in a worker.
    CHECK_THROWS_AS(pool.run(3, [](int) { throw std::logic_error("all"); }), std::logic_error);
    CHECK_THROWS_AS(parallel_for(1000, 2, 8, [](int64_t, int64_t) { throw std::out_of_range("item"); }), std::out_of_range);
    check_items_once(1000, 2, 8, false);
}

TEST_CASE("stress: far more threads than cores, short jobs back to back, with competing busy threads") {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    std::atomic<bool> stop{false};
    std::vector<std::thread> competitors;
    for (unsigned i = 0; i < cores; ++i)
        competitors.emplace_back([&] {
            while (!stop.load(std::memory_order_relaxed)) {}
        });
    ThreadPool pool(ThreadPool::kDefaultSpinNs);
    const int n_slots = static_cast<int>(4 * cores + 1);
    int64_t total = 0;
    for (int round = 0; round < 2000; ++round) {
        std::atomic<int64_t> sum{0};
        pool.run(round % 7 == 0 ? n_slots : 2, [&](int s) { sum.fetch_add(s + 1); });
        const int64_t n = round % 7 == 0 ? n_slots : 2;
        REQUIRE(sum.load() == n * (n + 1) / 2);
        total += sum.load();
    }
    for (int round = 0; round < 300; ++round) check_items_once(1 + round * 7, n_slots, 2, false);
    stop = true;
    for (std::thread& t : competitors) t.join();
    CHECK(total > 0);
}

TEST_CASE("a pool is destroyed cleanly with its workers asleep or spinning") {
    for (int64_t spin_ns : {int64_t{0}, int64_t{1'000'000'000}}) {
        ThreadPool pool(spin_ns);
        check_slots_once(pool, 6);
        if (spin_ns == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }   // the destructor wakes and joins 5 workers; a hang here fails the test by timeout
    CHECK(true);
}

} // namespace
} // namespace tern
