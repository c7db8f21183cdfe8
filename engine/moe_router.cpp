#include "engine/moe_router.h"

#include <algorithm>
#include <cmath>

namespace tern {

void route_experts(const float* logits, const ModelConfig& c, float* probs, int32_t* ids, float* weights,
                   const float* selection_bias) {
    const int32_t n = c.n_expert, k = c.n_expert_used;
    if (c.expert_gating == ExpertGating::softmax) {
        float max = -INFINITY;
        for (int32_t e = 0; e < n; ++e)
            if (logits[e] > max) max = logits[e];
        double sum = 0.0;
        for (int32_t e = 0; e < n; ++e) {
            probs[e] = std::exp(logits[e] - max);
            sum += probs[e];
        }
        const float inv = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0f;
        for (int32_t e = 0; e < n; ++e) probs[e] *= inv;
    } else if (c.expert_gating == ExpertGating::sigmoid) {
        for (int32_t e = 0; e < n; ++e) probs[e] = 1.0f / (1.0f + std::exp(-logits[e]));
    } else {   // softmax_weight: select by the logits themselves, the softmax comes after the top k
        std::copy(logits, logits + n, probs);
    }
    // The ranking key: the probability, or the probability plus the selection bias.
    const float* key = probs;
    if (selection_bias) {
        float* biased = probs + n;
        for (int32_t e = 0; e < n; ++e) biased[e] = probs[e] + selection_bias[e];
        key = biased;
    }
    // Top-k by selection: k passes, each taking the largest key not yet taken (the first of equals).
    for (int32_t r = 0; r < k; ++r) {
        int32_t best = -1;
        for (int32_t e = 0; e < n; ++e) {
            bool taken = false;
            for (int32_t j = 0; j < r && !taken; ++j) taken = ids[j] == e;
            if (taken) continue;
            if (best < 0 || key[e] > key[best] || (std::isnan(key[best]) && !std::isnan(key[e]))) best = e;
        }
        ids[r] = best;
        weights[r] = probs[best];
    }
    if (c.expert_gating == ExpertGating::softmax_weight) {
        // A softmax over the k chosen logits, the largest first (ids are in descending order).
        const float max = weights[0];
        double sum = 0.0;
        for (int32_t r = 0; r < k; ++r) {
            weights[r] = std::exp(weights[r] - max);
            sum += weights[r];
        }
        const float inv = static_cast<float>(1.0 / sum);
        for (int32_t r = 0; r < k; ++r) weights[r] *= inv;
    }
    if (c.expert_weights_norm) {
        float sum = 0.0f;
        for (int32_t r = 0; r < k; ++r) sum += weights[r];
        if (!(sum >= 6.103515625e-5f)) sum = 6.103515625e-5f;
        for (int32_t r = 0; r < k; ++r) weights[r] /= sum;
    }
    if (c.expert_weights_scale != 1.0f)
        for (int32_t r = 0; r < k; ++r) weights[r] *= c.expert_weights_scale;
}

} // namespace tern
