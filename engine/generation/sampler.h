#pragma once
// Sampler: logits -> next token id. Pure math plus one seeded RNG; no model, no device.
//
// The chain, in llama.cpp's default order (so users' habits and seeds-with-flags carry over):
//   penalties (repetition, frequency, presence over the last N tokens)
//   -> top-k -> top-p -> min-p -> temperature -> draw.
// top-p and min-p therefore see the un-tempered distribution; temperature only reshapes what
// survived. temp <= 0 is greedy: the penalised argmax, lowest id winning exact ties.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/logit_candidates.h"

namespace tern {

struct SamplingParams {
    float temp = 0.8f;             // <= 0: greedy
    int32_t top_k = 40;            // <= 0: off (whole vocabulary)
    float top_p = 0.95f;           // >= 1: off
    float min_p = 0.05f;           // <= 0: off; keeps p >= min_p * p_max
    float repeat_penalty = 1.0f;   // 1: off; > 1 discourages tokens seen in the window
    int32_t repeat_last_n = 64;    // window of the penalties; 0: off, -1: the whole history
    float frequency_penalty = 0.0f;   // minus count * this
    float presence_penalty = 0.0f;    // minus this once for any token seen
    uint64_t seed = 0;
};

// One surviving candidate of the chain with its final probability.
struct TokenProb {
    int32_t id = 0;
    float p = 0.0f;
};

class Sampler {
public:
    explicit Sampler(const SamplingParams& params);

    const SamplingParams& params() const { return params_; }
    bool greedy() const { return params_.temp <= 0.0f; }

    // The next token for this logit row. `history` is the token sequence so far (prompt and
    // generated); the penalties look at its last repeat_last_n entries.
    int32_t sample(std::span<const float> logits, std::span<const int32_t> history);

    // The distribution the chain draws from: the surviving candidates in id order, summing to 1
    // (probability_of finds p(t) by binary search). Greedy gives the single argmax with p = 1.
    // Speculative decoding needs p(t) of a drafted token and a draw from p without t.
    std::vector<TokenProb> distribution(std::span<const float> logits, std::span<const int32_t> history) const;

    // How many of a row's best candidates after the penalties the chain depends on: 1 when greedy, top_k
    // when 0 < top_k <= kMaxTopCandidates; 0 when it needs the whole row (top-k off or above the limit).
    // min-p, top-p, temperature and the draw only see the top-k set.
    int32_t candidates_needed() const;

    // sample() and distribution() from the row's min(candidates_needed(), vocab) best candidates after
    // the penalties (Backend::top_logits with penalties_of(history)), in any order: the same token, the
    // same use of the RNG and the same probabilities as from the whole row. Needs candidates_needed() > 0.
    int32_t sample_top(std::span<const LogitCandidate> top);
    std::vector<TokenProb> distribution_top(std::span<const LogitCandidate> top) const;

    // A draw from `dist` (as distribution() returns it) with the sampler's RNG.
    int32_t draw(std::span<const TokenProb> dist);

    // Uniform in [0, 1) from the sampler's RNG, 53 random bits. Built from raw 64-bit outputs
    // rather than std::uniform_real_distribution, whose algorithm the standard leaves to each
    // library: the same seed must give the same text on every platform.
    double uniform();

    void reseed(uint64_t seed);

private:
    SamplingParams params_;
    std::mt19937_64 rng_;   // its output sequence is fixed by the standard
};

// p(id) in a distribution() result; 0 when the chain dropped the token.
float probability_of(std::span<const TokenProb> dist, int32_t id);

// The penalties step alone, in place, for tests and for callers that build their own chain.
// llama.cpp semantics: a seen token's positive logit is divided by repeat_penalty and a negative
// one multiplied; then count * frequency_penalty + (count > 0) * presence_penalty is subtracted.
void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const SamplingParams& params);

// The same penalties as a backend applies them (engine/logit_candidates.h): each distinct id of the last
// repeat_last_n tokens once, in id order, with its count; nothing when the penalties are off.
LogitPenalties penalties_of(std::span<const int32_t> history, const SamplingParams& params);

// Index of the largest value, lowest index on exact ties (NaN never wins).
int32_t argmax_lowest(std::span<const float> logits);

} // namespace tern
