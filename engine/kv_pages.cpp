#include "engine/kv_pages.h"

#include <algorithm>
#include <climits>
#include <string>

#include "base/error.h"
#include "engine/load_errors.h"

namespace tern {

KvPageTable::KvPageTable(int32_t n_slots) : refs_(static_cast<size_t>(n_slots), 0) {
    for (int32_t s = n_slots - 1; s >= 0; --s) free_.push_back(s);
    create(0);
}

bool KvPageTable::exists(int32_t seq) const {
    return seq >= 0 && static_cast<size_t>(seq) < seqs_.size() && seqs_[static_cast<size_t>(seq)].live;
}

KvPageTable::Sequence& KvPageTable::live(int32_t seq) {
    if (!exists(seq)) throw UsageError("KV cache: sequence " + std::to_string(seq) + " does not exist");
    return seqs_[static_cast<size_t>(seq)];
}

const KvPageTable::Sequence& KvPageTable::live(int32_t seq) const {
    if (!exists(seq)) throw UsageError("KV cache: sequence " + std::to_string(seq) + " does not exist");
    return seqs_[static_cast<size_t>(seq)];
}

void KvPageTable::create(int32_t seq) {
    if (seq < 0) throw UsageError("KV cache: sequence ids are non-negative, got " + std::to_string(seq));
    if (exists(seq)) throw UsageError("KV cache: sequence " + std::to_string(seq) + " exists already");
    if (static_cast<size_t>(seq) >= seqs_.size()) seqs_.resize(static_cast<size_t>(seq) + 1);
    seqs_[static_cast<size_t>(seq)] = Sequence{true, 0, {}};
}

void KvPageTable::free(int32_t seq) {
    Sequence& s = live(seq);
    release_after(s, 0);
    s.live = false;
}

int32_t KvPageTable::take_slot() {
    const int32_t slot = free_.back();
    free_.pop_back();
    refs_[static_cast<size_t>(slot)] = 1;
    return slot;
}

void KvPageTable::drop_slot(int32_t slot) {
    if (--refs_[static_cast<size_t>(slot)] == 0) free_.push_back(slot);
}

void KvPageTable::release_after(Sequence& s, int32_t n) {
    const auto keep = static_cast<size_t>(kv_pages_for(n));
    while (s.pages.size() > keep) {
        drop_slot(s.pages.back());
        s.pages.pop_back();
    }
    s.n_past = std::min(s.n_past, n);
}

void KvPageTable::fork(int32_t src, int32_t dst, int32_t n) {
    const Sequence& from = live(src);
    if (n < 0 || n > from.n_past)
        throw UsageError("KV cache: cannot share " + std::to_string(n) + " positions of sequence " +
                         std::to_string(src) + ", it holds " + std::to_string(from.n_past));
    if (src == dst) {
        set_n_past(src, n);
        return;
    }
    std::vector<int32_t> shared(from.pages.begin(),
                                from.pages.begin() + kv_pages_for(n));
    for (int32_t slot : shared) ++refs_[static_cast<size_t>(slot)];   // before dst lets go of its own
    if (exists(dst)) release_after(live(dst), 0);
    else create(dst);
    Sequence& to = live(dst);
    to.pages = std::move(shared);
    to.n_past = n;
}

int32_t KvPageTable::n_past(int32_t seq) const { return live(seq).n_past; }

int32_t KvPageTable::mapped(int32_t seq) const {
    return static_cast<int32_t>(std::min<int64_t>(positions_in(live(seq).pages.size()), INT32_MAX));
}

void KvPageTable::set_n_past(int32_t seq, int32_t n) {
    Sequence& s = live(seq);
    if (n < 0 || n > positions_in(s.pages.size()))
        throw UsageError("KV cache: n_past " + std::to_string(n) + " of sequence " + std::to_string(seq) +
                         " is past its mapped positions");
    release_after(s, n);
    s.n_past = n;
}

std::vector<KvSlotCopy> KvPageTable::prepare_write(int32_t seq, int32_t begin, int32_t end) {
    Sequence& s = live(seq);
    if (begin < 0 || end < begin) throw UsageError("KV cache: bad write range");
    const auto chunks = static_cast<size_t>(kv_pages_for(end));
    const size_t first_written = static_cast<size_t>(begin / kKvPagePositions);
    // Count first, so a refusal changes nothing.
    int32_t needed = 0;
    for (size_t c = 0; c < chunks; ++c) {
        if (c >= s.pages.size()) ++needed;
        else if (c >= first_written && begin < end && refs_[static_cast<size_t>(s.pages[c])] > 1) ++needed;
    }
    if (needed > free_slots()) throw KvPoolExhausted(needed, free_slots());
    std::vector<KvSlotCopy> copies;
    for (size_t c = 0; c < chunks; ++c) {
        if (c >= s.pages.size()) {
            s.pages.push_back(take_slot());
        } else if (c >= first_written && begin < end && refs_[static_cast<size_t>(s.pages[c])] > 1) {
            const int32_t shared = s.pages[c];
            s.pages[c] = take_slot();
            --refs_[static_cast<size_t>(shared)];   // still held by another sequence: never freed here
            copies.push_back({shared, s.pages[c]});
        }
    }
    return copies;
}

const std::vector<int32_t>& KvPageTable::pages(int32_t seq) const { return live(seq).pages; }

} // namespace tern
