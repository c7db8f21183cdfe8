// Prefill attention on f16 tensor cores (kernels/cuda/attention_mma.h): flash attention with mma.m16n8k16.
//
// A block of 4 warps takes one KV head g and 64 rows: a tile of 64 / group consecutive query tokens with
// all `group` query heads of g (token-major, as the f32 kernel of attention.cu folds GQA), 16 rows a warp.
// The queries are converted to f16 into shared memory once; then the block walks the keys its tokens see
// in tiles of kKeys (64; 32 at head dim 256, where the output accumulators take most registers), tiles
// aligned to multiples of kKeys so that none crosses a page of the paged cache:
//   1. the K and V rows are copied to shared memory as they are (f16, 16 bytes a thread and step), rows
//      outside the block's visible range [klo, khi] as zeros, so no unwritten cache byte reaches a product;
//   2. each warp whose rows see any key of the tile: S = Q K^T for its 16 rows (ldmatrix of Q and of K's
//      rows as the B fragments, f32 accumulators), scaled, soft-capped, masked per row by position;
//   3. online softmax in registers: a lane holds two rows' scores (lanes 4g .. 4g+3 share a row: two
//      shuffles give its max and sum), rescales its share of the output by exp2(m_old - m_new);
//   4. P, rounded to f16, is already laid out as mma's A fragments (the C layout of step 2 is the A layout
//      of a 16-key slice); V's rows are loaded transposed by ldmatrix.trans as the B fragments; O += P V.
// Causal: the key tiles end at the block's last token, and a warp skips the products of a tile none of
// its rows sees (the diagonal tile's upper part, tiles below a sliding window's start for later rows).
// The grid runs the query tiles last to first, so the blocks with the longest key ranges start first.
//
// Rounding: q and p are f16 in the products, k and v are the cache's f16; sums, the softmax and the
// normalisation are f32. Only f16 caches come here: other KV types keep the f32 kernel (attention_mma.h).
#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/mma.h"
#include "kernels/cuda/unroll.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = 64;        // rows of a block: 16 a warp, one mma's M
constexpr int kMaxGroup = kRows; // a token's query heads must fit one block
constexpr float kLog2e = 1.44269504088896340736f;

// Keys a tile, shared-memory row stride in halves (16 bytes of padding: the 8 rows one ldmatrix matrix reads
// start 16 bytes apart modulo 128, in distinct banks) and bytes of shared memory (Q, the K tile, the V tile).
template <int D> struct MmaShape {
    static constexpr int keys = D >= 256 ? 32 : 64;
    static constexpr int stride = D + 8;
    static constexpr size_t smem_bytes = sizeof(uint16_t) * static_cast<size_t>(kRows + 2 * keys) * stride;
};

struct MmaArgs {
    KvRows k, v;
    const int32_t* pages; // the sequence's page table, or null (kv_rows.cuh)
    const float* q;
    float* att;
    int32_t n, n_heads, group, pos0, window, tokens_per_block, rows;
    const int32_t* pos0_device; // when set, pos0 is read there
    float q_scale;              // scale * log2(e), or scale alone when softcap > 0 (the cap applies before log2(e))
    float softcap;
};

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    return static_cast<uint32_t>(__half_as_ushort(__float2half_rn(lo))) |
           (static_cast<uint32_t>(__half_as_ushort(__float2half_rn(hi))) << 16);
}

// The explicit minimum of one block per SM lets ptxas keep the output accumulators (D / 2 floats a thread)
// in registers at head dim 256.
template <int D> __global__ void __launch_bounds__(kThreads, 1) attention_mma_kernel(MmaArgs a) {
    using Shape = MmaShape<D>;
    constexpr int kKeys = Shape::keys, kStride = Shape::stride;
    constexpr int kChunks = D / 8; // 16-byte pieces of a row
    dependent_launch::wait_and_release(); // first: pos0_device, q and the KV cache come from earlier kernels
    if (a.pos0_device) a.pos0 = *a.pos0_device;
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int quad = lane / 4, t4 = lane % 4; // the mma fragments' g and t
    uint16_t* qs = dynamic_shared<uint16_t>();
    uint16_t* ks = qs + kRows * kStride;
    uint16_t* vs = ks + kKeys * kStride;

    const int g = static_cast<int>(blockIdx.y);
    const int qtile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
    const int group = a.group;
    const int tok0 = qtile * a.tokens_per_block;
    const int tok_end = min(a.n, tok0 + a.tokens_per_block);
    const int khi = a.pos0 + tok_end - 1; // the keys any of the block's tokens sees
    const int klo = a.window > 0 ? max(0, a.pos0 + tok0 - a.window + 1) : 0;

    // Queries to f16: row r is token tok0 + r / group, head g * group + r % group (zeros past the rows or n).
    for (int i = tid; i < kRows * (D / 4); i += kThreads) {
        const int r = i / (D / 4), c = i - r * (D / 4);
        const int tok = tok0 + r / group;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < a.rows && tok < tok_end)
            x = *reinterpret_cast<const float4*>(
                a.q + (static_cast<int64_t>(tok) * a.n_heads + g * group + r % group) * D + 4 * c);
        *reinterpret_cast<uint2*>(qs + r * kStride + 4 * c) = make_uint2(pack_half2(x.x, x.y), pack_half2(x.z, x.w));
    }

    // This lane's two rows (quad and quad + 8 of the warp's 16): visible positions [lo, hi], empty past n.
    int lo[2], hi[2];
    TERN_UNROLL
    for (int i = 0; i < 2; ++i) {
        const int r = 16 * warp + quad + 8 * i, tok = tok0 + r / group;
        lo[i] = 0x7FFFFFFF;
        hi[i] = -1;
        if (r < a.rows && tok < tok_end) {
            hi[i] = a.pos0 + tok;
            lo[i] = a.window > 0 ? max(0, hi[i] - a.window + 1) : 0;
        }
    }
    int warp_lo = min(lo[0], lo[1]), warp_hi = max(hi[0], hi[1]);
    for (int offset = 16; offset > 0; offset /= 2) {
        warp_lo = min(warp_lo, __shfl_xor_sync(0xFFFFFFFFu, warp_lo, offset));
        warp_hi = max(warp_hi, __shfl_xor_sync(0xFFFFFFFFu, warp_hi, offset));
    }

    float o[D / 8][4];
    TERN_UNROLL
    for (int j = 0; j < D / 8; ++j)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};

    for (int key0 = klo / kKeys * kKeys; key0 <= khi; key0 += kKeys) {
        __syncthreads(); // the previous tile's products are done with K and V (and Q is in)
        TERN_UNROLL
        for (int it = 0; it < kKeys * kChunks / kThreads; ++it) {
            const int i = tid + it * kThreads;
            const int j = i / kChunks, c = i - j * kChunks, key = key0 + j;
            uint4 kx = make_uint4(0u, 0u, 0u, 0u), vx = kx;
            if (key >= klo && key <= khi) {
                kx = *reinterpret_cast<const uint4*>(kv_row(a.k, a.pages, g, key) + 16 * c);
                vx = *reinterpret_cast<const uint4*>(kv_row(a.v, a.pages, g, key) + 16 * c);
            }
            *reinterpret_cast<uint4*>(ks + j * kStride + 8 * c) = kx;
            *reinterpret_cast<uint4*>(vs + j * kStride + 8 * c) = vx;
        }
        __syncthreads();
        if (warp_hi < key0 || warp_lo >= key0 + kKeys) continue; // none of the warp's rows sees this tile

        // S = Q K^T: n-tile j holds keys key0 + 8j .. 8j + 7.
        float s[kKeys / 8][4];
        TERN_UNROLL
        for (int j = 0; j < kKeys / 8; ++j)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
        TERN_UNROLL
        for (int kd = 0; kd < D / 16; ++kd) {
            uint32_t qa[4];
            ldmatrix_x4(qa, qs + (16 * warp + lane % 16) * kStride + 16 * kd + 8 * (lane / 16));
            TERN_UNROLL
            for (int nj = 0; nj < kKeys / 16; ++nj) {
                // Matrices: keys 16nj + 0..7 at dims +0..7 and +8..15, then keys 16nj + 8..15 likewise.
                uint32_t kb[4];
                ldmatrix_x4(kb, ks + (16 * nj + lane % 8 + 8 * (lane / 16)) * kStride + 16 * kd + 8 * (lane / 8 % 2));
                mma_m16n8k16_f32_f16(s[2 * nj], qa, kb, s[2 * nj]);
                mma_m16n8k16_f32_f16(s[2 * nj + 1], qa, kb + 2, s[2 * nj + 1]);
            }
        }

        // Scale, cap and mask (the log2 domain); element e of n-tile j is row e / 2, key key0 + 8j + 2 t4 + e % 2.
        float mx[2] = {-INFINITY, -INFINITY};
        TERN_UNROLL
        for (int j = 0; j < kKeys / 8; ++j) {
            TERN_UNROLL
            for (int e = 0; e < 4; ++e) {
                const int key = key0 + 8 * j + 2 * t4 + e % 2, ri = e / 2;
                float x = s[j][e] * a.q_scale;
                if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap) * kLog2e;
                x = key >= lo[ri] && key <= hi[ri] ? x : -INFINITY;
                s[j][e] = x;
                mx[ri] = fmaxf(mx[ri], x);
            }
        }
        float alpha[2], m_ref[2];
        TERN_UNROLL
        for (int ri = 0; ri < 2; ++ri) {
            mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xFFFFFFFFu, mx[ri], 1));
            mx[ri] = fmaxf(mx[ri], __shfl_xor_sync(0xFFFFFFFFu, mx[ri], 2));
            const float m_new = fmaxf(m_run[ri], mx[ri]);
            // Nothing visible yet: the state stays (-inf, 0) and every p is exp2(-inf) = 0.
            alpha[ri] = m_new == -INFINITY ? 1.0f : exp2f(m_run[ri] - m_new);
            m_ref[ri] = m_new == -INFINITY ? 0.0f : m_new;
            m_run[ri] = m_new;
        }
        float sum[2] = {0.0f, 0.0f};
        TERN_UNROLL
        for (int j = 0; j < kKeys / 8; ++j) {
            TERN_UNROLL
            for (int e = 0; e < 4; ++e) {
                s[j][e] = exp2f(s[j][e] - m_ref[e / 2]);
                sum[e / 2] += s[j][e];
            }
        }
        TERN_UNROLL
        for (int ri = 0; ri < 2; ++ri) {
            sum[ri] += __shfl_xor_sync(0xFFFFFFFFu, sum[ri], 1);
            sum[ri] += __shfl_xor_sync(0xFFFFFFFFu, sum[ri], 2);
            l_run[ri] = l_run[ri] * alpha[ri] + sum[ri];
        }
        TERN_UNROLL
        for (int j = 0; j < D / 8; ++j) {
            o[j][0] *= alpha[0];
            o[j][1] *= alpha[0];
            o[j][2] *= alpha[1];
            o[j][3] *= alpha[1];
        }

        // O += P V, 16 keys a step: P's A fragment is n-tiles 2kk and 2kk + 1 of S.
        TERN_UNROLL
        for (int kk = 0; kk < kKeys / 16; ++kk) {
            const uint32_t pa[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                                    pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                    pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
            TERN_UNROLL
            for (int dn = 0; dn < D / 16; ++dn) {
                // Matrices: keys 16kk + 0..7 and + 8..15 at dims 16dn + 0..7, then the same keys at + 8..15.
                uint32_t vb[4];
                ldmatrix_x4_trans(vb,
                                  vs + (16 * kk + lane % 8 + 8 * (lane / 8 % 2)) * kStride + 16 * dn + 8 * (lane / 16));
                mma_m16n8k16_f32_f16(o[2 * dn], pa, vb, o[2 * dn]);
                mma_m16n8k16_f32_f16(o[2 * dn + 1], pa, vb + 2, o[2 * dn + 1]);
            }
        }
    }

    TERN_UNROLL
    for (int ri = 0; ri < 2; ++ri) {
        const int r = 16 * warp + quad + 8 * ri, tok = tok0 + r / group;
        if (r >= a.rows || tok >= tok_end) continue;
        float* out = a.att + (static_cast<int64_t>(tok) * a.n_heads + g * group + r % group) * D;
        const float inv = l_run[ri] > 0.0f ? 1.0f / l_run[ri] : 0.0f;
        TERN_UNROLL
        for (int j = 0; j < D / 8; ++j)
            *reinterpret_cast<float2*>(out + 8 * j + 2 * t4) = make_float2(o[j][2 * ri] * inv, o[j][2 * ri + 1] * inv);
    }
}

bool device_has_f16_mma() {
    int device = 0;
    check(cudaGetDevice(&device), "attention_mma: cudaGetDevice");
#if defined(TERN_CUDA_EMULATOR)
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "attention_mma: cudaGetDeviceProperties");
    return prop.major >= 8;
#else
    int major = 0;
    check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
          "attention_mma: cudaDeviceGetAttribute");
    return major >= 8;
#endif
}

template <int D> void launch_mma(const MmaArgs& args, int32_t query_tiles, int32_t n_kv_heads, cudaStream_t stream) {
    const auto kernel = attention_mma_kernel<D>;
    constexpr size_t bytes = MmaShape<D>::smem_bytes;
    if constexpr (bytes > 48 * 1024)
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
              "attention_mma: shared memory size");
    launch_dependent(kernel, dim3(static_cast<unsigned>(query_tiles), static_cast<unsigned>(n_kv_heads)),
                     dim3(kThreads), bytes, stream, args);
}

} // namespace

bool attention_mma_fits(const KvLayer& layer, int64_t n, int32_t n_heads) {
    if (layer.type != KvType::f16 || layer.head_dim != layer.head_dim_v) return false;
    if (layer.head_dim != 64 && layer.head_dim != 128 && layer.head_dim != 256) return false;
    if (layer.n_kv_heads < 1 || n_heads % layer.n_kv_heads != 0 || n_heads / layer.n_kv_heads > kMaxGroup) return false;
    return n >= kMmaPrefillMinTokens && device_has_f16_mma();
}

void attention_mma(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t pos0,
                   int32_t sliding_window, float scale, float softcap, float* att, cudaStream_t stream,
                   const int32_t* pos0_device) {
    if (n <= 0) return;
    MmaArgs a{};
    a.k = kv_rows_of(layer, false);
    a.v = kv_rows_of(layer, true);
    a.pages = layer.pages;
    a.q = q;
    a.att = att;
    a.n = static_cast<int32_t>(n);
    a.n_heads = n_heads;
    a.group = n_heads / layer.n_kv_heads;
    a.pos0 = pos0;
    a.pos0_device = pos0_device;
    a.window = sliding_window > 0 ? sliding_window : 0;
    a.softcap = softcap > 0.0f ? softcap : 0.0f;
    a.q_scale = a.softcap > 0.0f ? scale : scale * kLog2e;
    a.tokens_per_block = kRows / a.group;
    a.rows = a.tokens_per_block * a.group;
    const int64_t query_tiles = (n + a.tokens_per_block - 1) / a.tokens_per_block;
    switch (layer.head_dim) {
    case 64:
        launch_mma<64>(a, static_cast<int32_t>(query_tiles), layer.n_kv_heads, stream);
        return;
    case 128:
        launch_mma<128>(a, static_cast<int32_t>(query_tiles), layer.n_kv_heads, stream);
        return;
    case 256:
        launch_mma<256>(a, static_cast<int32_t>(query_tiles), layer.n_kv_heads, stream);
        return;
    }
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
