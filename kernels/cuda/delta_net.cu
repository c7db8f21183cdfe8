// The Gated DeltaNet kernels (kernels/cuda/delta_net.h).
//
// causal_conv1d: up to kConvSpan tokens (decode), a thread per channel keeps its window of d_conv inputs in
//   registers (D a template argument), walks the tokens and moves the state on; more tokens (prefill), a thread
//   per (channel, span of kConvSpan tokens) does the same over its span, and a second kernel moves the state on.
//   The output is the CPU twin's fma chain from 0 over taps 0..D-1 (__fmaf_rn) and silu_f32 (activations.cuh,
//   tern's exp_f32), so the bits are the CPU's.
// gated_delta: state row i of v head h (d_k floats) lives in one warp's registers, element j in lane j % 32, slot
//   j / 32 (E = ceil(d_k / 32) slots a lane, a template argument); a warp holds kRows rows and a block kWarps warps.
//   Per token: each row's dots with k and q (before the update) and k . q are butterfly warp reductions done
//   together; the output is e (s . q) + delta (k . q), as the CPU's recurrent kernel computes it; k and q are read
//   once per token by every warp from global memory (L1 / L2 hits).
//   The CPU twin sums in another order: equal to rounding, not bit for bit.
// l2_normalize_heads: a warp per head, the sum of squares in double as the CPU's.
// gated_delta_gates: a thread per (token, head), the CPU's double softplus and sigmoid.
#include "kernels/cuda/delta_net.h"

#include <stdexcept>
#include <string>

#include "kernels/cuda/activations.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/unroll.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace {

constexpr int kConvThreads = 128;

template <int D>
__global__ void causal_conv1d_kernel(const float* x, int64_t x_stride, const float* w, float* state, float* y,
                                     int64_t y_stride, int64_t n_tokens, int64_t channels, bool silu) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    float taps[D], win[D];
TERN_UNROLL
    for (int i = 0; i < D; ++i) taps[i] = w[c * D + i];
TERN_UNROLL
    for (int i = 0; i + 1 < D; ++i) win[i] = state[i * channels + c];
    for (int64_t t = 0; t < n_tokens; ++t) {
        win[D - 1] = x[t * x_stride + c];
        float acc = 0.0f;
TERN_UNROLL
        for (int i = 0; i < D; ++i) acc = __fmaf_rn(taps[i], win[i], acc);
        y[t * y_stride + c] = silu ? silu_f32(acc) : acc;
TERN_UNROLL
        for (int i = 0; i + 1 < D; ++i) win[i] = win[i + 1];
    }
TERN_UNROLL
    for (int i = 0; i + 1 < D; ++i) state[i * channels + c] = win[i];
}

// Prefill: thread (channel, span of kConvSpan tokens) slides its window over its span, reading the inputs of
// (state, x) directly; the state is moved on afterwards by conv_shift_state_kernel (the spans read it).
constexpr int kConvSpan = 16;

__device__ __forceinline__ float conv_input(const float* x, int64_t x_stride, const float* state, int64_t channels,
                                            int d, int64_t r, int64_t c) {
    return r < d - 1 ? state[r * channels + c] : x[(r - (d - 1)) * x_stride + c];
}

template <int D>
__global__ void causal_conv1d_span_kernel(const float* x, int64_t x_stride, const float* w, const float* state,
                                          float* y, int64_t y_stride, int64_t n_tokens, int64_t channels, bool silu) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    const int64_t t0 = static_cast<int64_t>(blockIdx.y) * kConvSpan;
    const int64_t t1 = t0 + kConvSpan < n_tokens ? t0 + kConvSpan : n_tokens;
    float taps[D], win[D];
TERN_UNROLL
    for (int i = 0; i < D; ++i) taps[i] = w[c * D + i];
TERN_UNROLL
    for (int i = 0; i + 1 < D; ++i) win[i] = conv_input(x, x_stride, state, channels, D, t0 + i, c);
    for (int64_t t = t0; t < t1; ++t) {
        win[D - 1] = conv_input(x, x_stride, state, channels, D, t + D - 1, c);
        float acc = 0.0f;
TERN_UNROLL
        for (int i = 0; i < D; ++i) acc = __fmaf_rn(taps[i], win[i], acc);
        y[t * y_stride + c] = silu ? silu_f32(acc) : acc;
TERN_UNROLL
        for (int i = 0; i + 1 < D; ++i) win[i] = win[i + 1];
    }
}

// New state row r is input row n_tokens + r of (state, x); rows in increasing order read old state rows that are
// not yet overwritten (n_tokens + r > r).
__global__ void conv_shift_state_kernel(const float* x, int64_t x_stride, float* state, int64_t n_tokens,
                                        int64_t channels, int d) {
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    for (int r = 0; r + 1 < d; ++r) state[r * channels + c] = conv_input(x, x_stride, state, channels, d, n_tokens + r, c);
}

__global__ void l2_normalize_heads_kernel(float* x, int64_t n_tokens, int64_t row_stride, int n_heads, int d,
                                          float eps) {
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    const int64_t head = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp;
    if (head >= n_tokens * n_heads) return;
    const int64_t t = head / n_heads;
    float* xh = x + t * row_stride + (head % n_heads) * static_cast<int64_t>(d);
    double ss = 0.0;
    for (int i = lane; i < d; i += 32) ss += static_cast<double>(xh[i]) * static_cast<double>(xh[i]);
    ss = warp_reduce(ss, SumOp{});
    const float inv = static_cast<float>(1.0 / sqrt(ss + static_cast<double>(eps)));
    for (int i = lane; i < d; i += 32) xh[i] = __fmul_rn(xh[i], inv);
}

__global__ void gated_delta_gates_kernel(const float* alpha, const float* beta_in, int64_t in_stride,
                                         const float* dt_bias, const float* a_neg_exp, float* g, float* beta,
                                         int64_t out_stride, int64_t n_tokens, int n_v_heads) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * n_v_heads) return;
    const int64_t t = i / n_v_heads;
    const int h = static_cast<int>(i % n_v_heads);
    const float xa = __fadd_rn(alpha[t * in_stride + h], dt_bias[h]);
    const float sp = xa > 20.0f ? xa : static_cast<float>(log1p(exp(static_cast<double>(xa))));
    g[t * out_stride + h] = __fmul_rn(sp, a_neg_exp[h]);
    beta[t * out_stride + h] = static_cast<float>(1.0 / (1.0 + exp(-static_cast<double>(beta_in[t * in_stride + h]))));
}

constexpr int kDeltaRows = 4;    // state rows a warp holds
constexpr int kDeltaWarps = 4;   // warps a block
constexpr int kDeltaRowsPerBlock = kDeltaRows * kDeltaWarps;

template <int E> __global__ void gated_delta_kernel(GatedDeltaParams p) {
    const int h = static_cast<int>(blockIdx.x);
    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    const int row0 = static_cast<int>(blockIdx.y) * kDeltaRowsPerBlock + warp * kDeltaRows;
    if (row0 >= p.d_v) return;   // a whole warp leaves together
    const int kh = p.grouped_k_heads ? h / (p.n_v_heads / p.n_k_heads) : h % p.n_k_heads;
    const int dk = p.d_k;
    float* S = p.state + static_cast<int64_t>(h) * p.d_v * dk;

    float s[kDeltaRows][E];
TERN_UNROLL
    for (int r = 0; r < kDeltaRows; ++r)
TERN_UNROLL
        for (int e = 0; e < E; ++e) {
            const int j = lane + 32 * e;
            s[r][e] = (row0 + r < p.d_v && j < dk) ? S[static_cast<int64_t>(row0 + r) * dk + j] : 0.0f;
        }

    for (int64_t t = 0; t < p.n_tokens; ++t) {
        const float* kt = p.k + t * p.k_stride + static_cast<int64_t>(kh) * dk;
        const float* qt = p.q + t * p.q_stride + static_cast<int64_t>(kh) * dk;
        const float* vt = p.v + t * p.v_stride + static_cast<int64_t>(h) * p.d_v;
        float* ot = p.out + t * p.out_stride + static_cast<int64_t>(h) * p.d_v;
        float kr[E], qr[E];
TERN_UNROLL
        for (int e = 0; e < E; ++e) {
            const int j = lane + 32 * e;
            kr[e] = j < dk ? kt[j] : 0.0f;
            qr[e] = j < dk ? qt[j] : 0.0f;
        }
        const float decay = static_cast<float>(exp(static_cast<double>(p.g[t * p.gb_stride + h])));
        const float beta = p.beta[t * p.gb_stride + h];
        // Every row's s . k and s . q from the state before the update, reduced together (independent
        // shuffles), and k . q once: the update's dot with q is e (s . q) + delta (k . q).
        float sk[kDeltaRows], sq[kDeltaRows], kq = 0.0f;
TERN_UNROLL
        for (int e = 0; e < E; ++e) kq = fmaf(kr[e], qr[e], kq);
TERN_UNROLL
        for (int r = 0; r < kDeltaRows; ++r) {
            sk[r] = 0.0f, sq[r] = 0.0f;
TERN_UNROLL
            for (int e = 0; e < E; ++e) {
                sk[r] = fmaf(s[r][e], kr[e], sk[r]);
                sq[r] = fmaf(s[r][e], qr[e], sq[r]);
            }
        }
TERN_UNROLL
        for (int offset = 16; offset > 0; offset /= 2) {
            kq += __shfl_xor_sync(0xFFFFFFFFu, kq, offset);
TERN_UNROLL
            for (int r = 0; r < kDeltaRows; ++r) {
                sk[r] += __shfl_xor_sync(0xFFFFFFFFu, sk[r], offset);
                sq[r] += __shfl_xor_sync(0xFFFFFFFFu, sq[r], offset);
            }
        }
TERN_UNROLL
        for (int r = 0; r < kDeltaRows; ++r) {
            const bool live = row0 + r < p.d_v;   // warp-uniform
            const float delta = live ? beta * (vt[row0 + r] - decay * sk[r]) : 0.0f;
TERN_UNROLL
            for (int e = 0; e < E; ++e) s[r][e] = fmaf(delta, kr[e], decay * s[r][e]);
            if (live && lane == 0) ot[row0 + r] = p.scale * (decay * sq[r] + delta * kq);
        }
    }

TERN_UNROLL
    for (int r = 0; r < kDeltaRows; ++r)
TERN_UNROLL
        for (int e = 0; e < E; ++e) {
            const int j = lane + 32 * e;
            if (row0 + r < p.d_v && j < dk) S[static_cast<int64_t>(row0 + r) * dk + j] = s[r][e];
        }
}

template <int D>
void launch_conv(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                 int64_t n_tokens, int64_t channels, bool silu, cudaStream_t stream) {
    const unsigned blocks = static_cast<unsigned>((channels + kConvThreads - 1) / kConvThreads);
    if (n_tokens <= kConvSpan) {
        launch(causal_conv1d_kernel<D>, dim3(blocks), dim3(kConvThreads), 0, stream, x, x_stride, w, state, y,
               y_stride, n_tokens, channels, silu);
        return;
    }
    const dim3 grid(blocks, static_cast<unsigned>((n_tokens + kConvSpan - 1) / kConvSpan));
    launch(causal_conv1d_span_kernel<D>, grid, dim3(kConvThreads), 0, stream, x, x_stride, w,
           static_cast<const float*>(state), y, y_stride, n_tokens, channels, silu);
    if (D > 1)
        launch(conv_shift_state_kernel, dim3(blocks), dim3(kConvThreads), 0, stream, x, x_stride, state, n_tokens,
               channels, D);
}

} // namespace

void causal_conv1d(const float* x, int64_t x_stride, const float* w, float* state, float* y, int64_t y_stride,
                   int64_t n_tokens, int64_t channels, int d_conv, bool silu, cudaStream_t stream) {
    if (channels <= 0 || n_tokens <= 0) return;
    switch (d_conv) {
        case 1: launch_conv<1>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        case 2: launch_conv<2>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        case 3: launch_conv<3>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        case 4: launch_conv<4>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        case 5: launch_conv<5>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        case 6: launch_conv<6>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        case 7: launch_conv<7>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        case 8: launch_conv<8>(x, x_stride, w, state, y, y_stride, n_tokens, channels, silu, stream); return;
        default: throw std::invalid_argument("causal_conv1d: d_conv " + std::to_string(d_conv) + " out of [1, 8]");
    }
}

void l2_normalize_heads(float* x, int64_t n_tokens, int64_t row_stride, int n_heads, int d, float eps,
                        cudaStream_t stream) {
    const int64_t heads = n_tokens * n_heads;
    if (heads <= 0 || d <= 0) return;
    constexpr int kWarps = 4;
    const dim3 grid(static_cast<unsigned>((heads + kWarps - 1) / kWarps));
    launch(l2_normalize_heads_kernel, grid, dim3(32 * kWarps), 0, stream, x, n_tokens, row_stride, n_heads, d, eps);
}

void gated_delta_gates(const float* alpha, const float* beta_in, int64_t in_stride, const float* dt_bias,
                       const float* a_neg_exp, float* g, float* beta, int64_t out_stride, int64_t n_tokens,
                       int n_v_heads, cudaStream_t stream) {
    const int64_t n = n_tokens * n_v_heads;
    if (n <= 0) return;
    constexpr int kThreads = 128;
    const dim3 grid(static_cast<unsigned>((n + kThreads - 1) / kThreads));
    launch(gated_delta_gates_kernel, grid, dim3(kThreads), 0, stream, alpha, beta_in, in_stride, dt_bias, a_neg_exp,
           g, beta, out_stride, n_tokens, n_v_heads);
}

void gated_delta(const GatedDeltaParams& p, cudaStream_t stream) {
    if (p.n_tokens <= 0 || p.n_v_heads <= 0 || p.d_v <= 0) return;
    if (p.d_k < 1 || p.d_k > kMaxDeltaKeyDim)
        throw std::invalid_argument("gated_delta: d_k " + std::to_string(p.d_k) + " out of [1, 256]");
    if (p.n_k_heads < 1 || p.n_v_heads % p.n_k_heads != 0)
        throw std::invalid_argument("gated_delta: v heads not a multiple of k heads");
    const dim3 grid(static_cast<unsigned>(p.n_v_heads),
                    static_cast<unsigned>((p.d_v + kDeltaRowsPerBlock - 1) / kDeltaRowsPerBlock));
    const dim3 block(32 * kDeltaWarps);
    switch ((p.d_k + 31) / 32) {
        case 1: launch(gated_delta_kernel<1>, grid, block, 0, stream, p); return;
        case 2: launch(gated_delta_kernel<2>, grid, block, 0, stream, p); return;
        case 3: launch(gated_delta_kernel<3>, grid, block, 0, stream, p); return;
        case 4: launch(gated_delta_kernel<4>, grid, block, 0, stream, p); return;
        case 5: launch(gated_delta_kernel<5>, grid, block, 0, stream, p); return;
        case 6: launch(gated_delta_kernel<6>, grid, block, 0, stream, p); return;
        case 7: launch(gated_delta_kernel<7>, grid, block, 0, stream, p); return;
        default: launch(gated_delta_kernel<8>, grid, block, 0, stream, p); return;
    }
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
