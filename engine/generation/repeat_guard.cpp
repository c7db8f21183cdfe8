#include "engine/generation/repeat_guard.h"

#include <algorithm>

namespace tern {

// ---------------------------------------------------------------------------------------------
// SubstringMatcher: the suffix automaton of the text (every substring is a path from state 0),
// built online; then the sequence walks it, falling back along suffix links when a token has no
// transition, which keeps the longest suffix that is still a substring.

namespace {
uint64_t key(int32_t state, int32_t token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(state)) << 32) | static_cast<uint32_t>(token);
}
} // namespace

SubstringMatcher::SubstringMatcher(std::span<const int32_t> text) {
    states_.reserve(2 * text.size() + 1);
    transitions_.reserve(3 * text.size());
    states_.push_back(State{});
    for (int32_t t : text) extend(t);
}

int32_t SubstringMatcher::next(int32_t state, int32_t token) const {
    const auto it = transitions_.find(key(state, token));
    return it == transitions_.end() ? -1 : it->second;
}

void SubstringMatcher::set_next(int32_t state, int32_t token, int32_t target) {
    auto [it, inserted] = transitions_.try_emplace(key(state, token), target);
    if (inserted) {
        states_[static_cast<size_t>(state)].out_tokens.push_back(token);
    } else {
        it->second = target;
    }
}

void SubstringMatcher::extend(int32_t token) {
    const int32_t cur = static_cast<int32_t>(states_.size());
    states_.push_back(State{states_[static_cast<size_t>(last_)].len + 1, -1, {}});
    int32_t p = last_;
    while (p != -1 && next(p, token) < 0) {
        set_next(p, token, cur);
        p = states_[static_cast<size_t>(p)].link;
    }
    if (p == -1) {
        states_[static_cast<size_t>(cur)].link = 0;
    } else {
        const int32_t q = next(p, token);
        if (states_[static_cast<size_t>(p)].len + 1 == states_[static_cast<size_t>(q)].len) {
            states_[static_cast<size_t>(cur)].link = q;
        } else {
            const int32_t clone = static_cast<int32_t>(states_.size());
            states_.push_back(State{states_[static_cast<size_t>(p)].len + 1, states_[static_cast<size_t>(q)].link, {}});
            const std::vector<int32_t> q_tokens = states_[static_cast<size_t>(q)].out_tokens;
            for (int32_t t : q_tokens) set_next(clone, t, next(q, t));
            while (p != -1 && next(p, token) == q) {
                set_next(p, token, clone);
                p = states_[static_cast<size_t>(p)].link;
            }
            states_[static_cast<size_t>(q)].link = clone;
            states_[static_cast<size_t>(cur)].link = clone;
        }
    }
    last_ = cur;
}

int32_t SubstringMatcher::push(int32_t token) {
    while (cur_ != 0 && next(cur_, token) < 0) {
        cur_ = states_[static_cast<size_t>(cur_)].link;
        match_ = states_[static_cast<size_t>(cur_)].len;
    }
    const int32_t to = next(cur_, token);
    if (to >= 0) {
        cur_ = to;
        ++match_;
    } else {
        cur_ = 0;
        match_ = 0;
    }
    return match_;
}

int32_t SubstringMatcher::prefix_in_text(std::span<const int32_t> seq) const {
    int32_t state = 0, n = 0;
    for (int32_t t : seq) {
        state = next(state, t);
        if (state < 0) break;
        ++n;
    }
    return n;
}

// ---------------------------------------------------------------------------------------------

std::optional<RepeatGuardParamsError> check_repeat_guard_params(const RepeatGuardParams& p) {
    using Field = RepeatGuardParamsError::Field;
    if (p.min_repeats < 2 || p.min_repeats > 1000)
        return RepeatGuardParamsError{Field::min_repeats, "must be in 2..1000 (back-to-back occurrences that make a loop)"};
    if (p.min_loop_tokens < 1 || p.min_loop_tokens > 100000)
        return RepeatGuardParamsError{Field::min_loop_tokens, "must be in 1..100000 (tokens a loop must cover)"};
    if (p.long_span != 0 && (p.long_span < 2 || p.long_span > 100000))
        return RepeatGuardParamsError{Field::long_span, "must be 0 (off) or in 2..100000 (a span this long loops on "
                                                        "its 2nd occurrence)"};
    if (p.max_span < 1 || p.max_span > 4096)
        return RepeatGuardParamsError{Field::max_span, "must be in 1..4096 (the longest span looked for; each costs a "
                                                       "comparison per token)"};
    return std::nullopt;
}

RepeatGuard::RepeatGuard(const RepeatGuardParams& params, std::span<const int32_t> prompt) : params_(params) {
    if (!params_.enabled) return;
    params_.max_span = std::max(params_.max_span, 1);
    run_.assign(static_cast<size_t>(params_.max_span) + 1, 0);
    prompt_.emplace(prompt);
}

int32_t RepeatGuard::repeats_needed(int32_t span) const {
    if (params_.long_span > 0 && span >= params_.long_span) return 2;
    const int32_t by_tokens = (params_.min_loop_tokens + span - 1) / span;
    return std::max({params_.min_repeats, by_tokens, 2});
}

std::optional<RepeatCut> RepeatGuard::push(std::span<const int32_t> generated) {
    if (!params_.enabled || generated.empty()) return std::nullopt;
    const int32_t copied = prompt_->push(generated.back());
    const int32_t n = static_cast<int32_t>(generated.size());
    const int32_t max_span = std::min(params_.max_span, n - 1);
    at_risk_ = 0;
    std::optional<RepeatCut> found;
    for (int32_t s = 1; s <= max_span; ++s) {
        int32_t& run = run_[static_cast<size_t>(s)];
        run = generated[static_cast<size_t>(n - 1)] == generated[static_cast<size_t>(n - 1 - s)] ? run + 1 : 0;
        at_risk_ = std::max(at_risk_, run);
        // The shortest period that qualifies names the loop; its tail (run + s tokens) must not be
        // a verbatim piece of the prompt.
        if (found || run < (repeats_needed(s) - 1) * s || copied >= run + s) continue;
        // Keep one occurrence, or all of the loop's start that copies the prompt when that is more.
        const std::span<const int32_t> region = generated.subspan(static_cast<size_t>(n - run - s));
        const int32_t keep = std::max(s, prompt_->prefix_in_text(region));
        found = RepeatCut{s, (run + s) / s, run + s - keep};
    }
    return found;
}

size_t HeldText::showable(int32_t at_risk, size_t text_size) const {
    if (at_risk <= 0) return text_size;
    const size_t n = ends_.size();
    if (static_cast<size_t>(at_risk) >= n) return 0;
    return ends_[n - static_cast<size_t>(at_risk) - 1];
}

} // namespace tern
