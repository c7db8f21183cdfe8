#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace tern {

namespace {

struct Candidate {
    int32_t id;
    float logit;
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

void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const SamplingParams& params) {
    if (!penalties_active(params)) return;
    std::span<const int32_t> window = penalty_window(history, params.repeat_last_n);
    // The window is small (64 by default): sorting a copy counts occurrences without a hash map.
    std::vector<int32_t> seen(window.begin(), window.end());
    std::sort(seen.begin(), seen.end());
    for (size_t i = 0; i < seen.size();) {
        size_t j = i;
        while (j < seen.size() && seen[j] == seen[i]) ++j;
        const int32_t id = seen[i];
        const auto count = static_cast<float>(j - i);
        i = j;
        if (id < 0 || static_cast<size_t>(id) >= logits.size()) continue;
        float& l = logits[static_cast<size_t>(id)];
        // Dividing a negative logit would raise it, so negative ones are multiplied instead.
        l = l > 0.0f ? l / params.repeat_penalty : l * params.repeat_penalty;
        l -= count * params.frequency_penalty + params.presence_penalty;
    }
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

    std::vector<Candidate> cand(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) cand[i] = {static_cast<int32_t>(i), clean(logits[i])};

    // top-k: an O(n) selection, then only k candidates go on.
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < cand.size()) {
        auto kth = cand.begin() + params_.top_k;
        std::nth_element(cand.begin(), kth - 1, cand.end(), better);
        cand.resize(static_cast<size_t>(params_.top_k));
    }

    float max_logit = -std::numeric_limits<float>::infinity();
    for (const Candidate& c : cand) max_logit = std::max(max_logit, c.logit);
    if (!std::isfinite(max_logit)) {
        // Every logit is -inf (or +inf appears): no meaningful softmax; fall back to the argmax.
        return {{std::min_element(cand.begin(), cand.end(), better)->id, 1.0f}};
    }
    // Softmax normaliser of the top-k set, which top-p's cumulative probabilities refer to.
    double z = 0.0;
    for (const Candidate& c : cand) z += std::exp(static_cast<double>(c.logit) - max_logit);

    // min-p before the sort even though the chain applies it after top-p: both keep a prefix
    // of the sorted candidates, so the result is the shorter prefix either way, and filtering
    // first makes the sort small (min-p 0.05 typically leaves a handful of 262k candidates).
    if (params_.min_p > 0.0f) {
        const double min_logit = max_logit + std::log(static_cast<double>(params_.min_p));
        std::erase_if(cand, [&](const Candidate& c) { return static_cast<double>(c.logit) < min_logit; });
    }

    if (params_.top_p < 1.0f) {
        // Sort a growing prefix until the cumulative probability reaches top_p: with min-p and
        // top-k off this avoids sorting the whole vocabulary every token.
        const double target = static_cast<double>(params_.top_p);
        double cum = 0.0;
        size_t sorted = 0, kept = cand.size();
        bool done = false;
        for (size_t want = 64; !done; want *= 4) {
            const size_t m = std::min(want, cand.size());
            std::partial_sort(cand.begin() + static_cast<std::ptrdiff_t>(sorted),
                              cand.begin() + static_cast<std::ptrdiff_t>(m), cand.end(), better);
            for (; sorted < m; ++sorted) {
                cum += std::exp(static_cast<double>(cand[sorted].logit) - max_logit) / z;
                if (cum >= target) {
                    kept = sorted + 1;   // keep the token that crossed the threshold
                    done = true;
                    break;
                }
            }
            if (m == cand.size()) done = true;
        }
        cand.resize(std::max<size_t>(kept, 1));
    } else {
        std::sort(cand.begin(), cand.end(), better);
    }

    // Temperature last; the max logit survived every step, so it is still the reference.
    const double inv_t = 1.0 / static_cast<double>(params_.temp);
    std::vector<double> w(cand.size());
    double sum = 0.0;
    for (size_t i = 0; i < cand.size(); ++i) {
        w[i] = std::exp((static_cast<double>(cand[i].logit) - max_logit) * inv_t);
        sum += w[i];
    }
    std::vector<TokenProb> out(cand.size());
    for (size_t i = 0; i < cand.size(); ++i) out[i] = {cand[i].id, static_cast<float>(w[i] / sum)};
    return out;
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
