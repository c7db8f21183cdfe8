#pragma once
// Flash-style attention over a KV cache stored as f32, f16, bf16, q8_0 or f8_e4m3 rows.
//
// One call handles the `group` query heads that share one KV head (GQA), so each K/V row is read and
// converted once per group, not once per query head. Keys are walked in chunks of kAttnChunk positions
// aligned to ABSOLUTE positions (chunk c covers [c * kAttnChunk, (c + 1) * kAttnChunk), clipped to the
// visible range). Each chunk yields a partial softmax state (max, sum of exponentials, weighted V sum)
// computed from scratch, and the chunk states are merged strictly left to right.
//
// Batch invariance: that definition depends only on the query, its visible range [lo, hi] and the cache,
// never on which other tokens are in the batch nor on the thread count. A token decoded alone and the
// same token inside a prefill or a draft-verification batch therefore get bit-identical outputs, and the
// decode path may compute the chunk states of one query on different threads (attend_tokens does, when
// there are fewer (token, KV head) pairs than threads) and still merge them in the same order.
//
// Row formats: kernels/kv_format.h (KvType, kv_row_bytes); both block formats need head dims that are
// multiples of 32.
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dispatch.h"
#include "kernels/kv_format.h"

namespace tern {

// One row, f32 <-> stored format. The block formats use quant/reference's quantizers (round to nearest).
void kv_store_row(KvType f, const float* src, void* dst, int64_t n);
void kv_load_row(KvType f, const void* src, float* dst, int64_t n);

inline constexpr int64_t kAttnChunk = kKvPagePositions; // positions per chunk state (and per decode work item)

struct AttnParams {
    KvType format = KvType::f16;
    int64_t head_dim = 0, head_dim_v = 0;
    int64_t group = 1;    // query heads per KV head
    float scale = 1.0f;   // score = (q . k) * scale
    float softcap = 0.0f; // > 0: score = softcap * tanh(score / softcap) (gemma2)
    // Attention sinks (gpt-oss), or nullptr: one logit per query head that joins the softmax's denominator with
    // no value row, so out = sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink)). Query head r of KV head g reads
    // sinks[g * group + r] (attend_group: sinks[r]). Applied once, when the merged state is turned into the
    // output, so the chunk kernels and the merge are the same with or without it.
    const float* sinks = nullptr;
};

// The softmax state of one chunk for `group` heads: m[h] the largest score, l[h] = sum_j exp(s_j - m[h]),
// acc[h * head_dim_v + d] = sum_j exp(s_j - m[h]) * v_j[d].
// Kernel: q row h at q + h * q_stride (head_dim f32); k, v point at the chunk's first row, rows contiguous;
// 1 <= n_keys <= kAttnChunk; scores is group * kAttnChunk floats of scratch. The signature is AttnChunkFn
// (dispatch.h); a set's kernel is CpuKernels::attn_chunk (the AVX2 + FMA + F16C one of attention_avx2.cpp in the
// x86 SIMD sets, the scalar twin in the others).

// The scalar twin (each row converted to f32, then dot_f32 / std::exp).
void attn_chunk_scalar(const AttnParams& p, const float* q, int64_t q_stride, const void* k, const void* v,
                       int64_t n_keys, float* scores, float* m, float* l, float* acc);
// The kernel the set k (nullptr: this process's, cpu_kernels()) uses for p: its attn_chunk, or the scalar twin
// when the head dims are not multiples of 8.
AttnChunkFn attn_chunk_kernel(const AttnParams& p, const CpuKernels* k = nullptr);

// Folds a chunk state (mc, lc, accc) into a running one (m, l, acc), in that order. Fixed arithmetic,
// compiled once, so every path merges the same way.
void attn_merge(const AttnParams& p, float* m, float* l, float* acc, const float* mc, const float* lc,
                const float* accc);

// The output of a merged state for one group: acc / l, with the group's sinks (p.sinks + g * group) joining l.
void attn_finish(const AttnParams& p, int64_t g, const float* m, const float* l, const float* acc, float* out,
                 int64_t out_stride);

// Full attention for one query group over visible positions [lo, hi] of one KV head:
// k_head / v_head point at row 0 (position 0); out row h at out + h * out_stride (head_dim_v f32).
// scratch: attn_scratch_floats(p) floats.
size_t attn_scratch_floats(const AttnParams& p);
void attend_group(const AttnParams& p, AttnChunkFn kernel, const float* q, int64_t q_stride, const void* k_head,
                  const void* v_head, int32_t lo, int32_t hi, float* scratch, float* out, int64_t out_stride);

// Where one layer's cached rows are when they are not one run per head: the rows of KV head g in chunk c
// (positions [c * kAttnChunk, (c + 1) * kAttnChunk)) are contiguous from
//   k + page(c) * k_page_stride + g * k_head_stride   (likewise v), page(c) = pages[c],
// so a chunk never straddles two pages and the chunk states, hence the bits, are those of a contiguous cache.
// The paged CPU cache (engine/cpu/kv_cache.h) keeps every head of a page together.
struct KvPagesView {
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;
    const int32_t* pages = nullptr;   // page of chunk c; chunks up to the last visible position are mapped
    size_t k_page_stride = 0, v_page_stride = 0;   // bytes between pages
    size_t k_head_stride = 0, v_head_stride = 0;   // bytes between KV heads inside a page
};

// Attention for n query tokens at positions pos0 .. pos0 + n - 1 over a cache of n_kv_heads heads
// (row 0 of head g at k_heads[g] / v_heads[g]). Token i, query head h = g * group + r is at
// q + i * q_token_stride + h * head_dim; its output at out + i * out_token_stride + h * head_dim_v.
// Token i sees [lo, pos0 + i] with lo = max(0, pos - window + 1) when window > 0, else 0.
// Up to n_threads threads of the pool (thread_pool.h); the result is the same for any n_threads and any n.
void attend_tokens(const AttnParams& p, AttnChunkFn kernel, int64_t n_kv_heads, const void* const* k_heads,
                   const void* const* v_heads, int32_t pos0, int64_t n, int32_t window, const float* q,
                   int64_t q_token_stride, float* out, int64_t out_token_stride, int n_threads);
// The same over a paged cache: bit for bit what the call above gives for the same rows stored contiguously.
void attend_tokens(const AttnParams& p, AttnChunkFn kernel, int64_t n_kv_heads, const KvPagesView& kv, int32_t pos0,
                   int64_t n, int32_t window, const float* q, int64_t q_token_stride, float* out,
                   int64_t out_token_stride, int n_threads);

} // namespace tern
