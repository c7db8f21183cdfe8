#pragma once
// The mixture-of-experts router's choice for one token, the same arithmetic for every backend: from the
// router's logits (n_expert), the n_used experts a token runs and the weight each one's output gets.
#include <cstdint>

#include "engine/model_config.h"

namespace tern {

// probabilities = softmax(logits) or sigmoid(logits), or the logits themselves for softmax_weight
// (config.expert_gating); ids = the n_used most probable experts, most probable first, ties to the lower expert id
// (llama.cpp's argsort leaves the order of equal values unspecified); weights = their probabilities (softmax_weight:
// a softmax over the n_used chosen logits), divided by their sum when config.expert_weights_norm (the sum clamped
// below at 2^-14, as llama.cpp does), times config.expert_weights_scale. NaN logits are never preferred to
// numbers. selection_bias (n_expert, glm4moe's exp_probs_b; null: none) is added to the probabilities to rank them
// only: the weights are the unbiased probabilities, as llama.cpp's build_moe_ffn does. `probs` is scratch of
// 2 n_expert floats.
void route_experts(const float* logits, const ModelConfig& config, float* probs, int32_t* ids, float* weights,
                   const float* selection_bias = nullptr);

} // namespace tern
