// Prompt-lookup drafting (drafter.h): the continuation of the most recent earlier occurrence of the
// history's last n tokens, longest n first.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/speculative/drafter.h"

namespace tern {

PromptLookupDrafter::PromptLookupDrafter(int32_t max_tokens, int32_t n_max, int32_t n_min)
    : n_min_(n_min), n_max_(n_max), max_tokens_(max_tokens) {
    if (n_min < 1 || n_max < n_min)
        throw std::invalid_argument("PromptLookupDrafter: need 1 <= n_min <= n_max, got " + std::to_string(n_min) +
                                    ".." + std::to_string(n_max));
    index_.resize(static_cast<size_t>(n_max - n_min + 1));
    rate_.resize(index_.size());
}

void PromptLookupDrafter::begin(std::span<const int32_t> context) {
    tokens_.clear();
    for (auto& m : index_)
        m.clear();
    index_up_to(context);
}

uint64_t PromptLookupDrafter::hash_ending_at(size_t end, int32_t n) const {
    // FNV-1a over the ids: cheap, and a collision only costs one rejected lookup (lookup() compares
    // the tokens themselves before trusting a hit).
    uint64_t h = 0xcbf29ce484222325ull ^ static_cast<uint64_t>(n);
    for (size_t i = end - static_cast<size_t>(n); i < end; ++i) {
        h ^= static_cast<uint32_t>(tokens_[i]);
        h *= 0x100000001b3ull;
    }
    return h;
}

void PromptLookupDrafter::index_up_to(std::span<const int32_t> history) {
    if (history.size() < tokens_.size())
        throw std::logic_error("PromptLookupDrafter: the history shrank between begin() calls");
    for (size_t t = tokens_.size(); t < history.size(); ++t) {
        tokens_.push_back(history[t]);
        // Token t is the continuation of every n-gram that ends just before it. Later occurrences
        // overwrite earlier ones: the most recent copy is the likeliest to be copied again.
        for (int32_t n = n_min_; n <= n_max_ && static_cast<size_t>(n) <= t; ++n)
            index_[static_cast<size_t>(n - n_min_)][hash_ending_at(t, n)] = static_cast<int32_t>(t);
    }
}

int32_t PromptLookupDrafter::lookup(std::span<const int32_t> history, int32_t max_tokens, std::vector<int32_t>& out) {
    out.clear();
    index_up_to(history);
    if (max_tokens <= 0) return 0;
    const size_t size = tokens_.size();
    for (int32_t n = std::min<int32_t>(n_max_, static_cast<int32_t>(size)); n >= n_min_; --n) {
        const auto& map = index_[static_cast<size_t>(n - n_min_)];
        const auto it = map.find(hash_ending_at(size, n));
        if (it == map.end()) continue;
        const auto from = static_cast<size_t>(it->second); // the continuation starts here
        if (!std::equal(tokens_.begin() + static_cast<std::ptrdiff_t>(from - static_cast<size_t>(n)),
                        tokens_.begin() + static_cast<std::ptrdiff_t>(from), tokens_.end() - n))
            continue; // hash collision
        // Copy from there. A copy that reaches the end of the history goes on copying itself: the
        // tail repeats with period size - from (a loop "a b c a b c ..." drafts its next rounds).
        const size_t period = size - from;
        for (size_t m = 0; m < static_cast<size_t>(max_tokens); ++m)
            out.push_back(m < period ? tokens_[from + m] : out[m - period]);
        return n;
    }
    return 0;
}

void PromptLookupDrafter::propose(std::span<const int32_t> history, int32_t max_tokens, const DraftCost& cost,
                                  std::vector<int32_t>& out) {
    last_n_ = lookup(history, std::min(max_tokens, max_tokens_), out);
    if (last_n_ == 0) return;
    AcceptanceRate& rate = rate_[static_cast<size_t>(last_n_ - n_min_)];
    const int32_t k = best_draft_length(rate.rate(), cost.relative_column_cost(), static_cast<int32_t>(out.size()));
    if (k == 0) {
        rate.forget();
        last_n_ = 0;
    }
    out.resize(static_cast<size_t>(k));
}

void PromptLookupDrafter::observe(int32_t proposed, int32_t accepted) {
    if (last_n_ > 0) rate_[static_cast<size_t>(last_n_ - n_min_)].observe(proposed, accepted);
}

} // namespace tern
