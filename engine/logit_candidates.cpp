#include "engine/logit_candidates.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tern {

namespace {

// NaN as -inf and -0.0 as +0.0: the values the total order compares.
float ordered_value(float v) {
    if (std::isnan(v)) return -std::numeric_limits<float>::infinity();
    return v == 0.0f ? 0.0f : v;
}

bool better(const LogitCandidate& a, const LogitCandidate& b) {
    if (a.logit != b.logit) return a.logit > b.logit;
    return a.id < b.id;
}

} // namespace

void apply_logit_penalties(std::span<float> logits, const LogitPenalties& penalties) {
    for (const PenaltyCount& s : penalties.seen) {
        if (s.id < 0 || static_cast<size_t>(s.id) >= logits.size()) continue;
        float& l = logits[static_cast<size_t>(s.id)];
        l = penalised_logit(l, s.count, penalties);
    }
}

size_t select_top_logits(std::span<const float> logits, const LogitPenalties& penalties,
                         std::span<LogitCandidate> out) {
    const size_t k = std::min(out.size(), logits.size());
    if (k == 0) return 0;
    // The penalised entries in id order, met in step with the scan: the row itself is never copied.
    std::vector<LogitCandidate> changed;
    for (const PenaltyCount& s : penalties.seen)
        if (s.id >= 0 && static_cast<size_t>(s.id) < logits.size())
            changed.push_back({s.id, penalised_logit(logits[static_cast<size_t>(s.id)], s.count, penalties)});
    std::sort(changed.begin(), changed.end(),
              [](const LogitCandidate& a, const LogitCandidate& b) { return a.id < b.id; });
    auto next_changed = changed.begin();

    // A k-element heap whose front is the worst kept candidate: almost every logit is rejected by one
    // comparison.
    std::vector<LogitCandidate> heap;
    heap.reserve(k);
    for (size_t i = 0; i < logits.size(); ++i) {
        float v = logits[i];
        if (next_changed != changed.end() && static_cast<size_t>(next_changed->id) == i) v = (next_changed++)->logit;
        const LogitCandidate c{static_cast<int32_t>(i), ordered_value(v)};
        if (heap.size() < k) {
            heap.push_back(c);
            std::push_heap(heap.begin(), heap.end(), better);
        } else if (better(c, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = c;
            std::push_heap(heap.begin(), heap.end(), better);
        }
    }
    std::sort(heap.begin(), heap.end(), better);
    std::copy(heap.begin(), heap.end(), out.begin());
    return k;
}

} // namespace tern
