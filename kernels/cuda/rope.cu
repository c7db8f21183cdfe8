// The per-head q/k RMSNorm and RoPE of the forward (kernels/cuda/rope.h), as engine/cpu/backend_cpu.cpp
// does them: each head normed by q_norm / k_norm (when given) and stored as floats, then rotated by the
// cos/sin table of its token's position (kernels/cpu/ops.cpp rope_cos_sin + rope_rotate_f32).
//
// Block (token, group of kWarps heads): the block's threads first fill the token's cos/sin table in
// shared memory (the angle in double as rope_theta computes it, its cos/sin rounded to float), then each
// warp takes one head: stages it in shared memory, sums its squares in double (a warp reduction),
// normalises and rotates. The table is made once per block instead of once per head.
//
// Against the CPU: the rotation and the norm's float steps are the same IEEE operations (explicitly
// rounded, no FMA contraction); the angle's pow / cos / sin are the device's double functions (within
// 2 ulp in double), so a table float differs from the CPU's only when the double lands within a few
// 1e-16 of a float rounding boundary; the double sum of squares differs only in rounding order.
#include "kernels/cuda/rope.h"

#include <stdexcept>
#include <string>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/row_reduce.cuh"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace {

constexpr int kWarps = 4; // heads per block

struct RopeArgs {
    float* q;
    float* k;
    int n_heads, n_kv_heads, head_dim;
    const float* q_norm;
    const float* k_norm;
    float eps;
    bool neox;
    int n_rot;
    float base, freq_scale;
    const float* freq_factors;
    int pos0;
    const int32_t* pos0_device;   // when set, the position of token 0 is read here (a replayed CUDA graph)
};

// Dynamic shared memory: cos[n_rot/2], sin[n_rot/2], then head_dim floats per warp.
__global__ void qk_norm_rope_kernel(RopeArgs a) {
    const int token = static_cast<int>(blockIdx.x);
    const int half = a.n_rot / 2;
    float* cos_t = dynamic_shared<float>();
    float* sin_t = cos_t + half;

    // rope_theta (kernels/cpu/ops.cpp), operation for operation.
    const double pos = static_cast<double>((a.pos0_device ? *a.pos0_device : a.pos0) + token);
    for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
        double theta = pos * static_cast<double>(a.freq_scale) *
                       pow(static_cast<double>(a.base), -2.0 * static_cast<double>(i) / static_cast<double>(a.n_rot));
        if (a.freq_factors) theta /= static_cast<double>(a.freq_factors[i]);
        cos_t[i] = static_cast<float>(cos(theta));
        sin_t[i] = static_cast<float>(sin(theta));
    }
    __syncthreads();

    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    const int head = static_cast<int>(blockIdx.y) * kWarps + warp;
    if (head >= a.n_heads + a.n_kv_heads) return; // no block-wide barrier follows
    const bool is_q = head < a.n_heads;
    float* x = is_q ? a.q + (static_cast<int64_t>(token) * a.n_heads + head) * a.head_dim
                    : a.k + (static_cast<int64_t>(token) * a.n_kv_heads + (head - a.n_heads)) * a.head_dim;
    const float* w = is_q ? a.q_norm : a.k_norm;
    float* s = sin_t + half + warp * a.head_dim;

    double sum = 0.0;
    for (int d = lane; d < a.head_dim; d += 32) {
        const float v = x[d];
        s[d] = v;
        if (w) sum += static_cast<double>(v) * static_cast<double>(v);
    }
    if (w) {
        // rmsnorm_f32 (kernels/cpu/ops.cpp): mean rounded to float, then float scale and products. Each lane
        // rewrites only the dims it staged, so no exchange is needed before this.
        sum = warp_reduce(sum, SumOp{});
        const float mean = static_cast<float>(sum / static_cast<double>(a.head_dim));
        const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, a.eps)));
        for (int d = lane; d < a.head_dim; d += 32) {
            const float y = __fmul_rn(__fmul_rn(s[d], scale), w[d]);
            s[d] = y;
            if (d >= a.n_rot) x[d] = y; // dims past n_rot are only normed
        }
    }
    __syncwarp(); // the pairs below mix dims staged by different lanes

    // rope_rotate_f32: pairs (i, i + n_rot/2) for neox, (2i, 2i + 1) otherwise.
    const int second = a.neox ? half : 1, step = a.neox ? 1 : 2;
    for (int i = lane; i < half; i += 32) {
        const int d0 = i * step;
        const float x0 = s[d0], x1 = s[d0 + second], c = cos_t[i], sn = sin_t[i];
        x[d0] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        x[d0 + second] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
    }
}

void require(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("tern::cuda::qk_norm_rope: " + what);
}

} // namespace

void qk_norm_rope(float* q, float* k, int64_t n, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                  const float* q_norm, const float* k_norm, float eps, const RopeParams& rope, int32_t pos0,
                  cudaStream_t stream, const int32_t* pos0_device) {
    require(n >= 0 && n < (int64_t{1} << 31), "token count out of range");
    require(n_heads >= 0 && n_kv_heads >= 0 && head_dim > 0, "bad head shape");
    require(rope.n_rot >= 0 && rope.n_rot % 2 == 0 && rope.n_rot <= head_dim,
            "n_rot must be even and at most head_dim (n_rot " + std::to_string(rope.n_rot) + ", head_dim " +
                std::to_string(head_dim) + ")");
    const int heads = n_heads + n_kv_heads;
    if (n == 0 || heads == 0) return;
    const int warps = heads < kWarps ? heads : kWarps;
    const size_t shared = (static_cast<size_t>(rope.n_rot) + static_cast<size_t>(warps) * head_dim) * sizeof(float);
    require(shared <= 48 * 1024, "head_dim too large for the shared-memory staging");
    const RopeArgs args{q,        k,         n_heads,   n_kv_heads,      head_dim,          q_norm,
                        k_norm,   eps,       rope.neox, rope.n_rot,      rope.base,         rope.freq_scale,
                        rope.freq_factors, pos0,   pos0_device};
    const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((heads + kWarps - 1) / kWarps));
    launch(qk_norm_rope_kernel, grid, dim3(32 * warps), shared, stream, args);
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
