#pragma once
// The mixture-of-experts pieces around the expert matmuls (kernels/cuda/moe.cu): the router's choice of experts
// per token, the weighted sum of a token's expert outputs, the experts' biases on the slots that ran them, and the
// row moves that group a batch's slots by expert. Host-callable launchers; every pointer is device memory, f32
// row-major. The expert projections themselves are matmul_experts / matmul_q8_experts (kernels/cuda/matmul.h,
// matmul_q8.h) or, over the tokens grouped by expert, the plain matmul and GEMM launchers.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// How router logits become experts and weights: engine/moe_router.h's route_experts, whose arithmetic this
// follows (the engine's ModelConfig fields, as the kernels see them).
struct RouterParams {
    int n_expert = 0;             // 1 .. kMaxRouterExperts
    int n_used = 0;               // 1 .. min(n_expert, kMaxRouterUsed)
    bool sigmoid = false;         // probabilities by sigmoid, else softmax
    bool softmax_weight = false;  // (gpt-oss) the top n_used by logit, then a softmax over those n_used logits only
    bool normalize = false;       // weights divided by their sum (clamped below at 2^-14)
    float scale = 1.0f;           // then times this
    // (n_expert, glm4moe's exp_probs_b) added to the probabilities to rank them, not to weigh them; null: none.
    const float* selection_bias = nullptr;
};
inline constexpr int kMaxRouterExperts = 1024;
inline constexpr int kMaxRouterUsed = 64;

// For each of n tokens, from its logits row (n_expert): ids (n, n_used) the experts most probable first, ties
// to the lower id, and weights (n, n_used). The choice is route_experts' whenever the CPU's top probabilities
// are not tied: both gatings are monotone, so the kernel ranks the logits themselves (exactly, where an exp
// on the device may round an ulp away from the host's), except where route_experts' softmax sum is not a
// positive number (a NaN or infinite logit), where it ranks the same probabilities the host does. The weights
// are route_experts' up to the device's expf (within a few ulp). One warp per token. softmax_weight ranks the
// logits as the host does (its selection compares the logits themselves) and weighs the chosen ones by the
// host's softmax over them (the largest first, the sum in double). With a selection bias the kernel ranks the
// host's key, probability + bias, computed as the host does (one rounding each, the probability from the device's
// expf: a near tie may rank the other way).
void route_experts(const float* logits, int64_t n, const RouterParams& params, int32_t* ids, float* weights,
                   cudaStream_t stream);

// out (n, dim) = for each token t, sum over ranks r of weights[t, r] * y[t * n_used + r] (y: n * n_used rows of
// dim), in rank order with one rounding per product and per sum: the CPU's (engine/cpu/backend_cpu_moe.cpp)
// bits. out must not overlap y.
void moe_combine(const float* y, const float* weights, int64_t n, int64_t n_used, int64_t dim, float* out,
                 cudaStream_t stream);

// y row s += bias row ids[s] for s < n_slots, rows of `width`: an expert's bias (a stack of one bias row per
// expert, gpt-oss) on the slots that ran it, one f32 addition each, the bits of a projection that adds its bias.
void add_expert_bias(float* y, const int32_t* ids, const float* bias, int64_t n_slots, int64_t width,
                     cudaStream_t stream);

// dst row (dst_rows ? dst_rows[i] : i) = src row (src_rows ? src_rows[i] : i) for i < n, rows of `width`:
// gathering a batch's rows by expert and scattering the results back. Rows named twice in dst_rows race.
void copy_rows(const float* src, const int32_t* src_rows, float* dst, const int32_t* dst_rows, int64_t n,
               int64_t width, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
