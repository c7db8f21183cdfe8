#pragma once
// The gated delta rule: the recurrence at the heart of a Gated DeltaNet linear-attention layer (the
// `linear_attention` layers of Qwen3.5 "qwen35" and Qwen3-Next "qwen3next"), as a one-token-at-a-time
// recurrent kernel and a chunked kernel for prefill that computes the same thing, plus the small per-token
// steps around it (the gates, the per-head L2 norm of q and k).
//
// The whole layer, as the wiring of a MixerKind::gated_delta_net step follows it (Qwen3.5 GGUF names;
// x is the attn_norm'ed hidden state of one token, every tensor read as f32, ne as GGUF lists them):
//   hyper-parameters: d_conv = {arch}.ssm.conv_kernel, d_k = {arch}.ssm.state_size, n_k_heads =
//     {arch}.ssm.group_count, n_v_heads = {arch}.ssm.time_step_rank (a multiple of n_k_heads), d_v =
//     {arch}.ssm.inner_size / n_v_heads (= d_k in every file), eps = {arch}.attention.layer_norm_rms_epsilon.
//     Which layers: {arch}.attention.recurrent_layers (one bool per layer) when present, else layer i is linear
//     when (i + 1) % {arch}.full_attention_interval != 0 (interval 4 when the key is missing).
//   1. qkv = attn_qkv.weight (ne {n_embd, conv_dim}) x,  conv_dim = 2 * n_k_heads * d_k + n_v_heads * d_v
//      z   = attn_gate.weight (ne {n_embd, n_v_heads * d_v}) x
//      b   = ssm_beta.weight  (ne {n_embd, n_v_heads}) x,   a = ssm_alpha.weight (ne {n_embd, n_v_heads}) x
//      Qwen3-Next ("qwen3next") GGUFs have either these attn_qkv / attn_gate tensors or the older ssm_in (ne
//      {n_embd, 2 n_k_heads d_k + 2 n_v_heads d_v}: per k head j, its q (d_k), k (d_k), then its r = n_v/n_k v
//      heads, then their z, which the wiring regroups into q | k | v rows and z), and always ssm_ba instead of
//      ssm_beta / ssm_alpha (ne {n_embd, 2 n_v_heads}: per k head j, the b of its r v heads then their a).
//   2. c = silu(causal_conv1d(qkv; ssm_conv1d.weight ne {d_conv, conv_dim}; conv state)) (causal_conv1d.h);
//      q = c[0, n_k_heads*d_k), k = c[n_k_heads*d_k, 2*n_k_heads*d_k), v = the rest; head j of each at j*d.
//   3. q and k: each head divided by sqrt(sum of squares + eps) (l2_normalize_heads; the same eps as the
//      RMSNorms). The scale 1/sqrt(d_k) of q is the kernels' `scale`, applied to the output instead.
//   4. per v head h: g = softplus(a[h] + ssm_dt.bias[h]) * ssm_a[h] (ssm_a holds -exp(A_log), so g < 0),
//      beta = sigmoid(b[h]) (gated_delta_gates).
//   5. per v head h, with its k head kh = h % n_k_heads for Qwen3.5 (its converter reorders the v heads so that
//      the k heads tile) and kh = h / (n_v_heads / n_k_heads) for Qwen3-Next (v heads grouped by k head: the
//      `grouped_k_heads` flag), the state S_h of d_v rows of d_k floats (row i belongs to output i):
//        S_h <- exp(g) * S_h                      (decay)
//        d_i  = beta * (v_h[i] - S_h[i] . k_kh)    for every row i (the delta against the decayed state)
//        S_h[i] <- S_h[i] + d_i * k_kh             (rank-one update)
//        o_h[i] = scale * (S_h[i] . q_kh)          (read with the updated state), scale = 1/sqrt(d_k)
//      i.e. S_t = e^g S_{t-1} + beta k (v - e^g S_{t-1}^T k)^T in the [d_k][d_v] orientation, o = S_t^T q.
//   6. y = rmsnorm(o_h; ssm_norm.weight ne {d_v}, shared by the heads, as stored: no +1) * silu(z_h), per v
//      head (rmsnorm_gated_f32, rmsnorm_gated.h).
//   7. out = ssm_out.weight (ne {n_v_heads * d_v, n_embd}) y, added to the residual like attention's output.
//   Per sequence the layer carries two states: the conv state ([d_conv - 1][conv_dim] floats, time-major: the
//   transpose of llama.cpp's [conv_dim][d_conv - 1] cache rows) and S ([n_v_heads][d_v][d_k] floats, element
//   (i, j) at i * d_k + j: the same floats in the same order as llama.cpp's ssm state rows), both zero at the
//   start of a sequence.
//
// The kernels below take step 5 for one sequence over n_tokens tokens (q, k already L2-normalised; g and beta
// from step 4) and heads [h_begin, h_end) (the heads are independent: callers split them over threads).
#include <cstdint>

#include "kernels/cpu/dispatch.h"

namespace tern {

struct GatedDeltaArgs {
    int64_t n_tokens = 0;
    int n_k_heads = 0, n_v_heads = 0;   // n_v_heads a multiple of n_k_heads
    bool grouped_k_heads = false;       // v head h reads k head h / (n_v / n_k) (qwen3next), else h % n_k (qwen35)
    int d_k = 0, d_v = 0;
    const float* q = nullptr;   // token t, k head j: q + t * q_stride + j * d_k
    int64_t q_stride = 0;
    const float* k = nullptr;   // likewise
    int64_t k_stride = 0;
    const float* v = nullptr;   // token t, v head h: v + t * v_stride + h * d_v
    int64_t v_stride = 0;
    const float* g = nullptr;      // token t, v head h: g[t * gb_stride + h] (the log of the decay, <= 0)
    const float* beta = nullptr;   // likewise, in [0, 1]
    int64_t gb_stride = 0;
    float* state = nullptr;   // [n_v_heads][d_v][d_k], updated in place
    float* out = nullptr;     // token t, v head h: out + t * out_stride + h * d_v
    int64_t out_stride = 0;
    float scale = 1.0f;       // 1/sqrt(d_k) for the models above
    int chunk = 64;           // the chunked kernels' tokens per chunk (>= 1)
};

// Step 5 token after token (the decode kernel; also the reference of the chunked one): the scalar twin. The
// set's kernel is CpuKernels::gated_delta_recurrent (gated_delta_avx2.cpp, gated_delta_avx512.cpp).
void gated_delta_recurrent_scalar(const GatedDeltaArgs& a, int h_begin, int h_end);

// Step 5 chunk by chunk, for prefill: within a chunk of C tokens starting from state S0, with G_t the running
// sum of g from the chunk's start (in double) and E_ts = exp(G_t - G_s), the deltas solve the unit lower-
// triangular system  u_t + beta_t sum_{s<t} E_ts (k_s . k_t) u_s = beta_t (v_t - exp(G_t) S0 k_t),  then
// o_t = scale (exp(G_t) S0 q_t + sum_{s<=t} E_ts (k_s . q_t) u_s)  and  S <- exp(G_C) S0 + sum_s E_Cs u_s k_s^T.
// The same quantities as the recurrence in exact arithmetic; S0 is read once per chunk instead of once per token.
// Scratch per thread (thread_local). The scalar twin; the set's kernel is CpuKernels::gated_delta_chunked.
void gated_delta_chunked_scalar(const GatedDeltaArgs& a, int h_begin, int h_end);

// The set's recurrent kernel over every head, for decode and prefill alike. With these loops the chunked form does
// about twice the recurrence's multiply-adds (the key-key and key-query products come on top of the state passes)
// and is slower on the CPU. 512 tokens of 32 v heads, d_k = d_v = 128, one thread of the shared 2-core Xeon
// (load ~7, so ranges over runs): recurrent AVX2 100-210 ms, AVX-512 120-150 ms, scalar 350-620 ms; chunked (64)
// AVX2 260-410 ms, AVX-512 280-330 ms, scalar 730-1100 ms; one decode token of the 32 heads 0.12-0.2 ms (SIMD).
// It pays with blocked matrix products (tensor cores, a GEMM micro-kernel); it is here as their verified reference.
void gated_delta(const GatedDeltaArgs& a);

// Step 4 for one token: g[h] = softplus(alpha[h] + dt_bias[h]) * a_neg_exp[h], beta[h] = sigmoid(beta_in[h]),
// h < n_v_heads (softplus(x) = x above 20, log1p(exp(x)) otherwise). alpha/beta_in: the ssm_alpha / ssm_beta
// products; dt_bias: ssm_dt.bias; a_neg_exp: ssm_a.
void gated_delta_gates(const float* alpha, const float* beta_in, const float* dt_bias, const float* a_neg_exp,
                       float* g, float* beta, int n_v_heads);

// Step 3: each of n_heads heads of d floats (head j at x + j * d) divided in place by sqrt(sum of squares + eps),
// the sum in double.
void l2_normalize_heads(float* x, int64_t n_heads, int64_t d, float eps);

} // namespace tern
