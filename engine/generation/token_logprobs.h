#pragma once
// The log-probabilities of one generated token: the chosen token's and the N most likely ones', from the model's
// raw logit row (before penalties, temperature and truncation), as llama.cpp's n_probs and OpenAI's logprobs
// report them: logit minus the log-sum-exp of the whole row.
#include <cstdint>
#include <span>
#include <vector>

namespace tern {

struct TokenLogprob {
    int32_t id = 0;
    float logprob = 0.0f;
};

struct TokenLogprobs {
    int32_t token = 0;              // the token that was generated at this step
    float logprob = 0.0f;           // its log-probability
    std::vector<TokenLogprob> top;  // the most likely tokens, most likely first (ties: lower id first)
};

// `row`: the logits of one step (vocab floats). top_n: how many of the most likely tokens to list (clamped to
// the row's size). The log-sum-exp is accumulated in double, so a row of 150k logits loses no precision.
TokenLogprobs token_logprobs(std::span<const float> row, int32_t token, size_t top_n);

} // namespace tern
