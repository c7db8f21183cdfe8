// Attention over the GPU KV cache (kernels/cuda/attention.h): one flash-attention kernel for decode and
// prefill, in f32 with an online softmax.
//
// A block of 128 threads takes one KV head g, a tile of `tokens_per_block` consecutive query tokens with
// all `group` query heads of g (its `rows`, token-major), and one share (`split`) of the key range those
// tokens see. It walks its keys in tiles of 32:
//   1. the K tile is decoded to f32 into shared memory (coalesced: a head's rows are contiguous bytes);
//   2. scores: lane j scores key j against the block's rows; the 4 warps split the rows (4 row slices)
//      or, when there are fewer than 4 rows, the head dim (partial dots summed in step 3);
//   3. softmax: 8 lanes per row (4 keys each) mask by position, take the tile's max and sum with 3
//      shuffles, rescale the row's running state (max m and sum l, in the log2 domain); the V tile is
//      decoded into the buffer K used;
//   4. P V: each thread owns up to kMaxQuads 4-float pieces of the rows' outputs and accumulates them.
// Every K/V byte of the block's range is read once for all its rows (GQA: the group's heads; drafts and
// prefill: the tile's tokens too).
//
// Decode has few (token, KV head) items, so the key range is split over several blocks (flash-decoding):
// each writes its unnormalised state to a device scratch buffer, and the last block of an item to finish
// (an arrival counter) merges the states and writes the output, in the same launch.
//
// Decode streams the cache: its arithmetic per byte is small (a few rows against each key), so the bytes
// in flight decide its speed. HBM at ~3 TB/s with ~700 ns of latency needs ~2 MB in flight, ~16 KB per
// multiprocessor of an H100's 132, all the time. llama-8b at depth 4096 reads 8 heads x 4097 keys x 2 x
// 256 B = 16.8 MB of f16 K/V a layer: 5.6 us at that rate. The first decode kernel (still there for
// timing: TERN_CUDA_ATTN=old) had ~46 us: a block had 4 KB in flight at most (4 loads of 8 B a thread),
// waited for K and then for V in every tile, and had only 2 tiles to walk (64 splits of 64 keys); the last
// block then merged the 64 states in two passes of one L2 round trip per state. Decode (<= 8 rows a
// block) now runs the paired kernel:
//   - K and V of a tile are loaded together, every load of both issued before the first store
//     (stage_pair): 16 KB in flight per block at head dim 128 in f16 (8.5 KB in q8_0 and f8, 32 KB in f32
//     over two batches), one wait per tile instead of two, into two shared buffers;
//   - 3 blocks per multiprocessor: the launch bounds hold ptxas to 168 registers (3 x 128 x 168 = 64512 of
//     65536), and a block's shared memory (2 x 32 x 132 floats, queries, scores) is ~37 KB at head dim
//     128; while one block computes, two wait on memory: up to 48 KB in flight per multiprocessor;
//   - splits (make_plan): blocks = items x splits up to what the GPU holds at once (3 x 132 = 396 on an
//     H100, fewer where shared memory binds, as at head dim 256), rounded down so that no second wave of
//     a few blocks doubles the time, and at least 4 key tiles a split so that a block's fixed costs (Q,
//     its state, the arrival) stay small against its loads. llama-8b (8 items): 32 splits of 4 tiles at
//     depth 4096 (256 blocks, 2 a multiprocessor), 49 from 6272 on (392 blocks; ~21 tiles each at 32k);
//   - tiles dealt out evenly over the splits, and the merge in one online pass taking 8 states per L2
//     round trip: 49 states in 7.
// The split count changes every 128 positions up to its cap, so a captured decode graph is recaptured as
// often as before (the old rule changed it every 64 up to 66). Drafts with more than 8 rows and prefill keep
// the single-buffer kernel (2 blocks a multiprocessor by registers); attention_tokens runs the kernel its
// rows ask for with its fixed splits.
//
// Attention sinks (gpt-oss): a logit per query head that joins the softmax's denominator only. It enters where
// a row's final (m, l) is turned into 1 / denominator (sink_inverse), after the single pass or the merge, so
// the tile loop and the split states do not change.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/kv_codec.cuh"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launch.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kKeyTile = 32;                       // keys per tile: one per lane when scoring
constexpr int kRowLanes = 8;                       // lanes per row in the softmax step, 4 keys each
constexpr int kRowsPerPass = kThreads / kRowLanes; // rows one softmax pass covers
constexpr int kMaxRows = 64;                       // rows of a block
constexpr int kMaxRowElems = 4096;                 // rows * max(head_dim, head_dim_v) of a block
constexpr float kLog2e = 1.44269504088896340736f;

// The split-KV states: per (item, split) rows * head_dim_v accumulators, then all (m, l) pairs. A fixed
// device buffer, so attention() needs no allocation (and is graph-capturable); launches that share it
// must not overlap, i.e. attention runs on one stream at a time. Plans that would not fit use fewer splits.
constexpr int64_t kPartialFloats = int64_t{1} << 20; // 4 MiB
constexpr int kMaxSplitItems = 4096;
constexpr int kMergeBatch = 8; // split states the merging block loads at once
constexpr int kPairedBlocksPerSm = 3; // the paired kernel's launch bounds: blocks a multiprocessor holds
constexpr int kMinTilesPerSplit = 4; // and the fewest key tiles a split streams
__device__ float g_partials[kPartialFloats];
__device__ unsigned g_arrivals[kMaxSplitItems]; // blocks of an item done; the last resets it to 0

struct AttnArgs {
    KvRows k, v;
    const int32_t* pages;   // the sequence's page table, or null (kv_rows.cuh)
    const float* q;
    float* att;
    int32_t n, n_heads, group, head_dim, head_dim_v, pos0, window;
    const int32_t* pos0_device;   // when set, pos0 is read there (a replayed CUDA graph)
    KvTokenMap map;               // attention_tokens: each token's position and page table (map.pos set)
    int32_t tokens_per_block, rows, splits;
    int32_t tiles_per_split;      // attention_tokens: key tiles per split, fixed; else 0 (split evenly)
    float q_scale; // scale * log2(e), or scale alone when softcap > 0 (the cap applies before log2(e))
    float softcap;
    const float* sinks; // n_heads logits (natural log domain), or null
};

// Row slices of the score step: 4 when there are 4 rows or more, else the rows (1, 2; 3 rows use 2).
__host__ __device__ constexpr int row_slices(int rows) {
    return rows >= 4 ? 4 : (rows >= 2 ? 2 : 1);
}

// Shared memory in floats: the K/V tile (rows padded by 4 floats so that the lanes of a quarter warp,
// reading different keys at the same column, hit different banks: an odd number of float4s a row at head
// dims that are multiples of 8; at the other multiples of 4, which no model has, they conflict 2- to 4-way,
// accepted because a padding chosen at run time made ptxas schedule the common head dims' P V loop worse),
// the scaled queries, the scores (one slice per head-dim share; slice 0 then holds the probabilities), each
// row's rescale factor and final (m, l).
// A paired kernel (K and V staged together) keeps the V tile in a second buffer after the first.
struct Layout {
    int kv_stride, v_tile, qs, sp, alpha, ml, floats;
};
__host__ __device__ constexpr Layout layout_for(int rows, int head_dim, int head_dim_v, bool paired) {
    Layout l{};
    l.kv_stride = (head_dim > head_dim_v ? head_dim : head_dim_v) + 4;
    l.v_tile = paired ? kKeyTile * l.kv_stride : 0;
    l.qs = (paired ? 2 : 1) * kKeyTile * l.kv_stride;
    l.sp = l.qs + rows * head_dim;
    l.alpha = l.sp + (kWarps / row_slices(rows)) * rows * kKeyTile;
    l.ml = l.alpha + rows;
    l.floats = l.ml + 2 * rows;
    return l;
}

// Another block's results, read from L2 (ld.cg): L1 is not coherent across SMs.
__device__ __forceinline__ float load_other(const float* p) {
#if defined(__CUDA_ARCH__)
    return __ldcg(p);
#else
    return *p;
#endif
}
__device__ __forceinline__ float4 load_other4(const float* p) {
#if defined(__CUDA_ARCH__)
    return __ldcg(reinterpret_cast<const float4*>(p));
#else
    return *reinterpret_cast<const float4*>(p);
#endif
}

// 1 / the softmax denominator of a row whose final state is (m, l) in the log2 domain: l alone, or with head h's
// sink exp(sinks[h]) added, both rescaled to the larger of m and the sink's log2 (the CPU's attn_finish: a sink far
// above every score leaves the output near zero instead of overflowing). 0 where nothing contributes.
__device__ __forceinline__ float sink_inverse(float m, float l, const float* sinks, int h) {
    if (!sinks) return l > 0.0f ? 1.0f / l : 0.0f;
    const float s = sinks[h] * kLog2e;
    const float mx = fmaxf(m, s);
    const float a = l > 0.0f ? exp2f(m - mx) : 0.0f;
    return a / (l * a + exp2f(s - mx));
}

// Rows [0, count) of a K or V tile decoded to f32 at dst (row stride `stride` floats), 4 elements per
// thread and step, four steps' loads issued before their stores. The tile's rows are consecutive from
// first_row for the first in_page of them and from next_page on for the rest (a tile crosses at most one
// page boundary: 32 keys, pages of 128).
template <KvType F>
__device__ __forceinline__ void stage_tile(const uint8_t* first_row, int in_page, const uint8_t* next_page,
                                           int row_bytes, int count, int dim, float* dst, int stride) {
    const int quads = dim / 4; // 1 .. 64
    const int step_r = kThreads / quads, step_c = kThreads - step_r * quads;
    int r = static_cast<int>(threadIdx.x) / quads, c = static_cast<int>(threadIdx.x) - r * quads;
    while (r < count) {
        float4 x[4];
        int rr[4], cc[4];
        TERN_UNROLL
        for (int u = 0; u < 4; ++u) {
            rr[u] = r;
            cc[u] = c;
            if (r < count) {
                const uint8_t* row = r < in_page ? first_row + static_cast<int64_t>(r) * row_bytes
                                                 : next_page + static_cast<int64_t>(r - in_page) * row_bytes;
                x[u] = kv_codec::load4<F>(row, 4 * c);
            }
            r += step_r;
            c += step_c;
            if (c >= quads) {
                c -= quads;
                ++r;
            }
        }
        TERN_UNROLL
        for (int u = 0; u < 4; ++u)
            if (rr[u] < count) *reinterpret_cast<float4*>(dst + rr[u] * stride + 4 * cc[u]) = x[u];
    }
}

// Where stage_pair's loads of one tile are: row r, float4 c of a row of `quads`, stepping by the block.
struct TileCursor {
    int quads, step_r, step_c, r, c;
};
__device__ __forceinline__ TileCursor tile_cursor(int dim) {
    TileCursor t;
    t.quads = dim / 4;
    t.step_r = kThreads / t.quads;
    t.step_c = kThreads - t.step_r * t.quads;
    t.r = static_cast<int>(threadIdx.x) / t.quads;
    t.c = static_cast<int>(threadIdx.x) - t.r * t.quads;
    return t;
}
__device__ __forceinline__ void advance(TileCursor& t) {
    t.r += t.step_r;
    t.c += t.step_c;
    if (t.c >= t.quads) {
        t.c -= t.quads;
        ++t.r;
    }
}

// stage_tile of the K tile (dim dk) and the V tile (dim dv) of the same keys at once: up to kPairBatch
// loads of each issued before any store, so a block waits for memory once per tile instead of twice and
// has both tiles in flight (16 KB at head dim 128 in f16: the whole tile pair in one batch).
constexpr int kPairBatch = 8;
template <KvType F>
__device__ __forceinline__ void stage_pair(const uint8_t* k_first, const uint8_t* k_next, int k_row_bytes, int dk,
                                           const uint8_t* v_first, const uint8_t* v_next, int v_row_bytes, int dv,
                                           int in_page, int count, float* k_dst, float* v_dst, int stride) {
    TileCursor ck = tile_cursor(dk), cv = tile_cursor(dv);
    while (ck.r < count || cv.r < count) {
        float4 xk[kPairBatch], xv[kPairBatch];
        const TileCursor k0 = ck, v0 = cv; // the stores replay the cursors: fewer registers than addresses
        TERN_UNROLL
        for (int u = 0; u < kPairBatch; ++u) {
            if (ck.r < count) {
                const uint8_t* row = ck.r < in_page ? k_first + static_cast<int64_t>(ck.r) * k_row_bytes
                                                    : k_next + static_cast<int64_t>(ck.r - in_page) * k_row_bytes;
                xk[u] = kv_codec::load4<F>(row, 4 * ck.c);
            }
            advance(ck);
        }
        TERN_UNROLL
        for (int u = 0; u < kPairBatch; ++u) {
            if (cv.r < count) {
                const uint8_t* row = cv.r < in_page ? v_first + static_cast<int64_t>(cv.r) * v_row_bytes
                                                    : v_next + static_cast<int64_t>(cv.r - in_page) * v_row_bytes;
                xv[u] = kv_codec::load4<F>(row, 4 * cv.c);
            }
            advance(cv);
        }
        ck = k0;
        cv = v0;
        TERN_UNROLL
        for (int u = 0; u < kPairBatch; ++u) {
            if (ck.r < count) *reinterpret_cast<float4*>(k_dst + ck.r * stride + 4 * ck.c) = xk[u];
            advance(ck);
        }
        TERN_UNROLL
        for (int u = 0; u < kPairBatch; ++u) {
            if (cv.r < count) *reinterpret_cast<float4*>(v_dst + cv.r * stride + 4 * cv.c) = xv[u];
            advance(cv);
        }
    }
}

__device__ __forceinline__ float4 fma4(float p, float4 v, float4 acc) {
    return make_float4(fmaf(p, v.x, acc.x), fmaf(p, v.y, acc.y), fmaf(p, v.z, acc.z), fmaf(p, v.w, acc.w));
}
__device__ __forceinline__ float4 scale4(float4 v, float s) {
    return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}

// kMaxWarpRows: rows per warp in the score step; kMaxQuads: output pieces per thread; kMaxPasses:
// softmax passes of 16 rows. The decode variant (<= 8 rows) keeps all three small. The explicit minimum
// of one block per SM lets ptxas use the registers it needs (about 145 for decode, 188 for the general
// variant at sm_89): with the thread count alone it aimed at 96 for decode and spilled.
//
// kPaired: K and V of a tile staged together (stage_pair) into two buffers, the streaming decode kernel;
// else K, then V into the buffer K used, once the scores are done (the previous kernel, TERN_CUDA_ATTN=old).
template <KvType F, int kMaxWarpRows, int kMaxQuads, int kMaxPasses, bool kPaired>
__global__ void __launch_bounds__(kThreads, kPaired ? kPairedBlocksPerSm : 1) attention_kernel(AttnArgs a) {
    // First: pos0_device, the KV cache, the queries and the split scratch (states, arrival counters) are all
    // written or read by kernels before this one in a programmatic launch (dependent_launch.h).
    dependent_launch::wait_and_release();
    __shared__ int last_block;
    if (a.pos0_device) a.pos0 = *a.pos0_device;
    const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
    const int D = a.head_dim, Dv = a.head_dim_v, rows = a.rows, group = a.group;
    const Layout L = layout_for(rows, D, Dv, kPaired);
    float* smem = dynamic_shared<float>();
    float* kv = smem;
    float* vt = kPaired ? smem + L.v_tile : smem; // the V tile
    float* qs = smem + L.qs;
    float* sp = smem + L.sp;
    float* alpha_s = smem + L.alpha;
    float* ml = smem + L.ml;

    const int qtile = static_cast<int>(blockIdx.x), g = static_cast<int>(blockIdx.y),
              split = static_cast<int>(blockIdx.z);
    const int tok0 = qtile * a.tokens_per_block;
    const int tok_end = min(a.n, tok0 + a.tokens_per_block);
    const int32_t* pages = a.pages;
    if (a.map.pos) { // one token per block: its own position and sequence
        a.pos0 = a.map.pos[tok0] - tok0;
        pages = a.map.tables + a.map.table[tok0];
    }
    // The keys any of the tile's tokens sees, and this split's share of its 32-key tiles.
    const int khi = a.pos0 + tok_end - 1;
    const int klo = a.window > 0 ? max(0, a.pos0 + tok0 - a.window + 1) : 0;
    const int n_tiles = (khi - klo + kKeyTile) / kKeyTile;
    // attention_tokens: fixed shares from the first key. Else the tiles dealt out evenly, the shares differing
    // by one at most: rounding the share up instead would leave the last splits empty (157 tiles over 39
    // splits: shares of 5 and 7 idle blocks) and make the others longer.
    int tile_begin, tile_end;
    if (a.tiles_per_split > 0) {
        tile_begin = split * a.tiles_per_split;
        tile_end = min(n_tiles, tile_begin + a.tiles_per_split);
    } else {
        tile_begin = static_cast<int>(static_cast<int64_t>(split) * n_tiles / a.splits);
        tile_end = static_cast<int>(static_cast<int64_t>(split + 1) * n_tiles / a.splits);
    }

    // Queries, scaled: row r is token tok0 + r / group, head g * group + r % group (zeros past n).
    for (int t = tid; t < rows * (D / 4); t += kThreads) {
        const int r = t / (D / 4), c = t - r * (D / 4);
        const int tok = tok0 + r / group, h = g * group + r % group;
        float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (tok < tok_end)
            x = *reinterpret_cast<const float4*>(a.q + (static_cast<int64_t>(tok) * a.n_heads + h) * D + 4 * c);
        *reinterpret_cast<float4*>(qs + r * D + 4 * c) = scale4(x, a.q_scale);
    }

    // Score step: this warp's rows rslice, rslice + rs, ... over head dims [d_begin, d_begin + d_len): the
    // head dim's float4s shared out over the kWarps / rs slices, evenly at multiples of 32; at small head
    // dims the last slices get fewer or none (an empty share scores 0).
    const int rs = row_slices(rows);
    const int rslice = warp % rs, dslice = warp / rs;
    const int warp_rows = (rows - rslice + rs - 1) / rs;
    const int dslices = kWarps / rs, d_share = 4 * ((D / 4 + dslices - 1) / dslices);
    const int d_begin = min(D, dslice * d_share), d_len = min(D - d_begin, d_share);

    // Softmax step: pass p's row of this thread, its visible positions [lo, hi] (empty past n), its state.
    int row_lo[kMaxPasses], row_hi[kMaxPasses];
    float m_run[kMaxPasses], l_run[kMaxPasses];
    TERN_UNROLL
    for (int p = 0; p < kMaxPasses; ++p) {
        const int r = p * kRowsPerPass + tid / kRowLanes;
        const int tok = tok0 + r / group;
        row_lo[p] = 1;
        row_hi[p] = 0;
        if (r < rows && tok < tok_end) {
            row_hi[p] = a.pos0 + tok;
            row_lo[p] = a.window > 0 ? max(0, row_hi[p] - a.window + 1) : 0;
        }
        m_run[p] = -INFINITY;
        l_run[p] = 0.0f;
    }

    // P V step: output piece i of this thread is 4 floats at column 4 * col[i] of row prow[i].
    const int quads_per_row = Dv / 4;
    int prow[kMaxQuads], pcol[kMaxQuads];
    float4 acc[kMaxQuads];
    TERN_UNROLL
    for (int i = 0; i < kMaxQuads; ++i) {
        const int o = tid + i * kThreads;
        prow[i] = o / quads_per_row;
        pcol[i] = o - prow[i] * quads_per_row;
        if (prow[i] >= rows) prow[i] = -1;
        acc[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    for (int t = tile_begin; t < tile_end; ++t) {
        const int key0 = klo + t * kKeyTile;
        const int count = min(kKeyTile, khi + 1 - key0);
        const int in_page = kv_rows_in_page(a.k, pages, key0, count);
        __syncthreads(); // the previous tile's P V is done with the buffer and the probabilities (and Q is in)
        const int next_page_key = key0 + in_page - (in_page == count);
        if constexpr (kPaired)
            stage_pair<F>(kv_row(a.k, pages, g, key0), kv_row(a.k, pages, g, next_page_key), a.k.row_bytes, D,
                          kv_row(a.v, pages, g, key0), kv_row(a.v, pages, g, next_page_key), a.v.row_bytes, Dv,
                          in_page, count, kv, vt, L.kv_stride);
        else
            stage_tile<F>(kv_row(a.k, pages, g, key0), in_page, kv_row(a.k, pages, g, next_page_key), a.k.row_bytes,
                          count, D, kv, L.kv_stride);
        __syncthreads();

        float s[kMaxWarpRows];
        TERN_UNROLL
        for (int i = 0; i < kMaxWarpRows; ++i)
            s[i] = 0.0f;
        const float* krow = kv + lane * L.kv_stride + d_begin;
        const float* qrow = qs + rslice * D + d_begin;
        for (int d = 0; d < d_len; d += 4) {
            const float4 kk = *reinterpret_cast<const float4*>(krow + d);
            TERN_UNROLL
            for (int i = 0; i < kMaxWarpRows; ++i) {
                if (i < warp_rows) {
                    const float4 qq = *reinterpret_cast<const float4*>(qrow + i * rs * D + d);
                    s[i] = fmaf(qq.x, kk.x, fmaf(qq.y, kk.y, fmaf(qq.z, kk.z, fmaf(qq.w, kk.w, s[i]))));
                }
            }
        }
        TERN_UNROLL
        for (int i = 0; i < kMaxWarpRows; ++i)
            if (i < warp_rows) sp[(dslice * rows + rslice + i * rs) * kKeyTile + lane] = s[i];
        __syncthreads();

        TERN_UNROLL
        for (int p = 0; p < kMaxPasses; ++p) {
            if (p * kRowsPerPass + warp * (32 / kRowLanes) >= rows) continue; // the whole warp past the rows
            const int r = p * kRowsPerPass + tid / kRowLanes, rr = min(r, rows - 1);
            const int j0 = (lane % kRowLanes) * 4;
            float4 x = *reinterpret_cast<const float4*>(sp + rr * kKeyTile + j0);
            for (int slice = 1; slice < kWarps / rs; ++slice) {
                const float4 y = *reinterpret_cast<const float4*>(sp + (slice * rows + rr) * kKeyTile + j0);
                x = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
            }
            float v[4] = {x.x, x.y, x.z, x.w};
            float mx = -INFINITY;
            TERN_UNROLL
            for (int k = 0; k < 4; ++k) {
                float sc = v[k];
                if (a.softcap > 0.0f) sc = a.softcap * tanhf(sc / a.softcap) * kLog2e;
                const int pos = key0 + j0 + k;
                v[k] = (j0 + k < count && pos >= row_lo[p] && pos <= row_hi[p]) ? sc : -INFINITY;
                mx = fmaxf(mx, v[k]);
            }
            for (int offset = kRowLanes / 2; offset > 0; offset /= 2)
                mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFFu, mx, offset));
            const float m_new = fmaxf(m_run[p], mx);
            float alpha = 1.0f, sum = 0.0f;
            if (m_new != -INFINITY) { // else nothing visible yet: p = 0, the state stays (-inf, 0)
                alpha = exp2f(m_run[p] - m_new);
                TERN_UNROLL
                for (int k = 0; k < 4; ++k) {
                    v[k] = exp2f(v[k] - m_new);
                    sum += v[k];
                }
            } else {
                v[0] = v[1] = v[2] = v[3] = 0.0f;
            }
            for (int offset = kRowLanes / 2; offset > 0; offset /= 2)
                sum += __shfl_xor_sync(0xFFFFFFFFu, sum, offset);
            l_run[p] = l_run[p] * alpha + sum;
            m_run[p] = m_new;
            if (r < rows) {
                *reinterpret_cast<float4*>(sp + r * kKeyTile + j0) = make_float4(v[0], v[1], v[2], v[3]);
                if (lane % kRowLanes == 0) alpha_s[r] = alpha;
            }
        }
        if constexpr (!kPaired)
            stage_tile<F>(kv_row(a.v, pages, g, key0), in_page, kv_row(a.v, pages, g, next_page_key), a.v.row_bytes,
                          count, Dv, kv, L.kv_stride);
        __syncthreads();

        TERN_UNROLL
        for (int i = 0; i < kMaxQuads; ++i)
            if (prow[i] >= 0) acc[i] = scale4(acc[i], alpha_s[prow[i]]);
        for (int j = 0; j < count; ++j) {
            const float* vrow = vt + j * L.kv_stride;
            TERN_UNROLL
            for (int i = 0; i < kMaxQuads; ++i) {
                if (prow[i] >= 0) {
                    const float pj = sp[prow[i] * kKeyTile + j];
                    acc[i] = fma4(pj, *reinterpret_cast<const float4*>(vrow + 4 * pcol[i]), acc[i]);
                }
            }
        }
    }

    // Each row's (m, l) to shared memory for the threads holding its outputs.
    TERN_UNROLL
    for (int p = 0; p < kMaxPasses; ++p) {
        const int r = p * kRowsPerPass + tid / kRowLanes;
        if (r < rows && lane % kRowLanes == 0) {
            ml[2 * r] = m_run[p];
            ml[2 * r + 1] = l_run[p];
        }
    }
    __syncthreads();

    auto head_of = [&](int r) { return g * group + r % group; };
    auto out_of = [&](int r) { // the output row of block row r, or null past n
        const int tok = tok0 + r / group;
        return tok < tok_end ? a.att + (static_cast<int64_t>(tok) * a.n_heads + g * group + r % group) * Dv : nullptr;
    };
    if (a.splits == 1) {
        TERN_UNROLL
        for (int i = 0; i < kMaxQuads; ++i) {
            if (prow[i] < 0) continue;
            float* out = out_of(prow[i]);
            const float inv = sink_inverse(ml[2 * prow[i]], ml[2 * prow[i] + 1], a.sinks, head_of(prow[i]));
            if (out) *reinterpret_cast<float4*>(out + 4 * pcol[i]) = scale4(acc[i], inv);
        }
        return;
    }

    // Split: this block's state to the scratch, then the last block of the item merges them all.
    const int items = static_cast<int>(gridDim.x * gridDim.y);
    const int item = qtile * static_cast<int>(gridDim.y) + g;
    const int64_t state_floats = static_cast<int64_t>(rows) * Dv;
    float* part_acc = g_partials + (static_cast<int64_t>(item) * a.splits) * state_floats;
    float* part_ml = g_partials + static_cast<int64_t>(items) * a.splits * state_floats +
                     static_cast<int64_t>(item) * a.splits * 2 * rows;
    TERN_UNROLL
    for (int i = 0; i < kMaxQuads; ++i)
        if (prow[i] >= 0)
            *reinterpret_cast<float4*>(part_acc + split * state_floats + prow[i] * Dv + 4 * pcol[i]) = acc[i];
    for (int r = tid; r < 2 * rows; r += kThreads)
        part_ml[split * 2 * rows + r] = ml[r];
    __threadfence();
    __syncthreads();
    if (tid == 0) last_block = atomicAdd(&g_arrivals[item], 1u) == static_cast<unsigned>(a.splits - 1);
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    TERN_UNROLL
    for (int i = 0; i < kMaxQuads; ++i) {
        if (prow[i] < 0) continue;
        float* out = out_of(prow[i]);
        if (!out) continue;
        const int r = prow[i];
        // One pass with a running max, kMergeBatch splits' states loaded before any is combined: the
        // loads are in flight together, one L2 round trip per batch rather than two per split (a max pass,
        // then a sum pass) as the states of 32 splits and more would otherwise cost.
        float m = -INFINITY, l = 0.0f;
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int s0 = 0; s0 < a.splits; s0 += kMergeBatch) {
            float ms[kMergeBatch], ls[kMergeBatch];
            float4 os[kMergeBatch];
            TERN_UNROLL
            for (int u = 0; u < kMergeBatch; ++u) {
                const int s = min(s0 + u, a.splits - 1);
                ms[u] = load_other(part_ml + s * 2 * rows + 2 * r);
                ls[u] = s0 + u < a.splits ? load_other(part_ml + s * 2 * rows + 2 * r + 1) : 0.0f;
                os[u] = load_other4(part_acc + s * state_floats + r * Dv + 4 * pcol[i]);
            }
            TERN_UNROLL
            for (int u = 0; u < kMergeBatch; ++u) {
                if (!(ls[u] > 0.0f)) continue; // a split that saw none of this row's keys (or past the last)
                const float m_new = fmaxf(m, ms[u]);
                const float w_old = exp2f(m - m_new), w = exp2f(ms[u] - m_new);
                l = l * w_old + ls[u] * w;
                o = fma4(w, os[u], scale4(o, w_old));
                m = m_new;
            }
        }
        // (m, l): the row's final softmax state over all its keys; a sink joins its denominator here.
        *reinterpret_cast<float4*>(out + 4 * pcol[i]) = scale4(o, sink_inverse(m, l, a.sinks, head_of(r)));
    }
    if (tid == 0) g_arrivals[item] = 0; // ready for the next launch
}

struct Plan {
    AttentionPlan pub;
    int32_t group = 0, rows = 0;
    bool decode_variant = false;
    bool paired = false; // the decode variant's streaming kernel (stage_pair)
};

// TERN_CUDA_ATTN=old (set_old_decode_attention): the previous decode kernel and split rule, for timing.
std::atomic<bool> g_old_decode{false};

int multiprocessors() {
    int device = 0;
    check(cudaGetDevice(&device), "attention: cudaGetDevice");
#if defined(TERN_CUDA_EMULATOR)
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "attention: cudaGetDeviceProperties");
    return std::max(1, prop.multiProcessorCount);
#else
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "attention: cudaDeviceGetAttribute");
    return std::max(1, sms);
#endif
}

// Shared memory of one multiprocessor, in bytes (the emulator has no limit: an H100's 228 KiB).
int64_t shared_per_multiprocessor() {
#if defined(TERN_CUDA_EMULATOR)
    return 228 * 1024;
#else
    int device = 0, bytes = 0;
    check(cudaGetDevice(&device), "attention: cudaGetDevice");
    check(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device),
          "attention: cudaDeviceGetAttribute");
    return std::max(1, bytes);
#endif
}

// Blocks of this plan's kernel one multiprocessor holds at once: the registers' bound (kPairedBlocksPerSm for
// the paired kernel, whose launch bounds cap it at 168 registers; 2 for the others at about 150 and 195),
// lowered where the shared memory does not fit that many (1 KiB a block is the runtime's).
int64_t resident_blocks_per_sm(const Plan& plan, const KvLayer& layer) {
    const int64_t by_registers = plan.paired ? kPairedBlocksPerSm : 2;
    const int64_t bytes =
        int64_t{sizeof(float)} * layout_for(plan.rows, layer.head_dim, layer.head_dim_v, plan.paired).floats + 1024;
    return std::max<int64_t>(1, std::min(by_registers, shared_per_multiprocessor() / bytes));
}

Plan make_plan(const KvLayer& layer, int64_t n, int32_t n_heads, int32_t pos0, int32_t window) {
    kv_codec::check_kv_shape(layer.type, layer.head_dim, layer.head_dim_v, layer.n_kv_heads, layer.n_ctx, "attention");
    if (n_heads < layer.n_kv_heads || n_heads % layer.n_kv_heads != 0)
        throw std::invalid_argument("attention: " + std::to_string(n_heads) + " query heads over " +
                                    std::to_string(layer.n_kv_heads) + " KV heads");
    if (n < 0 || pos0 < 0 || pos0 + n > layer.n_ctx)
        throw std::invalid_argument("attention: positions " + std::to_string(pos0) + " + " + std::to_string(n) +
                                    " outside the cache's " + std::to_string(layer.n_ctx));
    Plan plan;
    plan.group = n_heads / layer.n_kv_heads;
    const int32_t widest = std::max(layer.head_dim, layer.head_dim_v);
    const int32_t rows_cap = std::min(kMaxRows, kMaxRowElems / widest); // 16 .. 64 (64 up to head dim 64)
    if (plan.group > rows_cap)
        throw std::invalid_argument("attention: " + std::to_string(plan.group) + " query heads per KV head; at most " +
                                    std::to_string(rows_cap) + " at head dim " + std::to_string(widest));
    if (n == 0) return plan;
    const int32_t tokens = static_cast<int32_t>(std::min<int64_t>(n, std::max(1, rows_cap / plan.group)));
    plan.rows = tokens * plan.group;
    plan.decode_variant = plan.rows <= 8 && plan.rows * layer.head_dim_v <= 2048;
    const bool old = g_old_decode.load(std::memory_order_relaxed);
    plan.paired = plan.decode_variant && !old;
    plan.pub.tokens_per_block = tokens;
    plan.pub.query_tiles = static_cast<int32_t>((n + tokens - 1) / tokens);

    // Splits (top comment): as many blocks as the GPU holds at once and no more (a second wave of a few blocks
    // would double the time), with at least kMinTilesPerSplit key tiles each. The old rule: 4 blocks per
    // multiprocessor rounded up, at least 2 tiles.
    const int64_t items = int64_t{plan.pub.query_tiles} * layer.n_kv_heads;
    const int64_t span = window > 0 ? std::min<int64_t>(int64_t{window} + tokens - 1, pos0 + n) : pos0 + n;
    const int64_t key_tiles = (span + kKeyTile - 1) / kKeyTile;
    const int64_t target_blocks = (old ? 4 : resident_blocks_per_sm(plan, layer)) * int64_t{multiprocessors()};
    const int64_t per_item = old ? (target_blocks + items - 1) / items : target_blocks / items;
    const int64_t min_tiles = old ? 2 : kMinTilesPerSplit;
    int64_t splits = 1;
    if (items < target_blocks && items <= kMaxSplitItems) {
        splits = std::min(per_item, std::max<int64_t>(1, key_tiles / min_tiles));
        splits = std::min(splits, kPartialFloats / (items * plan.rows * (layer.head_dim_v + 2)));
        splits = std::max<int64_t>(splits, 1);
    }
    plan.pub.splits = static_cast<int32_t>(splits);
    return plan;
}

template <KvType F, int kMaxWarpRows, int kMaxQuads, int kMaxPasses, bool kPaired>
void launch_attention(const AttnArgs& args, const Plan& plan, int32_t n_kv_heads, cudaStream_t stream) {
    const auto kernel = attention_kernel<F, kMaxWarpRows, kMaxQuads, kMaxPasses, kPaired>;
    const size_t bytes =
        sizeof(float) * static_cast<size_t>(layout_for(args.rows, args.head_dim, args.head_dim_v, kPaired).floats);
    if (bytes > 48 * 1024)
        check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)),
              "attention: shared memory size");
    launch_dependent(kernel,
                     dim3(static_cast<unsigned>(plan.pub.query_tiles), static_cast<unsigned>(n_kv_heads),
                          static_cast<unsigned>(plan.pub.splits)),
                     dim3(kThreads), bytes, stream, args);
}

template <KvType F> void launch_for_type(const AttnArgs& args, const Plan& plan, int32_t n_kv_heads, cudaStream_t s) {
    if (plan.paired)
        launch_attention<F, 2, 4, 1, true>(args, plan, n_kv_heads, s);
    else if (plan.decode_variant)
        launch_attention<F, 2, 4, 1, false>(args, plan, n_kv_heads, s);
    else
        launch_attention<F, kMaxRows / 4, kMaxRowElems / 4 / kThreads, kMaxRows / kRowsPerPass, false>(args, plan,
                                                                                                       n_kv_heads, s);
}

} // namespace

AttentionPlan attention_plan(const KvLayer& layer, int64_t n, int32_t n_heads, int32_t pos0, int32_t sliding_window) {
    return make_plan(layer, n, n_heads, pos0, sliding_window).pub;
}

void set_old_decode_attention(bool old) {
    g_old_decode.store(old, std::memory_order_relaxed);
}

namespace {

// The arguments of both launchers but the plan's and the positions'.
AttnArgs layer_args(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t group,
                    int32_t sliding_window, float scale, float softcap, float* att, const float* sinks) {
    if (!layer.k || !layer.v) throw std::invalid_argument("attention: the layer has no K or V buffer");
    AttnArgs a{};
    a.k = kv_rows_of(layer, false);
    a.v = kv_rows_of(layer, true);
    a.pages = layer.pages;
    a.q = q;
    a.att = att;
    a.n = static_cast<int32_t>(n);
    a.n_heads = n_heads;
    a.group = group;
    a.head_dim = layer.head_dim;
    a.head_dim_v = layer.head_dim_v;
    a.window = sliding_window > 0 ? sliding_window : 0;
    a.softcap = softcap > 0.0f ? softcap : 0.0f;
    a.q_scale = a.softcap > 0.0f ? scale : scale * kLog2e;
    a.sinks = sinks;
    return a;
}

void launch_any(KvType type, const AttnArgs& a, const Plan& plan, int32_t n_kv_heads, cudaStream_t stream) {
    switch (type) {
    case KvType::f32:
        launch_for_type<KvType::f32>(a, plan, n_kv_heads, stream);
        return;
    case KvType::f16:
        launch_for_type<KvType::f16>(a, plan, n_kv_heads, stream);
        return;
    case KvType::bf16:
        launch_for_type<KvType::bf16>(a, plan, n_kv_heads, stream);
        return;
    case KvType::q8_0:
        launch_for_type<KvType::q8_0>(a, plan, n_kv_heads, stream);
        return;
    case KvType::f8_e4m3:
        launch_for_type<KvType::f8_e4m3>(a, plan, n_kv_heads, stream);
        return;
    }
    throw std::invalid_argument("attention: unknown KV type");
}

} // namespace

void attention(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t pos0, int32_t sliding_window,
               float scale, float softcap, float* att, cudaStream_t stream, const int32_t* pos0_device,
               const float* sinks, PrefillAttention prefill) {
    const Plan plan = make_plan(layer, n, n_heads, pos0, sliding_window);
    if (n == 0) return;
    if (prefill == PrefillAttention::mma && !sinks && attention_mma_fits(layer, n, n_heads)) {
        attention_mma(layer, q, n, n_heads, pos0, sliding_window, scale, softcap, att, stream, pos0_device);
        return;
    }
    AttnArgs a = layer_args(layer, q, n, n_heads, plan.group, sliding_window, scale, softcap, att, sinks);
    a.pos0 = pos0;
    a.pos0_device = pos0_device;
    a.tokens_per_block = plan.pub.tokens_per_block;
    a.rows = plan.rows;
    a.splits = plan.pub.splits;
    launch_any(layer.type, a, plan, layer.n_kv_heads, stream);
}

void attention_tokens(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t sliding_window,
                      float scale, float softcap, float* att, const KvTokenMap& map, int32_t max_pos,
                      cudaStream_t stream, const float* sinks) {
    // The checks of attention() for one token at the last position any token has.
    Plan plan = make_plan(layer, std::min<int64_t>(n, 1), n_heads, std::max(max_pos, 0), sliding_window);
    if (n == 0) return;
    if (!map.pos || !map.table || !map.tables) throw std::invalid_argument("attention_tokens: no token map");
    constexpr int32_t kTilesPerSplit = kTokenKeysPerSplit / kKeyTile;
    // A token's key tiles: from its first visible key to itself (the window bounds them).
    const int32_t max_tiles = (sliding_window > 0 ? std::min(sliding_window - 1, max_pos) : max_pos) / kKeyTile + 1;
    const int32_t splits = (max_tiles + kTilesPerSplit - 1) / kTilesPerSplit;
    plan.pub.splits = splits;
    // Tokens per launch: the split states and arrival counters of one launch must fit their buffers.
    int64_t chunk = n;
    if (splits > 1)
        chunk = std::min<int64_t>({n, kMaxSplitItems / layer.n_kv_heads,
                                   kPartialFloats / (int64_t{layer.n_kv_heads} * splits * plan.rows *
                                                     (layer.head_dim_v + 2))});
    if (chunk < 1) throw std::invalid_argument("attention_tokens: a token's split states do not fit the scratch");
    for (int64_t first = 0; first < n; first += chunk) {
        const int64_t count = std::min(chunk, n - first);
        AttnArgs a = layer_args(layer, q + first * n_heads * layer.head_dim, count, n_heads, plan.group, sliding_window,
                                scale, softcap, att + first * n_heads * layer.head_dim_v, sinks);
        a.map = {map.pos + first, map.table + first, map.tables};
        a.tokens_per_block = 1;
        a.rows = plan.rows;
        a.splits = splits;
        a.tiles_per_split = kTilesPerSplit;
        plan.pub.query_tiles = static_cast<int32_t>(count);
        launch_any(layer.type, a, plan, layer.n_kv_heads, stream);
    }
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
