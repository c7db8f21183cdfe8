#pragma once
// The short causal convolution of a recurrent mixer (Gated DeltaNet in Qwen3.5 / Qwen3-Next, and Mamba-style
// layers): each channel filtered over time by its own d_conv taps, the last d_conv - 1 inputs carried between
// calls as the conv state, so a prefill of many tokens and decode steps of one token give the same outputs.
//
// One sequence, one call (a prefill chunk or a decode step):
//   x      n_tokens rows of `channels` floats, row t at x + t * x_stride: the mixer's input projection. For
//          Qwen3.5 the product with blk.N.attn_qkv.weight (ne {n_embd, conv_dim}), channels
//          conv_dim = 2 * n_k_heads * d_k + n_v_heads * d_v in the order q | k | v.
//   w      [channels][d_conv] floats, a channel's taps contiguous, tap 0 against the oldest input: GGUF
//          blk.N.ssm_conv1d.weight, ne {d_conv, channels} (d_conv = {arch}.ssm.conv_kernel, 4 for Qwen3.5),
//          read as f32.
//   state  [d_conv - 1][channels] floats, row 0 the oldest input before x; zeros for a new sequence. Updated in
//          place to the last d_conv - 1 rows of (state, x).
//   y      n_tokens rows of `channels`, row t at y + t * y_stride (must not overlap x or state):
//          y[t][c] = sum_{i < d_conv} w[c][i] * in[t + i][c], in = the state's rows followed by x's;
//          then silu(y) (silu_f32, kernels/cpu/ops.h) when `silu` (Qwen3.5 always applies it).
// Each output is one fused multiply-add chain over the taps in order 0..d_conv-1 starting from 0, so the SIMD
// kernels and this scalar twin give the same bits. Channels are independent: callers split [c_begin, c_end)
// over threads.
#include <cstdint>

namespace tern {

inline constexpr int kMaxConvTaps = 64;   // the largest d_conv the kernels take

struct CausalConv1dArgs {
    int64_t n_tokens = 0;
    int64_t channels = 0;
    int d_conv = 0;   // in [1, kMaxConvTaps]; std::invalid_argument otherwise
    const float* x = nullptr;
    int64_t x_stride = 0;
    const float* w = nullptr;
    float* state = nullptr;
    float* y = nullptr;
    int64_t y_stride = 0;
    bool silu = true;
};

// Channels [c_begin, c_end) of the convolution above: the scalar twin. A set's kernel is CpuKernels::causal_conv1d
// (dispatch.h): AVX2 (causal_conv1d_avx2.cpp) in the x86 SIMD sets, this twin elsewhere.
void causal_conv1d_scalar(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end);
// Row r of (state, x): state row r for r < d_conv - 1, else x row r - (d_conv - 1) (the kernels' helpers).
const float* causal_conv1d_input_row(const CausalConv1dArgs& a, int64_t r);
// The state's channels [c_begin, c_end) moved on by the call's n_tokens inputs (after every output is written).
void causal_conv1d_shift_state(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end);
// The set's kernel over every channel.
void causal_conv1d(const CausalConv1dArgs& a);

} // namespace tern
