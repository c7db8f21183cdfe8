#pragma once
// Items 0 .. n-1 split over n_threads threads so that each thread reads one ascending run of memory and
// none waits long at the end. Thread t owns a contiguous slice and claims items from its front, an eighth
// of what is left at a time (at most max_batch); a thread whose slice is empty steals the back half of the
// fullest other slice (which then becomes its own).
//
// Why not OpenMP's dynamic schedule: decode streams every weight once, each thread prefetching 8 KiB
// ahead of its reads (stream_prefetch.h). Handing out runs of a few groups restarts that stream at every
// run (the first lines wait on DRAM, the last prefetches land in a run another thread takes), and a
// static split makes one thread wait for the whole share of the other when the machine's other work
// slows it down. Here a thread restarts only when it steals, and only once some thread has run dry.
// Measured on the 2-core Xeon (llama-1b Q4_0, tern bench decode at 2 threads, 6 interleaved runs each): 28.5
// -> 30.0 tok/s median, 29.4 -> 30.7 best, against OpenMP's dynamic schedule with runs of 256 KiB.
//
// Which thread computes an item never changes what is computed (the packed matmul's tiles write disjoint
// outputs), so the split is free to depend on timing.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace tern {

class StealingSplit {
public:
    // n_items < 2^31; n_threads >= 1. A claim is a locked instruction, about 2% of decode time on the 2-core
    // Xeon when made for every 18 KiB group, so the owner claims several items at once while its slice is
    // long; a claimed batch cannot be stolen, so near the slice's end the claims shrink to single items.
    StealingSplit(int64_t n_items, int n_threads, int64_t max_batch = 1)
        : n_threads_(std::max(1, n_threads)), max_batch_(static_cast<uint32_t>(std::clamp<int64_t>(max_batch, 1, 1 << 30))),
          slices_(new Slice[n_threads_]) {
        for (int t = 0; t < n_threads_; ++t)
            slices_[t].range.store(pack(n_items * t / n_threads_, n_items * (t + 1) / n_threads_), std::memory_order_relaxed);
    }

    // The next items for thread t (0 <= t < n_threads): [*begin, *end), consecutive; false when every item
    // has been handed out.
    bool next(int t, int64_t* begin, int64_t* end) {
        Slice& own = slices_[t];
        uint64_t r = own.range.load(std::memory_order_relaxed);
        for (;;) {
            const uint32_t front = front_of(r), back = back_of(r);
            if (front >= back) break;
            const uint32_t take = std::clamp<uint32_t>((back - front) / 8, 1, max_batch_);
            if (own.range.compare_exchange_weak(r, pack(front + take, back), std::memory_order_relaxed)) {
                *begin = front;
                *end = front + take;
                return true;
            }
        }
        const int64_t stolen = steal(t);
        *begin = stolen;
        *end = stolen + 1;
        return stolen >= 0;
    }

private:
    // front in the low 32 bits, back (one past the last item) in the high 32: one word, so the owner's take
    // and a thief's cut never both succeed on the same items.
    struct alignas(64) Slice {
        std::atomic<uint64_t> range{0};
    };

    static uint64_t pack(int64_t front, int64_t back) {
        return static_cast<uint64_t>(static_cast<uint32_t>(front)) | (static_cast<uint64_t>(static_cast<uint32_t>(back)) << 32);
    }
    static uint32_t front_of(uint64_t r) { return static_cast<uint32_t>(r); }
    static uint32_t back_of(uint64_t r) { return static_cast<uint32_t>(r >> 32); }

    // Takes the back half (rounded up) of the fullest other slice: its first item is returned and the rest
    // becomes thread t's slice. Only t writes t's own slice while it is empty (a thief skips empty slices),
    // so the store below cannot lose items.
    int64_t steal(int t) {
        for (;;) {
            int victim = -1;
            uint32_t most = 0;
            for (int v = 0; v < n_threads_; ++v) {
                if (v == t) continue;
                const uint64_t r = slices_[v].range.load(std::memory_order_relaxed);
                const uint32_t left = front_of(r) < back_of(r) ? back_of(r) - front_of(r) : 0;
                if (left > most) {
                    most = left;
                    victim = v;
                }
            }
            if (victim < 0) return -1;
            uint64_t r = slices_[victim].range.load(std::memory_order_relaxed);
            const uint32_t front = front_of(r), back = back_of(r);
            if (front >= back) continue;   // emptied meanwhile: look again
            const uint32_t cut = back - (back - front + 1) / 2;   // the thief takes [cut, back)
            if (!slices_[victim].range.compare_exchange_strong(r, pack(front, cut), std::memory_order_relaxed))
                continue;
            slices_[t].range.store(pack(cut + 1, back), std::memory_order_relaxed);
            return cut;
        }
    }

    int n_threads_;
    uint32_t max_batch_;
    std::unique_ptr<Slice[]> slices_;
};

} // namespace tern
