#pragma once
// Items 0 .. n-1 on up to n_threads threads of the shared pool (thread_pool.h), split by StealingSplit
// (stealing_split.h): each thread streams its own ascending slice, a thread that runs dry takes the back half
// of the fullest other slice, and a claim is at most max_batch items, so the end of a region waits at most
// for the batches still running, never for a slice whose thread the system has descheduled.
//
// Which thread computes an item must not change what is computed: body(begin, end) has to give each item the
// same bits however [0, n) is cut into calls (every caller's per-item arithmetic is independent of the cut).
#include <algorithm>
#include <cstdint>

#include "base/stealing_split.h"
#include "base/thread_pool.h"

namespace tern {

template <class Body> void parallel_for(int64_t n, int n_threads, int64_t max_batch, Body&& body) {
    if (n <= 0) return;
    const int nt = static_cast<int>(std::clamp<int64_t>(n_threads, 1, n));
    if (nt == 1) {
        body(int64_t{0}, n);
        return;
    }
    StealingSplit split(n, nt, max_batch);
    ThreadPool::shared().run(nt, [&](int slot) {
        int64_t begin = 0, end = 0;
        while (split.next(slot, &begin, &end)) body(begin, end);
    });
}

} // namespace tern
