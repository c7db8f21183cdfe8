#include "engine/generation/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tern {

namespace {

struct Candidate {
    int32_t id;
    float logit;
    uint64_t mass = 0;   // exp(logit - max) in 2^-40 fixed point, filled in for top-p
};

// Logit descending, id ascending on ties: a total order, so every sort and selection below is
// deterministic whatever the standard library's algorithm.
bool better(const Candidate& a, const Candidate& b) {
    if (a.logit != b.logit) return a.logit > b.logit;
    return a.id < b.id;
}

bool penalties_active(const SamplingParams& p) {
    if (p.repeat_last_n == 0) return false;
    return p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

std::span<const int32_t> penalty_window(std::span<const int32_t> history, int32_t last_n) {
    if (last_n < 0 || static_cast<size_t>(last_n) >= history.size()) return history;
    return history.subspan(history.size() - static_cast<size_t>(last_n));
}

float clean(float v) { return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v; }

// The chain after top-k: min-p, top-p, temperature, normalisation, on the top-k set `cand` (the whole
// vocabulary when top-k is off; id_order: `cand` is in id order). Every step depends on the set only,
// not on the order it comes in: the selections below use the total order `better`, the sums run in id
// order. So a backend's candidates (Backend::top_logits) give what the whole row gives.
std::vector<TokenProb> after_top_k(const SamplingParams& params, std::vector<Candidate> cand, bool id_order) {
    float max_logit = -std::numeric_limits<float>::infinity();
    for (const Candidate& c : cand) max_logit = std::max(max_logit, c.logit);
    if (!std::isfinite(max_logit)) {
        // Every logit is -inf (or +inf appears): no meaningful softmax; fall back to the argmax.
        return {{std::min_element(cand.begin(), cand.end(), better)->id, 1.0f}};
    }

    const bool top_p_on = params.top_p < 1.0f && cand.size() > 1;

    // top-p works with the top-k set's probabilities: its total mass is taken before min-p.
    // Masses are exp(l - max) in 2^-40 fixed point: integer sums are exact and independent of
    // the order the selection below leaves elements in, which differs between standard
    // libraries; so the kept set is the same everywhere.
    uint64_t total = 0;
    if (top_p_on) {
        for (Candidate& c : cand) {
            c.mass = static_cast<uint64_t>(std::llround(std::exp(static_cast<double>(c.logit) - max_logit) * 0x1.0p40));
            total += c.mass;
        }
    }

    // --- min-p, before top-p even though the chain lists it after: both keep a prefix of the
    // candidates in logit order, so the result is the shorter prefix either way, and dropping
    // the long tail first leaves top-p little to select from. It compares logits: p >= min_p *
    // p_max needs no softmax.
    if (params.min_p > 0.0f) {
        const double min_logit = max_logit + std::log(static_cast<double>(params.min_p));
        std::erase_if(cand, [&](const Candidate& c) { return static_cast<double>(c.logit) < min_logit; });
    }

    // --- top-p: the smallest logit-ordered prefix whose mass reaches top_p of the total.
    if (top_p_on && cand.size() > 1) {
        const double target = static_cast<double>(params.top_p) * static_cast<double>(total);
        // Quickselect on mass: [0, lo) is kept for sure with mass `above` < target, the crossing
        // token is in [lo, hi), and [hi, n) is dropped. Expected O(n) instead of a full sort.
        size_t lo = 0, hi = cand.size();
        uint64_t above = 0;
        auto at = [&](size_t i) { return cand.begin() + static_cast<std::ptrdiff_t>(i); };
        while (hi - lo > 32) {
            const size_t mid = lo + (hi - lo) / 2;
            std::nth_element(at(lo), at(mid), at(hi), better);
            uint64_t m = 0;
            for (size_t i = lo; i <= mid; ++i) m += cand[i].mass;
            if (static_cast<double>(above + m) >= target) {
                hi = mid + 1;
            } else {
                above += m;
                lo = mid + 1;
            }
        }
        std::sort(at(lo), at(hi), better);
        size_t kept = hi;
        for (size_t i = lo; i < hi; ++i) {
            above += cand[i].mass;
            if (static_cast<double>(above) >= target) {
                kept = i + 1;   // the token that crosses the threshold is kept
                break;
            }
        }
        cand.resize(std::max<size_t>(kept, 1));
        id_order = false;
    }
    std::span<Candidate> live(cand);

    // --- temperature, then normalise. Id order: canonical (the sums below do not depend on
    // how the steps above permuted the candidates), and lets callers find p(t) by binary search.
    if (!id_order)
        std::sort(live.begin(), live.end(), [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
    const double inv_t = 1.0 / static_cast<double>(params.temp);
    std::vector<double> w(live.size());
    double sum = 0.0;
    for (size_t i = 0; i < live.size(); ++i) {
        w[i] = std::exp((static_cast<double>(live[i].logit) - max_logit) * inv_t);
        sum += w[i];
    }
    std::vector<TokenProb> out(live.size());
    for (size_t i = 0; i < live.size(); ++i) out[i] = {live[i].id, static_cast<float>(w[i] / sum)};
    return out;
}

} // namespace

int32_t argmax_lowest(std::span<const float> logits) {
    int32_t best = 0;
    float best_v = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < logits.size(); ++i) {
        // Strictly greater: the first (lowest) index keeps an exact tie.
        if (logits[i] > best_v) {
            best_v = logits[i];
            best = static_cast<int32_t>(i);
        }
    }
    return best;
}

LogitPenalties penalties_of(std::span<const int32_t> history, const SamplingParams& params) {
    LogitPenalties out;
    if (!penalties_active(params)) return out;
    out.repeat = params.repeat_penalty;
    out.frequency = params.frequency_penalty;
    out.presence = params.presence_penalty;
    std::span<const int32_t> window = penalty_window(history, params.repeat_last_n);
    // The window is small (64 by default): sorting a copy counts occurrences without a hash map.
    std::vector<int32_t> seen(window.begin(), window.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
        size_t j = i;
        while (j < seen.size() && seen[j] == seen[i]) ++j;
        out.seen.push_back({seen[i], static_cast<int32_t>(j - i)});
        i = j;
    }
    return out;
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const SamplingParams& params) {
    apply_logit_penalties(logits, penalties_of(history, params));
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

void Sampler::reseed(uint64_t seed) {
    params_.seed = seed;
    rng_.seed(seed);
}

double Sampler::uniform() {
    // The top 53 bits of one 64-bit output, scaled: exact doubles in [0, 1).
    return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits, std::span<const int32_t> history) const {
    if (logits.empty()) return {};

    std::vector<float> penalised;
    if (penalties_active(params_)) {
        penalised.assign(logits.begin(), logits.end());
        apply_penalties(penalised, history, params_);
        logits = penalised;
    }

    if (greedy()) return {{argmax_lowest(logits), 1.0f}};

    // --- top-k. One pass with a k-element heap whose front is the worst kept candidate: almost
    // every logit is rejected by one comparison, so 40 of 262k cost about one read of the row
    // (a full nth_element over 262k pairs measured ~4x slower).
    std::vector<Candidate> cand;
    const size_t n_vocab = logits.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n_vocab) {
        const size_t k = static_cast<size_t>(params_.top_k);
        cand.reserve(k);
        for (size_t i = 0; i < n_vocab; ++i) {
            const Candidate c{static_cast<int32_t>(i), clean(logits[i]), 0};
            if (cand.size() < k) {
                cand.push_back(c);
                std::push_heap(cand.begin(), cand.end(), better);
            } else if (better(c, cand.front())) {
                std::pop_heap(cand.begin(), cand.end(), better);
                cand.back() = c;
                std::push_heap(cand.begin(), cand.end(), better);
            }
        }
    } else {
        cand.resize(n_vocab);
        for (size_t i = 0; i < n_vocab; ++i) cand[i] = {static_cast<int32_t>(i), clean(logits[i]), 0};
    }

    // The heap permutes; the whole vocabulary is in id order.
    const bool id_order = !(params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n_vocab);
    return after_top_k(params_, std::move(cand), id_order);
}

int32_t Sampler::candidates_needed() const {
    if (greedy()) return 1;
    return params_.top_k > 0 && params_.top_k <= kMaxTopCandidates ? params_.top_k : 0;
}

std::vector<TokenProb> Sampler::distribution_top(std::span<const LogitCandidate> top) const {
    if (top.empty()) return {};
    std::vector<Candidate> cand(top.size());
    for (size_t i = 0; i < top.size(); ++i) cand[i] = {top[i].id, clean(top[i].logit), 0};
    // Greedy: the penalised argmax is the best candidate (argmax_lowest's rule in the total order).
    if (greedy()) return {{std::min_element(cand.begin(), cand.end(), better)->id, 1.0f}};
    return after_top_k(params_, std::move(cand), false);
}

int32_t Sampler::sample_top(std::span<const LogitCandidate> top) {
    return draw(distribution_top(top));
}

float probability_of(std::span<const TokenProb> dist, int32_t id) {
    auto it = std::lower_bound(dist.begin(), dist.end(), id, [](const TokenProb& t, int32_t v) { return t.id < v; });
    return it != dist.end() && it->id == id ? it->p : 0.0f;
}

int32_t Sampler::draw(std::span<const TokenProb> dist) {
    if (dist.empty()) return 0;
    if (dist.size() == 1) return dist[0].id;   // no RNG draw: greedy and forced tokens leave the stream alone
    const double u = uniform();
    double cum = 0.0;
    for (const TokenProb& t : dist) {
        cum += t.p;
        if (u < cum) return t.id;
    }
    return dist.back().id;   // rounding left cum a hair below 1
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history) {
    if (greedy() && !penalties_active(params_)) return argmax_lowest(logits);   // no copy on the hot path
    const std::vector<TokenProb> dist = distribution(logits, history);
    return draw(dist);
}

} // namespace tern
