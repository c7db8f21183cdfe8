// The mixture-of-experts kernels around the expert matmuls (kernels/cuda/moe.h).
//
// route_experts: one warp per token. Lane l holds experts l, l + 32, ...: a softmax's max and its sum (in
// double, as the host's) meet through shuffles, then n_used rounds each take the best expert not yet taken, the
// lanes' candidates reduced by a butterfly of shuffles whose order (key, then the lower id) is total, so every
// lane ends the round with the same winner. The winner's lane marks it taken in a per-lane bit mask; lane 0
// writes its id and weight, and at the end normalises and scales the token's weights in rank order.
//
// softmax_weight (gpt-oss) skips the softmax over all experts: the rounds rank the logits, and lane 0 turns the
// chosen logits into their softmax at the end, as the host does.
//
// moe_combine, add_expert_bias and copy_rows are row-wise: a thread per element, a block row of threads per token row.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace {

constexpr int kRouterWarps = 4;       // tokens per block of the router
constexpr int kRowThreads = 256;      // elements per block of the row-wise kernels
constexpr unsigned kFullWarp = 0xffffffffu;
constexpr float kMinWeightSum = 6.103515625e-5f;   // 2^-14: route_experts' clamp of the weights' sum

__device__ __forceinline__ bool is_nan(float v) { return v != v; }

// Whether candidate (a, ia) ranks before (b, ib): a taken-nothing id (-1) never does; a number before a NaN;
// the larger number; among equals (and among NaNs) the lower id. route_experts' selection order.
__device__ __forceinline__ bool ranks_before(float a, int ia, float b, int ib) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    const bool an = is_nan(a), bn = is_nan(b);
    if (an != bn) return bn;
    if (!an && a != b) return a > b;
    return ia < ib;
}

// The host's probabilities: exp(l - max) * inv for softmax, 1 / (1 + exp(-l)) for sigmoid, one rounding each.
__device__ __forceinline__ float softmax_prob(float l, float max, float inv) {
    return __fmul_rn(expf(__fsub_rn(l, max)), inv);
}
__device__ __forceinline__ float sigmoid_prob(float l) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-l))); }

__global__ void __launch_bounds__(kRouterWarps * 32)
    route_tokens(const float* __restrict__ logits, int64_t n, RouterParams p, int32_t* __restrict__ ids,
                 float* __restrict__ weights) {
    dependent_launch::wait_and_release();
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouterWarps + threadIdx.x / 32;
    if (t >= n) return;   // the whole warp
    const float* row = logits + t * p.n_expert;
    float max = -INFINITY;
    double sum = 0.0;
    if (!p.sigmoid && !p.softmax_weight) {
        for (int e = lane; e < p.n_expert; e += 32)
            if (row[e] > max) max = row[e];   // NaN never raises it, as on the host
        for (int off = 16; off > 0; off /= 2) {
            const float o = __shfl_xor_sync(kFullWarp, max, off);
            if (o > max) max = o;
        }
        for (int e = lane; e < p.n_expert; e += 32) sum += static_cast<double>(expf(__fsub_rn(row[e], max)));
        for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(kFullWarp, sum, off);
    }
    const float inv = sum > 0.0 ? static_cast<float>(1.0 / sum) : 0.0f;
    // Ranking the logits ranks the probabilities, save where the host's softmax had no positive sum: its
    // probabilities are then 0 or NaN, and those are ranked.
    const bool by_prob = !p.sigmoid && !p.softmax_weight && !(sum > 0.0);
    // The host's probability of expert e, and (with a selection bias) the key it ranks by.
    auto prob = [&](int e) {
        return p.softmax_weight ? row[e] : p.sigmoid ? sigmoid_prob(row[e]) : softmax_prob(row[e], max, inv);
    };
    const float* bias = p.selection_bias;
    uint32_t taken = 0;   // bit j: expert lane + 32 j
    int32_t* tid = ids + t * p.n_used;
    float* tw = weights + t * p.n_used;
    for (int r = 0; r < p.n_used; ++r) {
        float best = 0.0f;
        int best_id = -1;
        int j = 0;
        for (int e = lane; e < p.n_expert; e += 32, ++j) {
            if ((taken >> j) & 1u) continue;
            const float key = bias ? __fadd_rn(prob(e), bias[e]) : by_prob ? softmax_prob(row[e], max, inv) : row[e];
            if (ranks_before(key, e, best, best_id)) best = key, best_id = e;
        }
        for (int off = 16; off > 0; off /= 2) {
            const float ob = __shfl_xor_sync(kFullWarp, best, off);
            const int oi = __shfl_xor_sync(kFullWarp, best_id, off);
            if (ranks_before(ob, oi, best, best_id)) best = ob, best_id = oi;
        }
        if (best_id % 32 == lane) taken |= 1u << (best_id / 32);
        if (lane == 0) {
            tid[r] = best_id;
            tw[r] = prob(best_id);
        }
    }
    if (lane != 0) return;
    if (p.softmax_weight) {   // the host's softmax over the chosen logits, the largest (rank 0) as the max
        const float top = tw[0];
        double s = 0.0;
        for (int r = 0; r < p.n_used; ++r) {
            tw[r] = expf(__fsub_rn(tw[r], top));
            s += static_cast<double>(tw[r]);
        }
        const float inv_s = static_cast<float>(1.0 / s);
        for (int r = 0; r < p.n_used; ++r) tw[r] = __fmul_rn(tw[r], inv_s);
    }
    if (p.normalize) {
        float s = 0.0f;
        for (int r = 0; r < p.n_used; ++r) s = __fadd_rn(s, tw[r]);
        if (!(s >= kMinWeightSum)) s = kMinWeightSum;
        for (int r = 0; r < p.n_used; ++r) tw[r] = __fdiv_rn(tw[r], s);
    }
    if (p.scale != 1.0f)
        for (int r = 0; r < p.n_used; ++r) tw[r] = __fmul_rn(tw[r], p.scale);
}

// out row blockIdx.x = the weighted sum of its n_used expert rows, in rank order.
__global__ void __launch_bounds__(kRowThreads)
    combine_rows(const float* __restrict__ y, const float* __restrict__ weights, int n_used, int dim,
                 float* __restrict__ out) {
    dependent_launch::wait_and_release();
    const int d = static_cast<int>(blockIdx.y * kRowThreads + threadIdx.x);
    if (d >= dim) return;
    const int64_t t = blockIdx.x;
    const float* yt = y + t * n_used * dim + d;
    const float* wt = weights + t * n_used;
    float o = __fmul_rn(wt[0], yt[0]);
    for (int r = 1; r < n_used; ++r) o = __fadd_rn(o, __fmul_rn(wt[r], yt[static_cast<int64_t>(r) * dim]));
    out[t * dim + d] = o;
}

__global__ void __launch_bounds__(kRowThreads)
    add_bias_rows(float* __restrict__ y, const int32_t* __restrict__ ids, const float* __restrict__ bias, int width) {
    const int d = static_cast<int>(blockIdx.y * kRowThreads + threadIdx.x);
    if (d >= width) return;
    const int64_t s = blockIdx.x;
    y[s * width + d] = __fadd_rn(y[s * width + d], bias[static_cast<int64_t>(ids[s]) * width + d]);
}

__global__ void __launch_bounds__(kRowThreads)
    copy_rows_kernel(const float* __restrict__ src, const int32_t* __restrict__ src_rows, float* __restrict__ dst,
                     const int32_t* __restrict__ dst_rows, int width) {
    dependent_launch::wait_and_release();
    const int d = static_cast<int>(blockIdx.y * kRowThreads + threadIdx.x);
    if (d >= width) return;
    const int64_t i = blockIdx.x;
    const int64_t from = src_rows ? src_rows[i] : i, to = dst_rows ? dst_rows[i] : i;
    dst[to * width + d] = src[from * width + d];
}

[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument("tern::cuda::" + what); }

constexpr int64_t kIntMax = 2147483647;

unsigned row_blocks(int64_t width) { return static_cast<unsigned>((width + kRowThreads - 1) / kRowThreads); }

} // namespace

void route_experts(const float* logits, int64_t n, const RouterParams& p, int32_t* ids, float* weights,
                   cudaStream_t stream) {
    if (p.n_expert < 1 || p.n_expert > kMaxRouterExperts || p.n_used < 1 || p.n_used > p.n_expert ||
        p.n_used > kMaxRouterUsed)
        refuse("route_experts: " + std::to_string(p.n_used) + " of " + std::to_string(p.n_expert) +
               " experts out of range");
    if (n < 0 || (n + kRouterWarps - 1) / kRouterWarps > kIntMax)
        refuse("route_experts: n = " + std::to_string(n) + " out of range");
    if (n == 0) return;
    launch_dependent(route_tokens, dim3(static_cast<unsigned>((n + kRouterWarps - 1) / kRouterWarps)),
                     dim3(kRouterWarps * 32), 0, stream, logits, n, p, ids, weights);
}

void moe_combine(const float* y, const float* weights, int64_t n, int64_t n_used, int64_t dim, float* out,
                 cudaStream_t stream) {
    if (n < 0 || n > kIntMax || n_used < 1 || n_used > kMaxRouterUsed || dim < 0 || dim > kIntMax)
        refuse("moe_combine: n = " + std::to_string(n) + ", n_used = " + std::to_string(n_used) +
               ", dim = " + std::to_string(dim) + " out of range");
    if (n == 0 || dim == 0) return;
    launch_dependent(combine_rows, dim3(static_cast<unsigned>(n), row_blocks(dim)), dim3(kRowThreads), 0, stream, y,
                     weights, static_cast<int>(n_used), static_cast<int>(dim), out);
}

void add_expert_bias(float* y, const int32_t* ids, const float* bias, int64_t n_slots, int64_t width,
                     cudaStream_t stream) {
    if (n_slots < 0 || n_slots > kIntMax || width < 0 || width > kIntMax)
        refuse("add_expert_bias: n_slots = " + std::to_string(n_slots) + ", width = " + std::to_string(width) +
               " out of range");
    if (n_slots == 0 || width == 0) return;
    launch(add_bias_rows, dim3(static_cast<unsigned>(n_slots), row_blocks(width)), dim3(kRowThreads), 0, stream, y,
           ids, bias, static_cast<int>(width));
}

void copy_rows(const float* src, const int32_t* src_rows, float* dst, const int32_t* dst_rows, int64_t n,
               int64_t width, cudaStream_t stream) {
    if (n < 0 || n > kIntMax || width < 0 || width > kIntMax)
        refuse("copy_rows: n = " + std::to_string(n) + ", width = " + std::to_string(width) + " out of range");
    if (n == 0 || width == 0) return;
    launch_dependent(copy_rows_kernel, dim3(static_cast<unsigned>(n), row_blocks(width)), dim3(kRowThreads), 0,
                     stream, src, src_rows, dst, dst_rows, static_cast<int>(width));
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
