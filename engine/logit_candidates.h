#pragma once
// The best few entries of a logit row after the sampler's penalties, so that a backend can select them
// where the logits are (the GPU) and hand back a few hundred bytes instead of the row (Backend::top_logits;
// engine/generation/sampler.h draws from them).
//
// The order is the sampler's total order: logit descending, id ascending on exact ties, NaN counted as
// -inf; -0.0 and +0.0 compare equal (the lower id first) and are both reported as +0.0, which no step
// after the selection can tell apart.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tern {

// The most candidates a backend selects: the sampler copies the whole row for a larger top-k. Selection
// on the GPU costs one block-wide round per candidate (kernels/cuda/sampling.h); at 256 that is still
// cheaper than copying a 262144-word row and selecting on the host, and top-k settings in use are far
// smaller (40 by default).
inline constexpr int32_t kMaxTopCandidates = 256;

struct LogitCandidate {
    int32_t id = 0;
    float logit = 0.0f;
    friend bool operator==(const LogitCandidate&, const LogitCandidate&) = default;
};

// One token of the penalty window and how often it occurs there.
struct PenaltyCount {
    int32_t id = 0;
    int32_t count = 0;
};

// The repetition / frequency / presence penalties of one sampling step: every distinct id of the window
// once (ids outside the vocabulary are skipped where applied), and the three factors. Empty `seen`: no
// penalty.
struct LogitPenalties {
    std::vector<PenaltyCount> seen;
    float repeat = 1.0f;
    float frequency = 0.0f;
    float presence = 0.0f;
};

// The penalty of one seen logit: a positive one divided by `repeat`, a negative one multiplied (dividing
// would raise it), then count * frequency + presence subtracted. Float operations one at a time, never
// contracted (the GPU twin in kernels/cuda/sampling.cu rounds each one alike).
inline float penalised_logit(float l, int32_t count, const LogitPenalties& p) {
    l = l > 0.0f ? l / p.repeat : l * p.repeat;
    const float minus = static_cast<float>(count) * p.frequency + p.presence;
    return l - minus;
}

// The penalties in place on a whole row.
void apply_logit_penalties(std::span<float> logits, const LogitPenalties& penalties);

// The min(out.size(), logits.size()) best candidates of `logits` after `penalties`, written to `out` in
// the total order above; returns how many. The host reference of every backend's top_logits.
size_t select_top_logits(std::span<const float> logits, const LogitPenalties& penalties,
                         std::span<LogitCandidate> out);

} // namespace tern
