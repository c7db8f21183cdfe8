#pragma once
// The best k entries of a logit row after the sampler's penalties, selected on the GPU
// (kernels/cuda/sampling.cu), so that a sampled decode step copies back k (id, logit) pairs instead of
// the row. Host-callable launcher; every pointer is device memory.
//
// The order is the sampler's (engine/generation/sampler.cpp): logit descending, index ascending on exact
// ties; NaN counts as -inf and is reported as -inf, -0.0 ties with +0.0 and is reported as +0.0. The
// selection compares only: the one arithmetic is the penalty, rounded exactly as the host's
// (engine/logit_candidates.h penalised_logit). So the result is exact and deterministic.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// The largest k top_logits selects: each candidate costs one block-wide round of every pass.
inline constexpr int kTopLogitsMax = 256;

// One selected entry (the layout of engine/logit_candidates.h LogitCandidate).
struct TopLogit {
    int32_t id;
    float logit;
};

// A token of the penalty window and how often it occurs there.
struct PenaltyPair {
    int32_t id;
    int32_t count;
};

// The penalties: `pairs` (device memory, n_pairs entries, distinct ids; ids outside the row are ignored)
// and the factors. A seen value l becomes (l > 0 ? l / repeat : l * repeat) - (count * frequency +
// presence), each operation rounded to float on its own.
struct TopLogitsPenalties {
    const PenaltyPair* pairs = nullptr;
    int32_t n_pairs = 0;
    float repeat = 1.0f;
    float frequency = 0.0f;
    float presence = 0.0f;
};

// Bytes of device scratch top_logits needs for a row of n with this k (0 when one block does it all).
int64_t top_logits_scratch_bytes(int64_t n, int k);

// out[0..k) = the k best entries of row[0..n) after `penalties`, best first; when k > n the entries past
// n are {-1, -inf}. The row is read, never written. 1 <= n < 2^31, 1 <= k <= kTopLogitsMax; `scratch`
// holds top_logits_scratch_bytes(n, k) bytes, 8-byte aligned. Throws std::invalid_argument for shapes
// outside the contract. Several launches on `stream`: blocks of 4096 entries each select their best k,
// then blocks of 4096 of those candidates, until one block remains.
void top_logits(const float* row, int64_t n, const TopLogitsPenalties& penalties, int k, TopLogit* out,
                void* scratch, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
