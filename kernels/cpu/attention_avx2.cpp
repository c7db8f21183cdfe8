// The AVX2 + FMA + F16C chunk kernel of flash-style attention (compiled with -mavx2 -mfma -mf16c,
// kernels/CMakeLists.txt; only the sets whose CPU has them hold it, dispatch.cpp). The twin is
// attn_chunk_scalar in attention.cpp: same chunk state, different summation order and a polynomial exp.
//
// Rows are converted to f32 eight elements at a time in registers, straight from the stored format:
//   f16 vcvtph2ps; bf16 a 16-bit shift; q8_0 int8 -> f32 times the block scale;
//   f8_e4m3: the byte's sign/exponent/mantissa moved into an f16 (exponent bias 15 instead of 7, so the
//   f16 is the e4m3 value times 2^-8, subnormals included), vcvtph2ps, times (block scale * 256). Scaling by
//   a power of two is exact, so each element is the same f32 as quant/reference's d * e4m3_to_f32(q).
// Query heads are processed in tiles of up to 4 so one converted K/V slice feeds 4 FMAs.
// No std:: templates here (std::max_element, ...): an AVX2 instantiation of one could be the copy the
// linker keeps for the whole binary.
#include "kernels/cpu/attention.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/avx2_sum.h"

namespace tern {
namespace {

// exp(x) for x <= 0 (scores minus their max): Cody-Waite reduction by ln 2 and a degree-6 polynomial,
// ~2 ulp; below -87 it returns ~1e-38 instead of a denormal (the weight of such a key is nil anyway).
inline __m256 exp_ps(__m256 x) {
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// The multiplier of the 32-element block holding element d of a row (1 for the float formats).
template <KvType F> inline __m256 block_scale(const uint8_t* row, int64_t d) {
    if constexpr (F == KvType::q8_0 || F == KvType::f8_e4m3) {
        const uint8_t* blk = row + (d / 32) * 34;
        float s = _cvtsh_ss(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
        if constexpr (F == KvType::f8_e4m3) s *= 256.0f;
        return _mm256_set1_ps(s);
    } else {
        (void)row;
        (void)d;
        return _mm256_set1_ps(1.0f);
    }
}

// Elements d .. d + 7 of a row as f32 (d a multiple of 8); `scale` from block_scale for the block formats.
template <KvType F> inline __m256 load8(const uint8_t* row, int64_t d, __m256 scale) {
    if constexpr (F == KvType::f32) {
        (void)scale;
        return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + d);
    } else if constexpr (F == KvType::f16) {
        (void)scale;
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d)));
    } else if constexpr (F == KvType::bf16) {
        (void)scale;
        const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * d)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
    } else if constexpr (F == KvType::q8_0) {
        const uint8_t* qs = row + (d / 32) * 34 + 2 + d % 32;
        const __m256i w = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(w), scale);
    } else {
        const uint8_t* qs = row + (d / 32) * 34 + 2 + d % 32;
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs));
        // byte q -> 16-bit q << 8 -> arithmetic >> 1 puts the sign at bit 15 (and a copy at 14, cleared) and
        // the 4 exponent + 3 mantissa bits at 13..7: an f16 whose value is e4m3(q) * 2^-8.
        const __m128i h = _mm_and_si128(_mm_srai_epi16(_mm_unpacklo_epi8(_mm_setzero_si128(), b), 1),
                                        _mm_set1_epi16(static_cast<short>(0xBFFF)));
        return _mm256_mul_ps(_mm256_cvtph_ps(h), scale);
    }
}

// scores[h * kAttnChunk + j] = (q_h . k_j) * scale for NH heads starting at q.
template <KvType F, int NH>
void scores_tile(const AttnParams& p, const float* q, int64_t q_stride, const uint8_t* k, size_t k_bytes,
                 int64_t n_keys, float* scores) {
    for (int64_t j = 0; j < n_keys; ++j) {
        const uint8_t* row = k + static_cast<size_t>(j) * k_bytes;
        __m256 acc[NH];
        for (int h = 0; h < NH; ++h)
            acc[h] = _mm256_setzero_ps();
        int64_t d = 0;
        for (; d + 32 <= p.head_dim; d += 32) { // whole blocks: one scale, four slices
            const __m256 scale = block_scale<F>(row, d);
#pragma GCC unroll 4
            for (int64_t s = 0; s < 32; s += 8) {
                const __m256 x = load8<F>(row, d + s, scale);
                for (int h = 0; h < NH; ++h)
                    acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * q_stride + d + s), x, acc[h]);
            }
        }
        for (; d < p.head_dim; d += 8) { // float formats only (block formats have head dims of whole blocks)
            const __m256 x = load8<F>(row, d, _mm256_set1_ps(1.0f));
            for (int h = 0; h < NH; ++h)
                acc[h] = _mm256_fmadd_ps(_mm256_loadu_ps(q + h * q_stride + d), x, acc[h]);
        }
        for (int h = 0; h < NH; ++h)
            scores[h * kAttnChunk + j] = hsum(acc[h]) * p.scale;
    }
}

// acc[h * head_dim_v + d] = sum_j w[h * kAttnChunk + j] * v_j[d] for NH heads, 16 columns per pass (one block
// scale per row and pass; 2 * NH accumulators) while they last, then 8.
template <KvType F, int NH>
void values_tile(const AttnParams& p, const float* w, const uint8_t* v, size_t v_bytes, int64_t n_keys, float* out) {
    int64_t d = 0;
    for (; d + 16 <= p.head_dim_v; d += 16) {
        __m256 lo[NH], hi[NH];
        for (int h = 0; h < NH; ++h)
            lo[h] = hi[h] = _mm256_setzero_ps();
        for (int64_t j = 0; j < n_keys; ++j) {
            const uint8_t* row = v + static_cast<size_t>(j) * v_bytes;
            const __m256 scale = block_scale<F>(row, d);
            const __m256 x0 = load8<F>(row, d, scale), x1 = load8<F>(row, d + 8, scale);
            for (int h = 0; h < NH; ++h) {
                const __m256 wj = _mm256_broadcast_ss(w + h * kAttnChunk + j);
                lo[h] = _mm256_fmadd_ps(wj, x0, lo[h]);
                hi[h] = _mm256_fmadd_ps(wj, x1, hi[h]);
            }
        }
        for (int h = 0; h < NH; ++h) {
            _mm256_storeu_ps(out + h * p.head_dim_v + d, lo[h]);
            _mm256_storeu_ps(out + h * p.head_dim_v + d + 8, hi[h]);
        }
    }
    for (; d < p.head_dim_v; d += 8) {
        __m256 acc[NH];
        for (int h = 0; h < NH; ++h)
            acc[h] = _mm256_setzero_ps();
        for (int64_t j = 0; j < n_keys; ++j) {
            const uint8_t* row = v + static_cast<size_t>(j) * v_bytes;
            const __m256 x = load8<F>(row, d, block_scale<F>(row, d));
            for (int h = 0; h < NH; ++h)
                acc[h] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + h * kAttnChunk + j), x, acc[h]);
        }
        for (int h = 0; h < NH; ++h)
            _mm256_storeu_ps(out + h * p.head_dim_v + d, acc[h]);
    }
}

// Tiles of 4 heads, then the remainder (groups of 1 .. 8 and 7 = 4 + 3 all occur).
template <KvType F>
void for_head_tiles(int64_t group, auto&& tile4, auto&& tile3, auto&& tile2, auto&& tile1) {
    int64_t h = 0;
    for (; h + 4 <= group; h += 4)
        tile4(h);
    switch (group - h) {
    case 3: tile3(h); break;
    case 2: tile2(h); break;
    case 1: tile1(h); break;
    default: break;
    }
}

template <KvType F>
void chunk_avx2(const AttnParams& p, const float* q, int64_t q_stride, const void* k, const void* v, int64_t n_keys,
                float* scores, float* m, float* l, float* acc) {
    const auto* kb = static_cast<const uint8_t*>(k);
    const auto* vb = static_cast<const uint8_t*>(v);
    const size_t k_bytes = kv_row_bytes(F, p.head_dim), v_bytes = kv_row_bytes(F, p.head_dim_v);
    auto scores_at = [&](int64_t h) { return scores + h * kAttnChunk; };
    for_head_tiles<F>(
        p.group, [&](int64_t h) { scores_tile<F, 4>(p, q + h * q_stride, q_stride, kb, k_bytes, n_keys, scores_at(h)); },
        [&](int64_t h) { scores_tile<F, 3>(p, q + h * q_stride, q_stride, kb, k_bytes, n_keys, scores_at(h)); },
        [&](int64_t h) { scores_tile<F, 2>(p, q + h * q_stride, q_stride, kb, k_bytes, n_keys, scores_at(h)); },
        [&](int64_t h) { scores_tile<F, 1>(p, q + h * q_stride, q_stride, kb, k_bytes, n_keys, scores_at(h)); });
    for (int64_t h = 0; h < p.group; ++h) {
        float* s = scores_at(h);
        if (p.softcap > 0.0f)
            for (int64_t j = 0; j < n_keys; ++j)
                s[j] = p.softcap * std::tanh(s[j] / p.softcap);
        float mx = s[0];
        for (int64_t j = 1; j < n_keys; ++j)
            mx = s[j] > mx ? s[j] : mx;
        const __m256 vmx = _mm256_set1_ps(mx);
        __m256 sum = _mm256_setzero_ps();
        int64_t j = 0;
        for (; j + 8 <= n_keys; j += 8) {
            const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx));
            _mm256_storeu_ps(s + j, e);
            sum = _mm256_add_ps(sum, e);
        }
        if (j < n_keys) { // the tail through a padded copy: same exp, unused lanes masked out of the sum
            alignas(32) float tail[8];
            for (int t = 0; t < 8; ++t)
                tail[t] = j + t < n_keys ? s[j + t] - mx : -1e30f;
            const __m256 e = exp_ps(_mm256_load_ps(tail));
            _mm256_store_ps(tail, e);
            for (int t = 0; j + t < n_keys; ++t)
                s[j + t] = tail[t];
            const __m256 keep = _mm256_cmp_ps(_mm256_set1_ps(float(n_keys - j)),
                                              _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _CMP_GT_OQ);
            sum = _mm256_add_ps(sum, _mm256_and_ps(e, keep));
        }
        m[h] = mx;
        l[h] = hsum(sum);
    }
    for_head_tiles<F>(
        p.group, [&](int64_t h) { values_tile<F, 4>(p, scores_at(h), vb, v_bytes, n_keys, acc + h * p.head_dim_v); },
        [&](int64_t h) { values_tile<F, 3>(p, scores_at(h), vb, v_bytes, n_keys, acc + h * p.head_dim_v); },
        [&](int64_t h) { values_tile<F, 2>(p, scores_at(h), vb, v_bytes, n_keys, acc + h * p.head_dim_v); },
        [&](int64_t h) { values_tile<F, 1>(p, scores_at(h), vb, v_bytes, n_keys, acc + h * p.head_dim_v); });
}

void chunk_avx2_any(const AttnParams& p, const float* q, int64_t q_stride, const void* k, const void* v,
                    int64_t n_keys, float* scores, float* m, float* l, float* acc) {
    switch (p.format) {
    case KvType::f32: return chunk_avx2<KvType::f32>(p, q, q_stride, k, v, n_keys, scores, m, l, acc);
    case KvType::f16: return chunk_avx2<KvType::f16>(p, q, q_stride, k, v, n_keys, scores, m, l, acc);
    case KvType::bf16: return chunk_avx2<KvType::bf16>(p, q, q_stride, k, v, n_keys, scores, m, l, acc);
    case KvType::q8_0: return chunk_avx2<KvType::q8_0>(p, q, q_stride, k, v, n_keys, scores, m, l, acc);
    case KvType::f8_e4m3: return chunk_avx2<KvType::f8_e4m3>(p, q, q_stride, k, v, n_keys, scores, m, l, acc);
    }
}

} // namespace

void fill_attention_avx2(CpuKernels& k) { k.attn_chunk = chunk_avx2_any; }

} // namespace tern
#endif
