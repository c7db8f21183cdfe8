#pragma once
// Prefill attention on tensor cores (kernels/cuda/attention_mma.cu): the f16 mma twin of attention()
// (kernels/cuda/attention.h) for the shapes it takes, which attention() hands it when asked to
// (PrefillAttention::mma) and attention_mma_fits() says yes. Same contract as attention() (positions,
// sliding window, softcap, GQA groups, paged or contiguous KV, pos0_device), other arithmetic: q and the
// probabilities are rounded to f16 for the two products, which accumulate in f32, while the scores' scale,
// softcap, softmax and the output's normalisation stay f32. So it is not the f32 kernel's result but
// within a tolerance of it (tests/cuda/test_cuda_attention_mma.cpp states it).
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// The fewest query tokens worth a tensor-core launch: fewer (decode, draft verification) fill too few of
// a block's 64 rows and keep the f32 kernel, whose split-KV path suits them.
inline constexpr int64_t kMmaPrefillMinTokens = 16;

// Whether attention_mma takes these arguments: an f16 cache (the default KV type; the others keep the f32
// kernel rather than being converted while staged), equal K and V head dims of 64, 128 or 256, a GQA
// group of at most 64 (one block's rows), at least kMmaPrefillMinTokens tokens, and a device of compute
// capability 8.0 or later (the f16 mma shape; sm_75 builds compile the kernel but never launch it).
// Attention sinks (gpt-oss: a per-head logit in the softmax denominator) are not taken: a launch with
// sinks must keep the f32 kernel, so attention() asks for this one only without them.
bool attention_mma_fits(const KvLayer& layer, int64_t n, int32_t n_heads);

// attention() on tensor cores; the caller has checked attention_mma_fits and attention()'s own shape checks.
void attention_mma(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t pos0,
                   int32_t sliding_window, float scale, float softcap, float* att, cudaStream_t stream,
                   const int32_t* pos0_device = nullptr);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
