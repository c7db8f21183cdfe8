#pragma once
// The bookkeeping of a paged KV cache, apart from its bytes: which page slot holds which positions of
// which sequence. A pool of n_slots slots, each holding kKvPagePositions positions of every layer; a
// page table per sequence (chunk c of the sequence, positions [c * kKvPagePositions, (c + 1) *
// kKvPagePositions), is in slot pages(seq)[c]); reference counts, so sequences that share a prefix share
// its slots, and copy on write, so a sequence about to write into a shared slot first gets its own copy.
// A backend's cache (engine/cpu/kv_cache.h) owns the bytes and does the copies this table asks for.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/kv_format.h"

namespace tern {

// A slot to copy before a write: the bytes of slot `from` (every layer) go to slot `to`.
struct KvSlotCopy {
    int32_t from = 0, to = 0;
};

// Where a position lives: the slot of its page and its row inside the page.
struct KvPageSpot {
    int32_t slot = 0;
    int32_t row = 0;     // 0 .. kKvPagePositions - 1
};

// Calls f(pos, run) for each run of positions [pos, pos + n) that stays inside one page, in order: the rows
// a cache copies in one piece.
template <class F> void for_each_page_run(int32_t pos, int32_t n, F&& f) {
    while (n > 0) {
        const int32_t run = std::min(n, kKvPagePositions - pos % kKvPagePositions);
        f(pos, run);
        pos += run;
        n -= run;
    }
}

class KvPageTable {
public:
    // n_slots free slots and sequence 0, empty.
    explicit KvPageTable(int32_t n_slots = 0);

    int32_t n_slots() const { return static_cast<int32_t>(refs_.size()); }
    int32_t free_slots() const { return static_cast<int32_t>(free_.size()); }
    int32_t slots_in_use() const { return n_slots() - free_slots(); }

    // Sequence ids are small non-negative integers the caller picks. A sequence exists from create()
    // (or fork()) until free(); sequence 0 exists from the start.
    bool exists(int32_t seq) const;
    void create(int32_t seq);                          // empty; throws UsageError when it exists
    void free(int32_t seq);                            // its slots lose a reference each
    // dst (created, or emptied when it exists) shares the slots that hold src's first n positions and
    // has n_past n. A later write by either into a shared slot copies it first (prepare_write).
    void fork(int32_t src, int32_t dst, int32_t n);

    int32_t n_past(int32_t seq) const;
    // The first n positions of seq are valid (n <= its mapped positions); slots wholly past them are released.
    void set_n_past(int32_t seq, int32_t n);
    // Positions mapped to slots (a multiple of kKvPagePositions, >= n_past).
    int32_t mapped(int32_t seq) const;

    // Makes positions [0, end) of seq mapped and positions [begin, end) writable by this sequence alone:
    // maps missing chunks to free slots, and moves a chunk in [begin, end) whose slot is shared to a
    // fresh slot, returning the copies the bytes need before anything is written there (in order). When
    // the free slots do not suffice, throws KvPoolExhausted and changes nothing.
    std::vector<KvSlotCopy> prepare_write(int32_t seq, int32_t begin, int32_t end);

    // Chunk c's slot; the slots of the mapped chunks in order.
    const std::vector<int32_t>& pages(int32_t seq) const;
    // The page arithmetic, in one place: where mapped position `pos` of seq lives, and how many
    // positions n_pages pages hold.
    KvPageSpot locate(int32_t seq, int32_t pos) const {
        return {pages(seq)[static_cast<size_t>(pos / kKvPagePositions)], pos % kKvPagePositions};
    }
    static int64_t positions_in(size_t n_pages) { return static_cast<int64_t>(n_pages) * kKvPagePositions; }
    int32_t refs(int32_t slot) const { return refs_[static_cast<size_t>(slot)]; }

private:
    struct Sequence {
        bool live = false;
        int32_t n_past = 0;
        std::vector<int32_t> pages;
    };
    Sequence& live(int32_t seq);
    const Sequence& live(int32_t seq) const;
    int32_t take_slot();
    void drop_slot(int32_t slot);
    void release_after(Sequence& s, int32_t n);

    std::vector<int32_t> refs_;    // per slot: the sequences whose tables hold it
    std::vector<int32_t> free_;    // a stack, the lowest slot on top: one sequence fills slots 0, 1, 2 ...
    std::vector<Sequence> seqs_;   // by id
};

} // namespace tern
