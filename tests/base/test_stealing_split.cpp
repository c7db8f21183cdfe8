// base/stealing_split.h: every item is handed out exactly once, in consecutive runs, whatever the
// thread count, batch size and timing; a thread that starts late has its slice taken over by the others.
#include <doctest/doctest.h>

#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "base/stealing_split.h"

namespace tern {
namespace {

// Runs the split on n_threads OpenMP threads; per item, how many times it was handed out, and per thread,
// how many items it got. jitter: threads yield or sleep at random between claims, so steals happen.
struct SplitRun {
    std::vector<int> times_given;
    std::vector<int64_t> per_thread;
    bool runs_in_bounds = true;
};

SplitRun run_split(int64_t n_items, int n_threads, int64_t max_batch, bool jitter, int late_thread = -1) {
    StealingSplit split(n_items, n_threads, max_batch);
    std::vector<std::atomic<int>> given(static_cast<size_t>(n_items));
    SplitRun r;
    r.per_thread.assign(static_cast<size_t>(n_threads), 0);
    std::atomic<bool> bad{false};
#pragma omp parallel num_threads(n_threads)
    {
        const int t = omp_get_thread_num();
        std::mt19937 rng(static_cast<uint32_t>(1234 + t));
        if (t == late_thread) std::this_thread::sleep_for(std::chrono::milliseconds(300));
        int64_t begin = 0, end = 0;
        while (split.next(t, &begin, &end)) {
            if (begin < 0 || end > n_items || begin >= end) bad = true;
            for (int64_t i = begin; i < end && i >= 0 && i < n_items; ++i) given[static_cast<size_t>(i)]++;
            r.per_thread[static_cast<size_t>(t)] += end - begin;
            if (jitter) {
                const uint32_t roll = rng() % 16;
                if (roll == 0)
                    std::this_thread::sleep_for(std::chrono::microseconds(50));
                else if (roll < 4)
                    std::this_thread::yield();
            }
        }
    }
    r.runs_in_bounds = !bad;
    for (const auto& g : given) r.times_given.push_back(g.load());
    return r;
}

TEST_CASE("every item is handed out exactly once, in consecutive runs within bounds") {
    for (int n_threads : {1, 2, 3, 4})
        for (int64_t n_items : {0, 1, 2, 5, 64, 1000})
            for (int64_t max_batch : {1, 3, 16})
                for (bool jitter : {false, true}) {
                    CAPTURE(n_threads);
                    CAPTURE(n_items);
                    CAPTURE(max_batch);
                    CAPTURE(jitter);
                    const SplitRun r = run_split(n_items, n_threads, max_batch, jitter);
                    CHECK(r.runs_in_bounds);
                    int64_t total = 0;
                    for (int64_t c : r.per_thread) total += c;
                    CHECK(total == n_items);
                    for (size_t i = 0; i < r.times_given.size(); ++i) {
                        CAPTURE(i);
                        REQUIRE(r.times_given[i] == 1);
                    }
                }
}

TEST_CASE("a thread that starts late has its slice stolen by the others") {
    // Thread 1 owns items 500 .. 999 but sleeps 300 ms before its first claim; the other thread finishes its
    // own 500 in microseconds and then takes thread 1's slice half by half, down to the last item.
    const SplitRun r = run_split(1000, 2, 4, false, 1);
    CHECK(r.runs_in_bounds);
    for (int g : r.times_given) REQUIRE(g == 1);
    CHECK(r.per_thread[0] > 500);
    CHECK(r.per_thread[1] < 500);
}

TEST_CASE("with one thread the items come in order, claims growing no larger than max_batch") {
    StealingSplit split(100, 1, 5);
    int64_t expect = 0, begin = 0, end = 0;
    while (split.next(0, &begin, &end)) {
        CHECK(begin == expect);
        CHECK(end - begin >= 1);
        CHECK(end - begin <= 5);
        expect = end;
    }
    CHECK(expect == 100);
}

} // namespace
} // namespace tern
