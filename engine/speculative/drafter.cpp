// The pieces every drafter shares (drafter.h): the measured cost of drafting, the acceptance rate
// and the draft length that maximises the expected speed.
#include "engine/speculative/drafter.h"

#include <algorithm>
#include <cmath>

namespace tern {

namespace {

constexpr double kPriorColumnCost = 0.25;              // until measured: a CPU verifies a column for ~1/4 step
constexpr double kCostSmoothing = 0.2;                 // weight of a new timing in the running averages
constexpr double kPriorHits = 0.5, kPriorTrials = 1.0; // a = 0.5 with no evidence, weighing little
// Per drafted token tried: the last ~20 tried tokens dominate, so a perfect run can reach a ~ 0.97
// (and long drafts) while a run of failures brings it down within a few dozen tokens.
constexpr double kDecay = 0.95;
constexpr double kForget = 0.9; // per withheld proposal: ~20 of them bring a dead rate back to a retry

double smooth(double old, double sample) {
    return old > 0.0 ? old + kCostSmoothing * (sample - old) : sample;
}

} // namespace

void DraftCost::record(int32_t tokens, double ms) {
    if (tokens < 1 || !(ms >= 0.0)) return;
    if (tokens == 1) {
        step_ms = smooth(step_ms, ms);
        return;
    }
    // No plain step timed yet (the very first step drafted): split by the prior.
    if (step_ms <= 0.0) step_ms = ms / (1.0 + kPriorColumnCost * (tokens - 1));
    const double per_column = std::max(0.0, (ms - step_ms) / (tokens - 1));
    column_ms = column_samples > 0 ? column_ms + kCostSmoothing * (per_column - column_ms) : per_column;
    ++column_samples;
}

double DraftCost::relative_column_cost() const {
    if (step_ms <= 0.0 || column_samples == 0) return kPriorColumnCost;
    return column_ms / step_ms;
}

double AcceptanceRate::rate() const {
    return (hits_ + kPriorHits) / (trials_ + kPriorTrials);
}

void AcceptanceRate::observe(int32_t proposed, int32_t accepted) {
    if (proposed <= 0) return;
    // Trials: the tokens that held, plus the first one that did not (the rest were never tried).
    const int32_t tried = accepted + (accepted < proposed ? 1 : 0);
    const double keep = std::pow(kDecay, tried);
    hits_ = hits_ * keep + accepted;
    trials_ = trials_ * keep + tried;
}

void AcceptanceRate::forget() {
    hits_ *= kForget;
    trials_ *= kForget;
}

int32_t best_draft_length(double acceptance, double cost_per_token, int32_t max_tokens) {
    int32_t best = 0;
    double best_speed = 1.0; // plain decoding: one token per step
    double tokens = 1.0, p = 1.0;
    for (int32_t k = 1; k <= max_tokens; ++k) {
        p *= acceptance;
        tokens += p;
        const double speed = tokens / (1.0 + k * cost_per_token);
        if (speed > best_speed) {
            best_speed = speed;
            best = k;
        }
    }
    return best;
}

} // namespace tern
