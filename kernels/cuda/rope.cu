// The per-head q/k RMSNorm and RoPE of the forward (kernels/cuda/rope.h), as engine/cpu/backend_cpu.cpp
// does them: each head normed by q_norm / k_norm (when given) and stored as floats, then rotated by the
// cos/sin table of its token's position (kernels/cpu/ops.cpp rope_cos_sin + rope_rotate_f32).
//
// Block (token, group of kWarps heads): the block's threads first fill the token's cos/sin table in
// shared memory (the angle in double as rope_theta computes it, its cos/sin rounded to float), then each
// warp takes one head: stages it in shared memory, sums its squares in double (a warp reduction),
// normalises and rotates. The table is made once per block instead of once per head.
//
// qk_norm_rope_kv_write is the same kernel with k and v rows stored into the KV cache as well (kv_write's
// encodings, kv_codec.cuh): the rotated k head from its shared-memory staging, and n_kv_heads more warps per
// token that store the v heads. One launch for what was qk_norm_rope then kv_write.
//
// Against the CPU: the rotation and the norm's float steps are the same IEEE operations (explicitly
// rounded, no FMA contraction); the angle's pow / cos / sin are the device's double functions (within
// 2 ulp in double), so a table float differs from the CPU's only when the double lands within a few
// 1e-16 of a float rounding boundary; the double sum of squares differs only in rounding order.
#include "kernels/cuda/rope.h"

#include <stdexcept>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_codec.cuh"
#include "kernels/cuda/kv_rows.cuh"
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
    float yarn_ext_factor, yarn_corr_low, yarn_corr_high, mscale;
    float q_temp_scale;
    int q_temp_floor;
    int pos0;
    const int32_t* pos0_device;   // when set, the position of token 0 is read here (a replayed CUDA graph)
    // qk_norm_rope_kv_write only: the V rows and the layer's cache, where k and v rows are stored.
    const float* v;
    KvRows k_cache, v_cache;
    const int32_t* pages;   // the sequence's page table, or null (kv_rows.cuh)
    int head_dim_v;
    KvTokenMap map;         // qk_norm_rope_kv_write_tokens: each token's position and page table (map.pos set)
};

// rope_pair_scale (kernels/cpu/ops.cpp): freq_scale, or with YaRN its ramp mix with 1, the float ramp and the
// double mix in the CPU's operations (explicitly rounded: no FMA contraction).
__device__ inline double pair_scale(int i, const RopeArgs& a) {
    if (a.yarn_ext_factor == 0.0f) return static_cast<double>(a.freq_scale);
    const float y = __fdiv_rn(__fsub_rn(static_cast<float>(i), a.yarn_corr_low),
                              fmaxf(0.001f, __fsub_rn(a.yarn_corr_high, a.yarn_corr_low)));
    const float ramp = __fmul_rn(__fsub_rn(1.0f, fminf(1.0f, fmaxf(0.0f, y))), a.yarn_ext_factor);
    const double r = static_cast<double>(ramp);
    return __dadd_rn(__dmul_rn(static_cast<double>(a.freq_scale), __dadd_rn(1.0, -r)), r);
}

// The heads of one token: n_heads q heads, then n_kv_heads k heads, then (kKv) n_kv_heads v heads, kWarps
// to a block (blockIdx.y), one warp each. With kKv the rotated k head and the v head are also stored in the
// cache in format F, as kv_write does after qk_norm_rope (kv_codec.cuh store_row_warp: element by element
// for the float formats, 32-element blocks by the warp for the others, the same encodings).
//
// Dynamic shared memory: cos[n_rot/2], sin[n_rot/2], then head_dim floats per warp.
template <bool kKv, KvType F> __global__ void qk_norm_rope_kernel(RopeArgs a) {
    dependent_launch::wait_and_release();
    constexpr int kScratchFloats = kKv && F == KvType::f8_e4m3 ? kv_codec::kF8ScratchFloats : 1;
    __shared__ float kv_scratch[kWarps][kScratchFloats];   // store_f8_block's per-warp scratch
    const int token = static_cast<int>(blockIdx.x);
    const int half = a.n_rot / 2;
    float* cos_t = dynamic_shared<float>();
    float* sin_t = cos_t + half;
    const int pos0 = a.pos0_device ? *a.pos0_device : a.pos0;
    const int token_pos = a.map.pos ? a.map.pos[token] : pos0 + token;
    const int32_t* pages = a.map.pos ? a.map.tables + a.map.table[token] : a.pages;
    const int rotated_heads = a.n_heads + a.n_kv_heads;

    // rope_theta (kernels/cpu/ops.cpp), operation for operation (not needed by a block of v heads only).
    const double pos = static_cast<double>(token_pos);
    if (static_cast<int>(blockIdx.y) * kWarps < rotated_heads)
        for (int i = static_cast<int>(threadIdx.x); i < half; i += static_cast<int>(blockDim.x)) {
            double theta =
                pos * pair_scale(i, a) *
                pow(static_cast<double>(a.base), -2.0 * static_cast<double>(i) / static_cast<double>(a.n_rot));
            if (a.freq_factors) theta /= static_cast<double>(a.freq_factors[i]);
            cos_t[i] = __fmul_rn(static_cast<float>(cos(theta)), a.mscale);
            sin_t[i] = __fmul_rn(static_cast<float>(sin(theta)), a.mscale);
        }
    __syncthreads();

    const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
    const int head = static_cast<int>(blockIdx.y) * kWarps + warp;
    if constexpr (kKv) {
        if (head >= rotated_heads) { // a v head: straight to the cache (kv_write_kernel's encoding)
            const int h = head - rotated_heads;
            if (h >= a.n_kv_heads) return;
            const float* src = a.v + (static_cast<int64_t>(token) * a.n_kv_heads + h) * a.head_dim_v;
            kv_codec::store_row_warp<F>(src, kv_row(a.v_cache, pages, h, token_pos), a.head_dim_v, lane,
                                        kv_scratch[warp]);
            return;
        }
    }
    if (head >= rotated_heads) return; // no block-wide barrier follows
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

    // rope_rotate_f32: pairs (i, i + n_rot/2) for neox, (2i, 2i + 1) otherwise. Each pair is read and
    // written by one lane, so the staged head can take the rotated values in place for the cache store.
    const int second = a.neox ? half : 1, step = a.neox ? 1 : 2;
    for (int i = lane; i < half; i += 32) {
        const int d0 = i * step;
        const float x0 = s[d0], x1 = s[d0 + second], c = cos_t[i], sn = sin_t[i];
        const float y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
        const float y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
        x[d0] = y0;
        x[d0 + second] = y1;
        if constexpr (kKv) {
            s[d0] = y0;
            s[d0 + second] = y1;
        }
    }
    if (is_q && a.q_temp_scale != 0.0f) {
        // ModelConfig::attn_temperature: the float position's floor, the double log, rounded to float.
        const float steps = floorf(__fdiv_rn(static_cast<float>(token_pos), static_cast<float>(a.q_temp_floor)));
        const double ln = log(__dadd_rn(static_cast<double>(steps), 1.0));
        const float t = static_cast<float>(__dadd_rn(__dmul_rn(ln, static_cast<double>(a.q_temp_scale)), 1.0));
        if (t != 1.0f) {
            __syncwarp(); // every dim of the head, written above by other lanes
            for (int d = lane; d < a.head_dim; d += 32) x[d] = __fmul_rn(x[d], t);
        }
    }
    if constexpr (kKv) {
        if (!is_q) { // the k head, as kv_write would read it back from k
            __syncwarp();
            kv_codec::store_row_warp<F>(s, kv_row(a.k_cache, pages, head - a.n_heads, token_pos), a.head_dim, lane,
                                        kv_scratch[warp]);
        }
    }
}

void require(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("tern::cuda::qk_norm_rope: " + what);
}

void check_rope(int64_t n, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, const RopeParams& rope) {
    require(n >= 0 && n < (int64_t{1} << 31), "token count out of range");
    require(n_heads >= 0 && n_kv_heads >= 0 && head_dim > 0, "bad head shape");
    require(rope.q_temp_scale == 0.0f || rope.q_temp_floor > 0, "an attention temperature needs a positive floor");
    require(rope.n_rot >= 0 && rope.n_rot % 2 == 0 && rope.n_rot <= head_dim,
            "n_rot must be even and at most head_dim (n_rot " + std::to_string(rope.n_rot) + ", head_dim " +
                std::to_string(head_dim) + ")");
}

// The arguments both launchers share (the cache's fields left empty).
RopeArgs rope_args(float* q, float* k, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, const float* q_norm,
                   const float* k_norm, float eps, const RopeParams& rope, int32_t pos0, const int32_t* pos0_device) {
    RopeArgs args{};
    args.q = q;
    args.k = k;
    args.n_heads = n_heads;
    args.n_kv_heads = n_kv_heads;
    args.head_dim = head_dim;
    args.q_norm = q_norm;
    args.k_norm = k_norm;
    args.eps = eps;
    args.neox = rope.neox;
    args.n_rot = rope.n_rot;
    args.base = rope.base;
    args.freq_scale = rope.freq_scale;
    args.freq_factors = rope.freq_factors;
    args.yarn_ext_factor = rope.yarn_ext_factor;
    args.yarn_corr_low = rope.yarn_corr_low;
    args.yarn_corr_high = rope.yarn_corr_high;
    args.mscale = rope.mscale;
    args.q_temp_scale = rope.q_temp_scale;
    args.q_temp_floor = rope.q_temp_floor;
    args.pos0 = pos0;
    args.pos0_device = pos0_device;
    return args;
}

// One launch of the kernel for F over `heads` warps per token (kWarps a block).
template <bool kKv, KvType F> void launch_rope(const RopeArgs& args, int64_t n, int heads, cudaStream_t stream) {
    const int warps = heads < kWarps ? heads : kWarps;
    const size_t shared =
        (static_cast<size_t>(args.n_rot) + static_cast<size_t>(warps) * args.head_dim) * sizeof(float);
    require(shared <= 48 * 1024, "head_dim too large for the shared-memory staging");
    const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((heads + kWarps - 1) / kWarps));
    launch_dependent(qk_norm_rope_kernel<kKv, F>, grid, dim3(32 * warps), shared, stream, args);
}

} // namespace

void qk_norm_rope(float* q, float* k, int64_t n, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                  const float* q_norm, const float* k_norm, float eps, const RopeParams& rope, int32_t pos0,
                  cudaStream_t stream, const int32_t* pos0_device) {
    check_rope(n, n_heads, n_kv_heads, head_dim, rope);
    const int heads = n_heads + n_kv_heads;
    if (n == 0 || heads == 0) return;
    const RopeArgs args =
        rope_args(q, k, n_heads, n_kv_heads, head_dim, q_norm, k_norm, eps, rope, pos0, pos0_device);
    launch_rope<false, KvType::f32>(args, n, heads, stream);
}

namespace {

// qk_norm_rope_kv_write for a whole layer: the cache's fields of args filled in, then one launch.
void launch_rope_kv(const KvLayer& layer, const RopeParams& rope, RopeArgs args, int64_t n, int32_t n_heads,
                    cudaStream_t stream) {
    check_rope(n, n_heads, layer.n_kv_heads, layer.head_dim, rope);
    kv_codec::check_kv_shape(layer.type, layer.head_dim, layer.head_dim_v, layer.n_kv_heads, layer.n_ctx,
                             "qk_norm_rope_kv_write");
    if (!layer.k || !layer.v) throw std::invalid_argument("qk_norm_rope_kv_write: the layer has no K or V buffer");
    if (n == 0) return;
    args.k_cache = kv_rows_of(layer, false);
    args.v_cache = kv_rows_of(layer, true);
    args.pages = layer.pages;
    args.head_dim_v = layer.head_dim_v;
    const int heads = n_heads + 2 * layer.n_kv_heads;
    switch (layer.type) {
    case KvType::f32:
        launch_rope<true, KvType::f32>(args, n, heads, stream);
        return;
    case KvType::f16:
        launch_rope<true, KvType::f16>(args, n, heads, stream);
        return;
    case KvType::bf16:
        launch_rope<true, KvType::bf16>(args, n, heads, stream);
        return;
    case KvType::q8_0:
        launch_rope<true, KvType::q8_0>(args, n, heads, stream);
        return;
    case KvType::f8_e4m3:
        launch_rope<true, KvType::f8_e4m3>(args, n, heads, stream);
        return;
    }
    throw std::invalid_argument("qk_norm_rope_kv_write: unknown KV type");
}

} // namespace

void qk_norm_rope_kv_write(const KvLayer& layer, float* q, float* k, const float* v, int64_t n, int32_t n_heads,
                           const float* q_norm, const float* k_norm, float eps, const RopeParams& rope, int32_t pos0,
                           cudaStream_t stream, const int32_t* pos0_device) {
    if (pos0 < 0 || pos0 + n > layer.n_ctx)
        throw std::invalid_argument("qk_norm_rope_kv_write: positions " + std::to_string(pos0) + " + " +
                                    std::to_string(n) + " outside the cache's " + std::to_string(layer.n_ctx));
    RopeArgs args =
        rope_args(q, k, n_heads, layer.n_kv_heads, layer.head_dim, q_norm, k_norm, eps, rope, pos0, pos0_device);
    args.v = v;
    launch_rope_kv(layer, rope, args, n, n_heads, stream);
}

void qk_norm_rope_kv_write_tokens(const KvLayer& layer, float* q, float* k, const float* v, int64_t n,
                                  int32_t n_heads, const float* q_norm, const float* k_norm, float eps,
                                  const RopeParams& rope, const KvTokenMap& map, cudaStream_t stream) {
    if (n > 0 && (!map.pos || !map.table || !map.tables))
        throw std::invalid_argument("qk_norm_rope_kv_write_tokens: no token map");
    RopeArgs args = rope_args(q, k, n_heads, layer.n_kv_heads, layer.head_dim, q_norm, k_norm, eps, rope, 0, nullptr);
    args.v = v;
    args.map = map;
    launch_rope_kv(layer, rope, args, n, n_heads, stream);
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
