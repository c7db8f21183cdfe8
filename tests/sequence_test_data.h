#pragma once
// What the multi-sequence tests (test_multi_sequence, test_cuda_sequences) feed a backend and read back.
#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "engine/model.h"

namespace tern::test {

// n token ids drawn from [3, min(vocab, 500)): ordinary tokens of any of the shared models, never BOS/EOS.
inline std::vector<int32_t> random_tokens(const Model& m, int32_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int32_t> dist(3, std::min(m.config.vocab, 500) - 1);
    std::vector<int32_t> t;
    for (int32_t i = 0; i < n; ++i) t.push_back(dist(rng));
    return t;
}

// A copy of logit row r of the backend's last forward.
inline std::vector<float> logit_row(Backend& b, int r) {
    const std::span<const float> l = b.logits(r);
    return {l.begin(), l.end()};
}

} // namespace tern::test
