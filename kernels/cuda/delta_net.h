#pragma once
// The Gated DeltaNet mixer's math on the GPU (kernels/cuda/delta_net.cu): the causal conv1d with its conv state,
// the per-head L2 norm of q and k, the gates, and the gated delta rule, for one sequence per call. The layer's
// steps, the GGUF tensors they read and the state layouts are those of kernels/cpu/gated_delta.h (the whole
// layer) and kernels/cpu/causal_conv1d.h, whose scalar twins these kernels are tested against
// (tests/cuda/test_cuda_delta_net.cpp). The gated RMSNorm of step 6 is rmsnorm_rows over the n_tokens * n_v_heads
// heads of d_v (one weight, ssm_norm) followed by swiglu(z, normed) (kernels/cuda/elementwise.h): the same floats
// as kernels/cpu/rmsnorm_gated.h. Every pointer is device memory; strides count floats.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// The largest conv kernel (d_conv) causal_conv1d takes.
inline constexpr int kMaxConvTapsGpu = 8;
// The largest d_k gated_delta takes (a warp holds a state row in registers: d_k / 32 floats a lane).
inline constexpr int kMaxDeltaKeyDim = 256;

// kernels/cpu/causal_conv1d.h on n_tokens rows of `channels`: w [channels][d_conv] (ssm_conv1d), state
// [d_conv - 1][channels] updated in place, y rows of `channels` (not overlapping x), silu applied when `silu`.
// A thread per channel (and per span of 16 tokens in a prefill), the window in registers; the CPU twin's fma
// chain and silu, so the same bits.
// d_conv in [1, kMaxConvTapsGpu]: std::invalid_argument otherwise.
void causal_conv1d(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                   int64_t n_tokens, int64_t channels, int d_conv, bool silu, cudaStream_t stream);

// kernels/cpu/gated_delta.h l2_normalize_heads on every token: n_heads heads of d floats at
// x + t * row_stride + j * d, each divided in place by sqrt(sum of squares (in double) + eps). One warp a head.
void l2_normalize_heads(float* x, int64_t n_tokens, int64_t row_stride, int n_heads, int d, float eps,
                        cudaStream_t stream);

// kernels/cpu/gated_delta.h gated_delta_gates on every token: g[t * out_stride + h] and beta[t * out_stride + h]
// from alpha / beta_in at t * in_stride + h, dt_bias[h] and a_neg_exp[h] (ssm_dt.bias, ssm_a).
void gated_delta_gates(const float* alpha, const float* beta_in, int64_t in_stride, const float* dt_bias,
                       const float* a_neg_exp, float* g, float* beta, int64_t out_stride, int64_t n_tokens,
                       int n_v_heads, cudaStream_t stream);

// Step 5 of kernels/cpu/gated_delta.h over n_tokens tokens of one sequence, the fields as GatedDeltaArgs's (v head
// h reads k / q head h % n_k_heads, or h / (n_v_heads / n_k_heads) with grouped_k_heads; state
// [n_v_heads][d_v][d_k] updated in place).
struct GatedDeltaParams {
    int64_t n_tokens = 0;
    int n_k_heads = 0, n_v_heads = 0, d_k = 0, d_v = 0;
    bool grouped_k_heads = false;
    const float* q = nullptr;
    int64_t q_stride = 0;
    const float* k = nullptr;
    int64_t k_stride = 0;
    const float* v = nullptr;
    int64_t v_stride = 0;
    const float* g = nullptr;
    const float* beta = nullptr;
    int64_t gb_stride = 0;
    float* state = nullptr;
    float* out = nullptr;
    int64_t out_stride = 0;
    float scale = 1.0f;
};

// The recurrence with the state in registers: a block per (v head, 16 state rows), each warp 4 rows whose d_k
// floats lie across its lanes; the state is read once, carried through the call's tokens (decode: one; prefill:
// all of them, token after token) and written once. d_k in [1, kMaxDeltaKeyDim]: std::invalid_argument otherwise.
void gated_delta(const GatedDeltaParams& p, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
