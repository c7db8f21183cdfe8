#pragma once
// What the multi-sequence tests (test_multi_sequence, test_cuda_sequences, test_cuda_split_sequences) feed a
// backend and read back, and how they compare the rows.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
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

// One sequence's part of a multi-sequence forward: its tokens, keeping its last row or all of them.
struct SequencePart {
    int32_t seq;
    std::vector<int32_t> tokens;
    LogitsWanted wanted = LogitsWanted::last;
};

// One forward of all the parts (ForwardBatch::spans, in order); its kept rows, in order.
inline std::vector<std::vector<float>> forward_parts(Backend& b, const std::vector<SequencePart>& parts) {
    std::vector<int32_t> toks;
    std::vector<SequenceSpan> spans;
    for (const SequencePart& p : parts) {
        toks.insert(toks.end(), p.tokens.begin(), p.tokens.end());
        spans.push_back({p.seq, static_cast<int32_t>(p.tokens.size()), p.wanted});
    }
    ForwardBatch batch;
    batch.tokens = toks;
    batch.spans = spans;
    b.forward(batch);
    std::vector<std::vector<float>> rows;
    for (const SequencePart& p : parts)
        for (size_t i = 0; i < (p.wanted == LogitsWanted::all ? p.tokens.size() : 1); ++i)
            rows.push_back(logit_row(b, static_cast<int>(rows.size())));
    return rows;
}

// max|got - want| / max|want|: how two backends' rows differ, relative to the row.
inline double normalised_error(const std::vector<float>& got, const std::vector<float>& want) {
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    }
    return err / scale;
}

inline int32_t argmax_of(const std::vector<float>& r) {
    return static_cast<int32_t>(std::max_element(r.begin(), r.end()) - r.begin());
}

// Greedy ids of two backends are compared where the reference's top two logits are further apart than this
// (relative to the row's largest magnitude): closer, either id is right.
inline constexpr double kNearTie = 2e-3;

inline bool clear_winner(const std::vector<float>& r) {
    std::vector<float> s = r;
    std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
    double scale = 0.0;
    for (float v : r) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    return (s[0] - s[1]) > kNearTie * scale;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
}

} // namespace tern::test
