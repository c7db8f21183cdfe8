// Flash-style attention: row formats, the scalar chunk kernel (the twin of attention_avx2.cpp), the
// chunk merge and the drivers that walk absolute-position chunks (see attention.h for why they are absolute).
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"
#include "base/parallel_for.h"
#include "quant/fp8.h"
#include "quant/half.h"
#include "quant/reference.h"

namespace tern {

void kv_store_row(KvType f, const float* src, void* dst, int64_t n) {
    switch (f) {
    case KvType::f32: std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n)); return;
    case KvType::f16: {
        auto* d = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i)
            d[i] = f32_to_f16(src[i]);
        return;
    }
    case KvType::bf16: {
        auto* d = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i)
            d[i] = f32_to_bf16(src[i]);
        return;
    }
    case KvType::q8_0: quantize_row(GgmlType::Q8_0, src, dst, n); return;
    case KvType::f8_e4m3: quantize_row_f8_e4m3_fast(src, dst, n); return;   // every token: the cheap search
    }
}

void kv_load_row(KvType f, const void* src, float* dst, int64_t n) {
    switch (f) {
    case KvType::f32: std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n)); return;
    case KvType::f16: {
        const auto* s = static_cast<const uint16_t*>(src);
        for (int64_t i = 0; i < n; ++i)
            dst[i] = f16_to_f32(s[i]);
        return;
    }
    case KvType::bf16: {
        const auto* s = static_cast<const uint16_t*>(src);
        for (int64_t i = 0; i < n; ++i)
            dst[i] = bf16_to_f32(s[i]);
        return;
    }
    case KvType::q8_0: dequantize_row(GgmlType::Q8_0, src, dst, n); return;
    case KvType::f8_e4m3: dequantize_row(GgmlType::F8_E4M3, src, dst, n); return;
    }
}

void attn_chunk_scalar(const AttnParams& p, const float* q, int64_t q_stride, const void* k, const void* v,
                       int64_t n_keys, float* scores, float* m, float* l, float* acc) {
    const size_t k_bytes = kv_row_bytes(p.format, p.head_dim), v_bytes = kv_row_bytes(p.format, p.head_dim_v);
    std::vector<float> row(static_cast<size_t>(std::max(p.head_dim, p.head_dim_v)));
    const auto* kb = static_cast<const uint8_t*>(k);
    const auto* vb = static_cast<const uint8_t*>(v);
    for (int64_t j = 0; j < n_keys; ++j) {
        kv_load_row(p.format, kb + static_cast<size_t>(j) * k_bytes, row.data(), p.head_dim);
        for (int64_t h = 0; h < p.group; ++h) {
            float s = dot_f32(q + h * q_stride, row.data(), p.head_dim) * p.scale;
            if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
            scores[h * kAttnChunk + j] = s;
        }
    }
    for (int64_t h = 0; h < p.group; ++h) {
        float* s = scores + h * kAttnChunk;
        const float mx = *std::max_element(s, s + n_keys);
        float sum = 0.0f;
        for (int64_t j = 0; j < n_keys; ++j) {
            s[j] = std::exp(s[j] - mx);
            sum += s[j];
        }
        m[h] = mx;
        l[h] = sum;
        std::fill(acc + h * p.head_dim_v, acc + (h + 1) * p.head_dim_v, 0.0f);
    }
    for (int64_t j = 0; j < n_keys; ++j) {
        kv_load_row(p.format, vb + static_cast<size_t>(j) * v_bytes, row.data(), p.head_dim_v);
        for (int64_t h = 0; h < p.group; ++h) {
            const float w = scores[h * kAttnChunk + j];
            float* a = acc + h * p.head_dim_v;
            for (int64_t d = 0; d < p.head_dim_v; ++d)
                a[d] += w * row[static_cast<size_t>(d)];
        }
    }
}

AttnChunkFn attn_chunk_kernel(const AttnParams& p, const CpuKernels* k) {
    if (p.head_dim % 8 != 0 || p.head_dim_v % 8 != 0) return attn_chunk_scalar;
    return (k ? *k : cpu_kernels()).attn_chunk;
}

void attn_merge(const AttnParams& p, float* m, float* l, float* acc, const float* mc, const float* lc,
                const float* accc) {
    for (int64_t h = 0; h < p.group; ++h) {
        const float mn = std::max(m[h], mc[h]);
        const float a = std::exp(m[h] - mn), b = std::exp(mc[h] - mn);
        m[h] = mn;
        l[h] = l[h] * a + lc[h] * b;
        float* x = acc + h * p.head_dim_v;
        const float* y = accc + h * p.head_dim_v;
        for (int64_t d = 0; d < p.head_dim_v; ++d)
            x[d] = x[d] * a + y[d] * b;
    }
}

void attn_finish(const AttnParams& p, int64_t g, const float* m, const float* l, const float* acc, float* out,
                 int64_t out_stride) {
    for (int64_t h = 0; h < p.group; ++h) {
        float inv = 1.0f / l[h];
        if (p.sinks) {
            // The sink as one more score with a zero value row: rescale to the larger of the two maxima so that
            // neither exponential overflows (a sink far above every score leaves the output near zero).
            const float sink = p.sinks[g * p.group + h];
            const float mx = std::max(m[h], sink);
            const float a = std::exp(m[h] - mx);
            inv = a / (l[h] * a + std::exp(sink - mx));
        }
        for (int64_t d = 0; d < p.head_dim_v; ++d)
            out[h * out_stride + d] = acc[h * p.head_dim_v + d] * inv;
    }
}

namespace {

// Chunk states: m (group), l (group), acc (group * head_dim_v), packed.
size_t state_floats(const AttnParams& p) { return static_cast<size_t>(p.group * (2 + p.head_dim_v)); }

struct ChunkRange {
    int32_t begin, end; // [begin, end)
};

// Chunk c of the visible range [lo, hi]: the absolute chunk c0 + c clipped to it.
ChunkRange chunk_range(int32_t lo, int32_t hi, int64_t c) {
    const int64_t start = (lo / kAttnChunk + c) * kAttnChunk;
    return {static_cast<int32_t>(std::max<int64_t>(start, lo)),
            static_cast<int32_t>(std::min<int64_t>(start + kAttnChunk, int64_t{hi} + 1))};
}

int64_t n_chunks(int32_t lo, int32_t hi) { return hi / kAttnChunk - lo / kAttnChunk + 1; }

// The first row of a chunk of one KV head, K and V.
struct ChunkRows {
    const uint8_t* k;
    const uint8_t* v;
};

// Rows stored as one run per head from position 0 (k_heads[g], v_heads[g]).
struct HeadRuns {
    const void* const* k_heads;
    const void* const* v_heads;
    size_t k_chunk_bytes, v_chunk_bytes;   // kAttnChunk rows
    ChunkRows operator()(int64_t g, int64_t c) const {
        return {static_cast<const uint8_t*>(k_heads[g]) + static_cast<size_t>(c) * k_chunk_bytes,
                static_cast<const uint8_t*>(v_heads[g]) + static_cast<size_t>(c) * v_chunk_bytes};
    }
};
HeadRuns head_runs(const AttnParams& p, const void* const* k_heads, const void* const* v_heads) {
    return {k_heads, v_heads, kAttnChunk * kv_row_bytes(p.format, p.head_dim),
            kAttnChunk * kv_row_bytes(p.format, p.head_dim_v)};
}

// Rows in pages of kAttnChunk positions (KvPagesView).
struct PagedRows {
    const KvPagesView* kv;
    ChunkRows operator()(int64_t g, int64_t c) const {
        const auto page = static_cast<size_t>(kv->pages[c]);
        return {kv->k + page * kv->k_page_stride + static_cast<size_t>(g) * kv->k_head_stride,
                kv->v + page * kv->v_page_stride + static_cast<size_t>(g) * kv->v_head_stride};
    }
};

// One chunk's state from the rows of chunk r.begin / kAttnChunk (a chunk range never crosses a chunk boundary).
void run_chunk(const AttnParams& p, AttnChunkFn kernel, const float* q, int64_t q_stride, ChunkRows chunk,
               ChunkRange r, float* scores, float* state) {
    const auto skip = static_cast<size_t>(r.begin % kAttnChunk);
    const uint8_t* k = chunk.k + skip * kv_row_bytes(p.format, p.head_dim);
    const uint8_t* v = chunk.v + skip * kv_row_bytes(p.format, p.head_dim_v);
    kernel(p, q, q_stride, k, v, r.end - r.begin, scores, state, state + p.group, state + 2 * p.group);
}

// state (already holding chunks 0..c) / l -> out.
void finish(const AttnParams& p, int64_t g, const float* state, float* out, int64_t out_stride) {
    attn_finish(p, g, state, state + p.group, state + 2 * p.group, out, out_stride);
}

void merge_state(const AttnParams& p, float* running, const float* chunk) {
    attn_merge(p, running, running + p.group, running + 2 * p.group, chunk, chunk + p.group, chunk + 2 * p.group);
}

int32_t window_lo(int32_t pos, int32_t window) { return window > 0 ? std::max(0, pos - window + 1) : 0; }

} // namespace

size_t attn_scratch_floats(const AttnParams& p) {
    return static_cast<size_t>(p.group * kAttnChunk) + 2 * state_floats(p);
}

namespace {

// attend_group over any row addressing: chunks of [lo, hi] in order, each merged into the running state.
template <class Rows>
void attend_group_rows(const AttnParams& p, AttnChunkFn kernel, const float* q, int64_t q_stride, const Rows& rows,
                       int64_t g, int32_t lo, int32_t hi, float* scratch, float* out, int64_t out_stride) {
    float* scores = scratch;
    float* running = scores + p.group * kAttnChunk;
    float* chunk = running + state_floats(p);
    const int64_t nc = n_chunks(lo, hi);
    const int64_t c0 = lo / kAttnChunk;
    run_chunk(p, kernel, q, q_stride, rows(g, c0), chunk_range(lo, hi, 0), scores, running);
    for (int64_t c = 1; c < nc; ++c) {
        run_chunk(p, kernel, q, q_stride, rows(g, c0 + c), chunk_range(lo, hi, c), scores, chunk);
        merge_state(p, running, chunk);
    }
    finish(p, g, running, out, out_stride);
}

template <class Rows>
void attend_tokens_rows(const AttnParams& p, AttnChunkFn kernel, int64_t n_kv_heads, const Rows& rows, int32_t pos0,
                        int64_t n, int32_t window, const float* q, int64_t q_token_stride, float* out,
                        int64_t out_token_stride, int n_threads) {
    const int32_t last = pos0 + static_cast<int32_t>(n) - 1;
    const int64_t visible = window > 0 ? std::min<int64_t>(window, last + 1) : last + 1;
    const int64_t work = n * n_kv_heads * p.group * visible * (p.head_dim + p.head_dim_v);
    // A thread per 32K multiply-adds at least: decode at a few dozen positions already pays for a second thread
    // (llama-1b, 64 positions: 23 -> 17 us per layer on the 2-core Xeon), and a many-core machine does not wake
    // dozens of threads for it.
    const int threads = static_cast<int>(std::clamp<int64_t>(work >> 15, 1, std::max(1, n_threads)));
    const int64_t pairs = n * n_kv_heads;
    if (pairs >= threads) {
        // Enough (token, KV head) pairs to share out: each walks its chunks in order.
        parallel_for(pairs, threads, 1, [&](int64_t t0, int64_t t1) {
            thread_local std::vector<float> scratch;
            scratch.resize(attn_scratch_floats(p));
            for (int64_t t = t0; t < t1; ++t) {
                const int64_t i = t / n_kv_heads, g = t % n_kv_heads;
                const int32_t pos = pos0 + static_cast<int32_t>(i);
                attend_group_rows(p, kernel, q + i * q_token_stride + g * p.group * p.head_dim, p.head_dim, rows, g,
                                  window_lo(pos, window), pos, scratch.data(),
                                  out + i * out_token_stride + g * p.group * p.head_dim_v, p.head_dim_v);
            }
        });
        return;
    }
    // Decode: fewer pairs than threads (Gemma 3 has one KV head), so the chunks of each pair are computed
    // in parallel into their own states and then merged in chunk order: the same arithmetic as above.
    std::vector<int64_t> first(static_cast<size_t>(pairs) + 1, 0); // first chunk index of each pair
    for (int64_t t = 0; t < pairs; ++t) {
        const int32_t pos = pos0 + static_cast<int32_t>(t / n_kv_heads);
        first[static_cast<size_t>(t) + 1] = first[static_cast<size_t>(t)] + n_chunks(window_lo(pos, window), pos);
    }
    const int64_t total = first.back();
    const size_t sf = state_floats(p);
    std::vector<float> states(static_cast<size_t>(total) * sf);
    parallel_for(total, threads, 4, [&](int64_t c0, int64_t c1) {
        thread_local std::vector<float> scores;
        scores.resize(static_cast<size_t>(p.group * kAttnChunk));
        for (int64_t c = c0; c < c1; ++c) {
            const int64_t t = std::upper_bound(first.begin(), first.end(), c) - first.begin() - 1;
            const int64_t i = t / n_kv_heads, g = t % n_kv_heads;
            const int32_t pos = pos0 + static_cast<int32_t>(i);
            const int32_t lo = window_lo(pos, window);
            const int64_t local = c - first[static_cast<size_t>(t)];
            run_chunk(p, kernel, q + i * q_token_stride + g * p.group * p.head_dim, p.head_dim,
                      rows(g, lo / kAttnChunk + local), chunk_range(lo, pos, local), scores.data(),
                      states.data() + static_cast<size_t>(c) * sf);
        }
    });
    for (int64_t t = 0; t < pairs; ++t) {
        const int64_t i = t / n_kv_heads, g = t % n_kv_heads;
        float* running = states.data() + static_cast<size_t>(first[static_cast<size_t>(t)]) * sf;
        for (int64_t c = first[static_cast<size_t>(t)] + 1; c < first[static_cast<size_t>(t) + 1]; ++c)
            merge_state(p, running, states.data() + static_cast<size_t>(c) * sf);
        finish(p, g, running, out + i * out_token_stride + g * p.group * p.head_dim_v, p.head_dim_v);
    }
}

} // namespace

void attend_group(const AttnParams& p, AttnChunkFn kernel, const float* q, int64_t q_stride, const void* k_head,
                  const void* v_head, int32_t lo, int32_t hi, float* scratch, float* out, int64_t out_stride) {
    attend_group_rows(p, kernel, q, q_stride, head_runs(p, &k_head, &v_head), 0, lo, hi, scratch, out, out_stride);
}

void attend_tokens(const AttnParams& p, AttnChunkFn kernel, int64_t n_kv_heads, const void* const* k_heads,
                   const void* const* v_heads, int32_t pos0, int64_t n, int32_t window, const float* q,
                   int64_t q_token_stride, float* out, int64_t out_token_stride, int n_threads) {
    attend_tokens_rows(p, kernel, n_kv_heads, head_runs(p, k_heads, v_heads), pos0, n, window, q, q_token_stride, out,
                       out_token_stride, n_threads);
}

void attend_tokens(const AttnParams& p, AttnChunkFn kernel, int64_t n_kv_heads, const KvPagesView& kv, int32_t pos0,
                   int64_t n, int32_t window, const float* q, int64_t q_token_stride, float* out,
                   int64_t out_token_stride, int n_threads) {
    attend_tokens_rows(p, kernel, n_kv_heads, PagedRows{&kv}, pos0, n, window, q, q_token_stride, out,
                       out_token_stride, n_threads);
}

} // namespace tern
