// AVX-512 VNNI tile kernels of the packed matmul (gemm_packed.h; compiled with AVX-512 F/BW/VL/VNNI flags,
// kernels/CMakeLists.txt). Lane r of every 512-bit register is row r of the 16-row group, so a block of
// one column costs 8 vpdpbusd (4 activation bytes broadcast to all lanes each), one int->float conversion
// and one multiply-add, and nothing is ever summed across lanes.
#include "kernels/cpu/gemm_packed.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"   // gcc 12 avx512fintrin.h false positives (see dot_avx512.cpp)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/stream_prefetch.h"
#include "quant/blocks.h"

namespace tern {
namespace {

// Decode reads each group once from DRAM, and with this much arithmetic per cache line the hardware
// prefetchers alone keep too few lines in flight. So every line is requested twice ahead of its load, into L2
// and into L1, 8 KiB and 2 KiB ahead (stream_prefetch.h). Measured on the 2-core Xeon,
// interleaved runs: `tern bench` llama-1b Q4_0 decode at 2 threads 23.0-26.0 tok/s with one L1 prefetch 4 KiB
// ahead, 28.2-29.0 with this pair; in a decode-shaped microbenchmark (16 layers of llama-1b matvecs + the Q6_K
// output) Q4_0 19.6-22.4 -> 23.5-23.9 GB/s, Q4_K 20.9 -> 23.1, 1 thread 10.6-11.2 -> 10.7-12.4. Of the
// distances tried (L2 4-16 KiB, L1 0.5-2 KiB) this pair was the best. Prefill's extra columns reuse a group
// from L1, so there it costs a few stray lines past the group's end. (prefetch_ahead, prefetch_range_ahead:
// stream_prefetch.h.)

inline __m512i bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// C columns against one group; kQ8: Q8_0x16 (8 chunks of codes + 128), else Q4_0x16 (4 chunks of nibbles).
// Every column runs the same instruction sequence (the arithmetic contract of gemm_packed.h): two integer
// chains (exact, so their split does not matter) and one fused multiply-add per block. Q4_0's high nibbles
// stay in place (16 x the code: one mask instead of shift and mask) and their chain is divided by 16 at the
// end, exactly, since every term is a multiple of 16.
template <int C, bool kQ8>
void tile(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr, size_t corr_stride,
          float* out) {
    constexpr int kChunks = kQ8 ? 8 : 4;
    constexpr size_t kBlock = 32 + 64 * kChunks;
    const __m512i m4 = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
        prefetch_range_ahead(p, kBlock);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        // Q8_0: w[k] multiplies activation bytes 4k .. 4k+3 of the block. Q4_0: w[k] (k < 4) the low
        // nibbles, elements 4k .. 4k+3; w[k + 4] the high ones in place, elements 16+4k .. 16+4k+3.
        __m512i w[8];
        for (int s = 0; s < kChunks; ++s) w[s] = _mm512_loadu_si512(p + 32 + 64 * s);
        if constexpr (!kQ8) {
            for (int s = 0; s < 4; ++s) {
                w[s + 4] = _mm512_and_si512(w[s], mf0);
                w[s] = _mm512_and_si512(w[s], m4);
            }
        }
        for (int c = 0; c < C; ++c) {
            const auto* xb = reinterpret_cast<const BlockQ8_0*>(x + static_cast<size_t>(c) * x_stride) + b;
            const int32_t* terms = corr + static_cast<size_t>(c) * corr_stride + 2 * static_cast<size_t>(b);
            __m512i i0 = _mm512_set1_epi32(terms[0]);
            __m512i i1 = _mm512_setzero_si512();
            if constexpr (kQ8) {
                for (int k = 0; k < 8; k += 2) {
                    i0 = _mm512_dpbusd_epi32(i0, w[k], bcast4(xb->qs + 4 * k));
                    i1 = _mm512_dpbusd_epi32(i1, w[k + 1], bcast4(xb->qs + 4 * k + 4));
                }
            } else {
                for (int k = 0; k < 4; ++k) {
                    i0 = _mm512_dpbusd_epi32(i0, w[k], bcast4(xb->qs + 4 * k));
                    i1 = _mm512_dpbusd_epi32(i1, w[k + 4], bcast4(xb->qs + 16 + 4 * k));
                }
                i1 = _mm512_srai_epi32(i1, 4);
            }
            float dx;
            std::memcpy(&dx, terms + 1, 4);
            const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(dx));
            acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}

// Q4_K super-blocks (layout in quant/repack.h, arithmetic in gemm_packed.cpp's scalar twin). Per 64-element
// pair of sub-blocks: 8 chunks, each giving the low-nibble codes of sub-block 2c and the high-nibble codes of
// 2c + 1; the sub-block sums are scaled per lane (vpmulld) into one integer total, and the mins meet the
// activation sub-block sums in 4 vpdpwssd.
template <int C>
void tile_q4_k(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
               size_t corr_stride, float* out) {
    constexpr size_t kBlock = 64 + 128 + 128 + 2048;
    const __m512i m4 = _mm512_set1_epi8(0x0F), mf0 = _mm512_set1_epi8(static_cast<char>(0xF0));
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
        prefetch_range_ahead(p, 320);   // scales and mins; the code chunks as they are loaded
        const BlockQ8_K* xb[C];
        for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(x + static_cast<size_t>(c) * x_stride) + b;
        __m512i isum[C], msum[C];
        for (int c = 0; c < C; ++c) isum[c] = msum[c] = _mm512_setzero_si512();
        for (int pair = 0; pair < 4; ++pair) {
            __m512i lo[C], hi[C];
            for (int c = 0; c < C; ++c) lo[c] = hi[c] = _mm512_setzero_si512();
            for (int s = 0; s < 8; ++s) {
                prefetch_ahead(p + 320 + 64 * (8 * pair + s));
                const __m512i v = _mm512_loadu_si512(p + 320 + 64 * (8 * pair + s));
                const __m512i wl = _mm512_and_si512(v, m4);
                const __m512i wh = _mm512_and_si512(v, mf0);   // 16 x the codes: hi is divided by 16 below
                for (int c = 0; c < C; ++c) {
                    lo[c] = _mm512_dpbusd_epi32(lo[c], wl, bcast4(xb[c]->qs + 64 * pair + 4 * s));
                    hi[c] = _mm512_dpbusd_epi32(hi[c], wh, bcast4(xb[c]->qs + 64 * pair + 32 + 4 * s));
                }
            }
            for (int c = 0; c < C; ++c) hi[c] = _mm512_srai_epi32(hi[c], 4);   // exact: every term is a multiple of 16
            const __m512i sl = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 32 * pair)));
            const __m512i sh = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 32 * pair + 16)));
            for (int c = 0; c < C; ++c)
                isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(lo[c], sl), _mm512_mullo_epi32(hi[c], sh)));
        }
        for (int k = 0; k < 4; ++k) {
            const __m512i mk = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 192 + 32 * k)));
            for (int c = 0; c < C; ++c)
                msum[c] = _mm512_dpwssd_epi32(msum[c], mk,
                                              _mm512_set1_epi32(corr[static_cast<size_t>(c) * corr_stride + static_cast<size_t>(b) * 4 + k]));
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
        for (int c = 0; c < C; ++c) {
            const __m512 dx = _mm512_set1_ps(xb[c]->d);
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[c]), acc[c]);
            acc[c] = _mm512_fnmadd_ps(_mm512_mul_ps(dm, dx), _mm512_cvtepi32_ps(msum[c]), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}

// vpternlogd truth table for (a, b, c) -> c ? a : b, bit by bit: bits of a where the mask c is set, else b's.
constexpr int kSelectByMask = 0xE4;

// Q6_K super-blocks (layout in quant/repack.h, arithmetic in gemm_packed.cpp's scalar twin). Per 64-element
// pair c: 8 chunks of low nibbles and 4 of top bits give the codes of sub-blocks 4c .. 4c + 3. Each
// sub-block's integer sum starts from its activation word (-32 * the activation sub-block sum, the codes'
// offset), collects its codes' products and is multiplied by the lane's scale (vpmulld) into one total.
template <int C>
void tile_q6_k(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
               size_t corr_stride, float* out) {
    constexpr size_t kBlock = 32 + 256 + 2048 + 1024;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
        prefetch_range_ahead(p, 288);   // scales; the code chunks as they are loaded
        const BlockQ8_K* xb[C];
        const int32_t* terms[C];
        for (int c = 0; c < C; ++c) {
            xb[c] = reinterpret_cast<const BlockQ8_K*>(x + static_cast<size_t>(c) * x_stride) + b;
            terms[c] = corr + static_cast<size_t>(c) * corr_stride + static_cast<size_t>(b) * 16;
        }
        __m512i isum[C];
        for (int c = 0; c < C; ++c) isum[c] = _mm512_setzero_si512();
        for (int pc = 0; pc < 4; ++pc) {
            for (int half = 0; half < 2; ++half) {   // s = 4 half .. 4 half + 3: sub-blocks 4pc + half, 4pc + 2 + half
                const int jl = 4 * pc + half, jh = 4 * pc + 2 + half;
                __m512i lo[C], hi[C];
                for (int c = 0; c < C; ++c) {
                    lo[c] = _mm512_set1_epi32(terms[c][jl]);
                    hi[c] = _mm512_set1_epi32(terms[c][jh]);
                }
                for (int s4 = 0; s4 < 4; ++s4) {
                    const int s = 4 * half + s4;
                    prefetch_ahead(p + 288 + 64 * (8 * pc + s));
                    if (half == 0) prefetch_ahead(p + 288 + 2048 + 64 * (4 * pc + s4));
                    const __m512i v = _mm512_loadu_si512(p + 288 + 64 * (8 * pc + s));
                    const __m512i h = _mm512_loadu_si512(p + 288 + 2048 + 64 * (4 * pc + s4));
                    // The code's top bits moved to bits 4-5 of their byte (bit pair 2 half for wl, 4 + 2 half
                    // for wh; the 16-bit shifts carry bits across bytes, the mask drops them), then the low
                    // nibble selected in beside them: 3 operations a register where shift, mask, shift, or took 5.
                    const __m512i tl = _mm512_and_si512(_mm512_slli_epi16(h, 4 - 2 * half), m30);
                    const __m512i th = _mm512_and_si512(half ? _mm512_srli_epi16(h, 2) : h, m30);
                    const __m512i wl = _mm512_ternarylogic_epi32(v, tl, m4, kSelectByMask);
                    const __m512i wh = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), th, m4, kSelectByMask);
                    for (int c = 0; c < C; ++c) {
                        lo[c] = _mm512_dpbusd_epi32(lo[c], wl, bcast4(xb[c]->qs + 64 * pc + 4 * s));
                        hi[c] = _mm512_dpbusd_epi32(hi[c], wh, bcast4(xb[c]->qs + 64 * pc + 32 + 4 * s));
                    }
                }
                const __m512i sl = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * jl)));
                const __m512i sh = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * jh)));
                for (int c = 0; c < C; ++c)
                    isum[c] = _mm512_add_epi32(isum[c], _mm512_add_epi32(_mm512_mullo_epi32(lo[c], sl), _mm512_mullo_epi32(hi[c], sh)));
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        for (int c = 0; c < C; ++c)
            acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xb[c]->d)), _mm512_cvtepi32_ps(isum[c]), acc[c]);
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}

// The tiles as templates over the column count, for packed_tile_any_cols (gemm_packed.h).
template <int C> struct Q4_0Tile { static constexpr auto run = tile<C, false>; };
template <int C> struct Q8_0Tile { static constexpr auto run = tile<C, true>; };
template <int C> struct Q4_KTile { static constexpr auto run = tile_q4_k<C>; };
template <int C> struct Q6_KTile { static constexpr auto run = tile_q6_k<C>; };

} // namespace

// Tiles only: decode takes the tile one group at a time.
void fill_packed_avx512(CpuKernels& k) {
    k.packed_q4_0 = {packed_tile_any_cols<Q4_0Tile>, nullptr};
    k.packed_q8_0 = {packed_tile_any_cols<Q8_0Tile>, nullptr};
    k.packed_q4_k = {packed_tile_any_cols<Q4_KTile>, nullptr};
    k.packed_q6_k = {packed_tile_any_cols<Q6_KTile>, nullptr};
}

} // namespace tern
#endif
