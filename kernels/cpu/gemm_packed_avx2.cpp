// AVX2 tile kernels of the packed matmul (gemm_packed.h; compiled with -mavx2 -mfma -mf16c,
// kernels/CMakeLists.txt). A 16-row group is two 256-bit halves: i32 lane r of half h is row 8h + r, so
// nothing is ever summed across lanes, as in the AVX-512 tiles. Without VNNI, vpmaddubsw multiplies 4 code
// bytes by 4 broadcast activation bytes into two i16 pair sums per row; several such products add in i16 as
// long as the sum provably fits (the bound is given at each place), and one vpmaddwd widens them to i32,
// by ones or directly by the rows' sub-block scales. Every column runs the same instruction sequence and the
// integer sums are exact, so the results equal the scalar twin's bit for bit (the contract of gemm_packed.h).
#include "kernels/cpu/gemm_packed.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/stream_prefetch.h"
#include "quant/blocks.h"

namespace tern {
namespace {

inline __m256i bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

inline __m256i load256(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

// 8 f16 at p as f32 (a half's scales).
inline __m256 f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

inline __m256i mul_u8_i8(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }

// An empty asm that claims to change v: gcc then keeps the running sum in one register, updated in program
// order. Without it gcc reassociated a tile's integer sums into trees over all of a block's products, which
// needs far more than the 16 ymm registers and spilled (tile_half: ~100 stack accesses per block).
[[gnu::always_inline]] inline void keep_sum_in_register(__m256i& v) { asm("" : "+x"(v)); }

// pshufb indices that spread the 8 scale bytes of rows 8h .. 8h + 7 (of a 16-byte row vector broadcast to both
// 128-bit lanes) into one i16 pair per row's i32 lane: lane 0 takes rows 8h .. 8h + 3, lane 1 rows 8h + 4 ..
// 8h + 7. kSigned puts the byte in the high byte of each i16 (an arithmetic shift then sign-extends it), else
// in the low one; index 0x80 zeroes the other byte. A table, so that the index vector is one load whatever h.
struct ScaleSpread {
    alignas(32) int8_t idx[2][2][32];   // [kSigned][h]
    constexpr ScaleSpread() : idx{} {
        for (int sgn = 0; sgn < 2; ++sgn)
            for (int h = 0; h < 2; ++h)
                for (int i = 0; i < 32; ++i) {
                    const int row = 8 * h + 4 * (i / 16) + (i % 16) / 4;
                    const bool data_byte = sgn ? i % 2 == 1 : i % 2 == 0;
                    idx[sgn][h][i] = static_cast<int8_t>(data_byte ? row : -128);
                }
    }
};
constexpr ScaleSpread kScaleSpread;

// The 8 scale bytes of half h of a 16-byte row vector at p, each as the i16 pair (s, s) of its row's i32 lane:
// vpmaddwd by this multiplies both pair sums of row r by s_r and adds them. kSigned: the bytes are int8.
template <bool kSigned>
inline __m256i scale_pairs(const uint8_t* p, int h) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(kScaleSpread.idx[kSigned][h]));
    if constexpr (kSigned) return _mm256_srai_epi16(_mm256_shuffle_epi8(v, idx), 8);
    return _mm256_shuffle_epi8(v, idx);
}

// Q4_0x16 / Q8_0x16 (quant/repack.h). Q4_0: the 8 nibble products of a block (each pair sum
// |.| <= 2 * 15 * 127 = 3810) add in i16 (<= 30480) before one vpmaddwd, and the block's activation word
// -8 * sum(a) completes sum((u - 8) a). Q8_0: the stored code + 128 is flipped back to the signed code, whose
// sign moves onto the activation (vpsignb) so that vpmaddubsw takes |code| <= 128 as its unsigned side; pair
// sums reach 2 * 128 * 127 = 32512, so each chunk widens on its own, and sum(code * a) already is the block's
// integer (the activation word's -128 * sum(a) is for the unsigned codes; the same integer either way).
// Per block and column, both ways below: acc = fma(d_w * d_x, float(isum), acc).

// Decode's integer sum of one block for one 8-row half (Q4_0: before its activation word; Q8_0: complete);
// `codes` is the block's code chunks offset to the half (chunk s at codes + 64 s), qs the activation block's codes.
template <bool kQ8>
[[gnu::always_inline]] inline __m256i block_isum(const uint8_t* codes, const int8_t* qs) {
    const __m256i ones = _mm256_set1_epi16(1);
    if constexpr (kQ8) {
        const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
        __m256i isum = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {
            const __m256i w = _mm256_xor_si256(load256(codes + 64 * s), flip);
            const __m256i pairs = mul_u8_i8(_mm256_abs_epi8(w), _mm256_sign_epi8(bcast4(qs + 4 * s), w));
            isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, ones));
        }
        return isum;
    } else {
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        __m256i s16 = _mm256_setzero_si256();
        for (int s = 0; s < 4; ++s) {
            const __m256i v = load256(codes + 64 * s);
            const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            s16 = _mm256_add_epi16(s16, _mm256_add_epi16(mul_u8_i8(lo, bcast4(qs + 4 * s)), mul_u8_i8(hi, bcast4(qs + 16 + 4 * s))));
        }
        return _mm256_madd_epi16(s16, ones);
    }
}

// Decode (1 column), one block of one group: both halves, so the group streams through once, in order. kPrefetch:
// request the block's lines ahead (stream_prefetch.h) here; decode_groups requests its own.
template <bool kQ8, bool kPrefetch>
[[gnu::always_inline]] inline void block_1col(const uint8_t* p, const BlockQ8_0& xb, const int32_t* corr, __m256& acc0,
                                              __m256& acc1) {
    constexpr size_t kBlock = 32 + 64 * (kQ8 ? 8 : 4);
    if constexpr (kPrefetch) prefetch_range_ahead(p, kBlock);
    float d;
    std::memcpy(&d, corr + 1, 4);
    const __m256 dx = _mm256_set1_ps(d);
    __m256i i0 = block_isum<kQ8>(p + 32, xb.qs), i1 = block_isum<kQ8>(p + 64, xb.qs);
    if constexpr (!kQ8) {
        const __m256i off = _mm256_set1_epi32(corr[0]);
        i0 = _mm256_add_epi32(i0, off);
        i1 = _mm256_add_epi32(i1, off);
    }
    acc0 = _mm256_fmadd_ps(_mm256_mul_ps(f16x8(p), dx), _mm256_cvtepi32_ps(i0), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_mul_ps(f16x8(p + 16), dx), _mm256_cvtepi32_ps(i1), acc1);
}

template <bool kQ8>
void tile_1col(int64_t nb, const uint8_t* group, const uint8_t* x, const int32_t* corr, float* out) {
    constexpr size_t kBlock = 32 + 64 * (kQ8 ? 8 : 4);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(x);
    for (int64_t b = 0; b < nb; ++b)
        block_1col<kQ8, true>(group + static_cast<size_t>(b) * kBlock, xb[b], corr + 2 * b, acc0, acc1);
    _mm256_storeu_ps(out, acc0);
    _mm256_storeu_ps(out + 8, acc1);
}

// Prefill (C >= 2 columns): one 8-row half at a time over all blocks, so that the C accumulators, C block sums
// and the code temporaries fit the 16 registers (both halves at once spilled). The group is in L1 or L2 by then.
// Each chunk of codes is unpacked once for all C columns.
template <int C, bool kQ8>
void tile_half(int h, int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
               size_t corr_stride, float* out) {
    constexpr size_t kBlock = 32 + 64 * (kQ8 ? 8 : 4);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    const int8_t* xq[C];
    for (int c = 0; c < C; ++c) xq[c] = reinterpret_cast<const BlockQ8_0*>(x + static_cast<size_t>(c) * x_stride)->qs;
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
        const uint8_t* codes = p + 32 + 32 * h;
        const size_t xo = static_cast<size_t>(b) * sizeof(BlockQ8_0);
        __m256i isum[C];
        if constexpr (kQ8) {
            const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
            for (int c = 0; c < C; ++c) isum[c] = _mm256_setzero_si256();
            #pragma GCC unroll 8
            for (int s = 0; s < 8; ++s) {
                const __m256i w = _mm256_xor_si256(load256(codes + 64 * s), flip);
                const __m256i aw = _mm256_abs_epi8(w);
                #pragma GCC unroll 4
                for (int c = 0; c < C; ++c) {
                    const __m256i pairs = mul_u8_i8(aw, _mm256_sign_epi8(bcast4(xq[c] + xo + 4 * s), w));
                    isum[c] = _mm256_add_epi32(isum[c], _mm256_madd_epi16(pairs, ones));
                    keep_sum_in_register(isum[c]);
                }
            }
        } else {
            const __m256i m4 = _mm256_set1_epi8(0x0F);
            __m256i s16[C];
            for (int c = 0; c < C; ++c) s16[c] = _mm256_setzero_si256();
            #pragma GCC unroll 4
            for (int s = 0; s < 4; ++s) {
                const __m256i v = load256(codes + 64 * s);
                const __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                #pragma GCC unroll 4
                for (int c = 0; c < C; ++c) {
                    s16[c] = _mm256_add_epi16(s16[c], mul_u8_i8(lo, bcast4(xq[c] + xo + 4 * s)));
                    s16[c] = _mm256_add_epi16(s16[c], mul_u8_i8(hi, bcast4(xq[c] + xo + 16 + 4 * s)));
                    keep_sum_in_register(s16[c]);
                }
            }
            for (int c = 0; c < C; ++c)
                isum[c] = _mm256_add_epi32(_mm256_madd_epi16(s16[c], ones),
                                           _mm256_set1_epi32(corr[static_cast<size_t>(c) * corr_stride + 2 * static_cast<size_t>(b)]));
        }
        const __m256 dw = f16x8(p + 16 * h);
        for (int c = 0; c < C; ++c) {
            float d;
            std::memcpy(&d, corr + static_cast<size_t>(c) * corr_stride + 2 * static_cast<size_t>(b) + 1, 4);
            acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(d)), _mm256_cvtepi32_ps(isum[c]), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(out + 16 * c + 8 * h, acc[c]);
}

template <int C, bool kQ8>
void tile(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr, size_t corr_stride,
          float* out) {
    if constexpr (C == 1) {
        tile_1col<kQ8>(nb, group, x, corr, out);
    } else {
        tile_half<C, kQ8>(0, nb, group, x, x_stride, corr, corr_stride, out);
        tile_half<C, kQ8>(1, nb, group, x, x_stride, corr, corr_stride, out);
    }
}

// Q4_Kx16 super-blocks (layout in quant/repack.h, arithmetic in gemm_packed.cpp's scalar twin). Per 64-element
// pair of sub-blocks: 8 chunks give the low-nibble codes of sub-block 2 pair and the high-nibble codes of
// 2 pair + 1; each sub-block's 8 products add in i16 (<= 8 * 2 * 15 * 127 = 30480) and one vpmaddwd by the
// rows' scales (<= 63) adds it to the integer total. The mins meet the activation sub-block sums (two i16 per
// word) in 4 vpmaddwd. Two steps, shared by the tile (q4_k_rows) and the decode kernel (decode_q4_k):
//
// One pair of sub-blocks of a Q4_K super-block p, halves h0 .. h0 + H - 1, against C columns' activation blocks xb:
// isum[c][h] += the pair's integer sum (before the mins). prefetch: request each code chunk ahead as it is loaded.
template <int C, int H>
[[gnu::always_inline]] inline void q4_k_pair_isum(const uint8_t* p, int pair, int h0, bool prefetch, const BlockQ8_K* const xb[C],
                                                  __m256i isum[C][H]) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256i lo[C][H], hi[C][H];
    for (int c = 0; c < C; ++c)
        for (int h = 0; h < H; ++h) lo[c][h] = hi[c][h] = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
        const uint8_t* chunk = p + 320 + 64 * (8 * pair + s);
        if (prefetch) prefetch_ahead(chunk);
        for (int h = 0; h < H; ++h) {
            const __m256i v = load256(chunk + 32 * (h0 + h));
            const __m256i wl = _mm256_and_si256(v, m4), wh = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            for (int c = 0; c < C; ++c) {
                lo[c][h] = _mm256_add_epi16(lo[c][h], mul_u8_i8(wl, bcast4(xb[c]->qs + 64 * pair + 4 * s)));
                hi[c][h] = _mm256_add_epi16(hi[c][h], mul_u8_i8(wh, bcast4(xb[c]->qs + 64 * pair + 32 + 4 * s)));
                keep_sum_in_register(lo[c][h]);
                keep_sum_in_register(hi[c][h]);
            }
        }
    }
    for (int h = 0; h < H; ++h) {
        const __m256i sl = scale_pairs<false>(p + 64 + 16 * (2 * pair), h0 + h);
        const __m256i sh = scale_pairs<false>(p + 64 + 16 * (2 * pair + 1), h0 + h);
        for (int c = 0; c < C; ++c)
            isum[c][h] = _mm256_add_epi32(isum[c][h], _mm256_add_epi32(_mm256_madd_epi16(lo[c][h], sl), _mm256_madd_epi16(hi[c][h], sh)));
    }
}

// The end of a Q4_K super-block p (block b): the mins against the activation sub-block sums (corr, column c's at
// c * corr_stride), then acc[c][h] gets the super-block's two fused multiply-adds.
template <int C, int H>
[[gnu::always_inline]] inline void q4_k_block_end(const uint8_t* p, int64_t b, int h0, const BlockQ8_K* const xb[C],
                                                  const int32_t* corr, size_t corr_stride, __m256i isum[C][H], __m256 acc[C][H]) {
    for (int h = 0; h < H; ++h) {
        __m256i msum[C];
        for (int c = 0; c < C; ++c) msum[c] = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k) {
            // Row r's mins of sub-blocks 2k and 2k + 1 as two i16, against the word of their activation sums.
            const __m256i mk =
                _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 192 + 32 * k + 16 * (h0 + h))));
            for (int c = 0; c < C; ++c)
                msum[c] = _mm256_add_epi32(msum[c], _mm256_madd_epi16(mk, _mm256_set1_epi32(corr[static_cast<size_t>(c) * corr_stride +
                                                                                              static_cast<size_t>(b) * 4 + k])));
        }
        const __m256 dw = f16x8(p + 16 * (h0 + h)), dm = f16x8(p + 32 + 16 * (h0 + h));
        for (int c = 0; c < C; ++c) {
            const __m256 dx = _mm256_set1_ps(xb[c]->d);
            acc[c][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum[c][h]), acc[c][h]);
            acc[c][h] = _mm256_fnmadd_ps(_mm256_mul_ps(dm, dx), _mm256_cvtepi32_ps(msum[c]), acc[c][h]);
        }
    }
}

// q4_k_rows covers H halves (8 rows each) from half h0 against C columns. One column takes both halves in one
// pass, each 64-byte chunk whole and in order; more take one half and two columns at a time, which keeps their sums
// in the 16 registers (4 columns of both halves spilled on every chunk).
template <int C, int H>
void q4_k_rows(int h0, int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
               size_t corr_stride, float* out) {
    constexpr size_t kBlock = 64 + 128 + 128 + 2048;
    __m256 acc[C][H];
    for (int c = 0; c < C; ++c)
        for (int h = 0; h < H; ++h) acc[c][h] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
        if (h0 == 0) prefetch_range_ahead(p, 320);   // scales and mins; the code chunks as they are loaded
        const BlockQ8_K* xb[C];
        for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(x + static_cast<size_t>(c) * x_stride) + b;
        __m256i isum[C][H];
        for (int c = 0; c < C; ++c)
            for (int h = 0; h < H; ++h) isum[c][h] = _mm256_setzero_si256();
        for (int pair = 0; pair < 4; ++pair) q4_k_pair_isum<C, H>(p, pair, h0, h0 == 0, xb, isum);
        q4_k_block_end<C, H>(p, b, h0, xb, corr, corr_stride, isum, acc);
    }
    for (int c = 0; c < C; ++c)
        for (int h = 0; h < H; ++h) _mm256_storeu_ps(out + 16 * c + 8 * (h0 + h), acc[c][h]);
}

// A tile of C >= 2 columns as single halves against column pairs (and a last single column): rows2 and rows1 are
// a format's kernels of one half against 2 and 1 columns. Each output's arithmetic is the same in any split.
template <int C, typename RowsFn2, typename RowsFn1>
[[gnu::always_inline]] inline void by_half_and_pair(RowsFn2 rows2, RowsFn1 rows1, int64_t nb, const uint8_t* group, const uint8_t* x,
                                                    size_t x_stride, const int32_t* corr, size_t corr_stride, float* out) {
    for (int h = 0; h < 2; ++h) {
        int c = 0;
        for (; c + 2 <= C; c += 2)
            rows2(h, nb, group, x + static_cast<size_t>(c) * x_stride, x_stride, corr + static_cast<size_t>(c) * corr_stride,
                  corr_stride, out + 16 * c);
        if (c < C)
            rows1(h, nb, group, x + static_cast<size_t>(c) * x_stride, x_stride, corr + static_cast<size_t>(c) * corr_stride,
                  corr_stride, out + 16 * c);
    }
}

template <int C>
void tile_q4_k(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
               size_t corr_stride, float* out) {
    if constexpr (C == 1)
        q4_k_rows<1, 2>(0, nb, group, x, x_stride, corr, corr_stride, out);
    else
        by_half_and_pair<C>(q4_k_rows<2, 1>, q4_k_rows<1, 1>, nb, group, x, x_stride, corr, corr_stride, out);
}

// Q6_Kx16 super-blocks (layout in quant/repack.h, arithmetic in gemm_packed.cpp's scalar twin). Per 64-element
// pair pc: 8 chunks of low nibbles and 4 of top bits give the codes (0..63) of sub-blocks 4pc .. 4pc + 3. A
// sub-block's 4 products fit i16 two at a time (2 * 2 * 63 * 127 = 32004), so it widens in two vpmaddwd by the
// rows' signed scales. The codes' offset, -32 * sum_j sc_j * (activation sum of sub-block j), is collected
// from the activation block's own sub-block sums (bsums, |.| <= 2032; two sub-blocks a vpmaddwd) and applied
// once.
template <int C>
void tile_q6_k(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* /*corr*/,
               size_t /*corr_stride*/, float* out) {
    constexpr size_t kBlock = 32 + 256 + 2048 + 1024;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    __m256 acc[C][2];
    for (int c = 0; c < C; ++c) acc[c][0] = acc[c][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
        prefetch_range_ahead(p, 288);   // scales; the code chunks in the passes below
        const BlockQ8_K* xb[C];
        for (int c = 0; c < C; ++c) xb[c] = reinterpret_cast<const BlockQ8_K*>(x + static_cast<size_t>(c) * x_stride) + b;
        for (int h = 0; h < 2; ++h) {
            __m256i isum[C], bterm[C];
            for (int c = 0; c < C; ++c) isum[c] = bterm[c] = _mm256_setzero_si256();
            for (int pc = 0; pc < 4; ++pc) {
                #pragma GCC unroll 8
                for (int half = 0; half < 2; ++half) {   // chunks s = 4 half .. 4 half + 3: sub-blocks jl, jh
                    const int jl = 4 * pc + half, jh = 4 * pc + 2 + half;
                    __m256i lo[C][2], hi[C][2];
                    for (int c = 0; c < C; ++c) lo[c][0] = lo[c][1] = hi[c][0] = hi[c][1] = _mm256_setzero_si256();
                    #pragma GCC unroll 8
                    for (int s4 = 0; s4 < 4; ++s4) {
                        const int s = 4 * half + s4;
                        const uint8_t* lchunk = p + 288 + 64 * (8 * pc + s);
                        const uint8_t* hchunk = p + 288 + 2048 + 64 * (4 * pc + s4);
                        // The low-nibble lines are requested in the first pass and the top-bit lines in the
                        // second, so that requests go out all through the block: with all of them in the first
                        // pass, decode from memory reached 57-65% of the read probe at 1 thread, 86-101% this way.
                        if (h == 0) prefetch_ahead(lchunk);
                        else if (half == 0) prefetch_ahead(hchunk);
                        const __m256i v = load256(lchunk + 32 * h), t = load256(hchunk + 32 * h);
                        // The code's top bit pair (bits 2 half for the low nibble, 4 + 2 half for the high one) moved
                        // to bits 4-5 (the 16-bit shifts carry bits across bytes; the mask drops them).
                        const __m256i tl = _mm256_and_si256(_mm256_slli_epi16(t, 4 - 2 * half), m30);
                        const __m256i th = _mm256_and_si256(half ? _mm256_srli_epi16(t, 2) : t, m30);
                        const __m256i wl = _mm256_or_si256(_mm256_and_si256(v, m4), tl);
                        const __m256i wh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), th);
                        for (int c = 0; c < C; ++c) {
                            const __m256i pl = mul_u8_i8(wl, bcast4(xb[c]->qs + 64 * pc + 4 * s));
                            const __m256i ph = mul_u8_i8(wh, bcast4(xb[c]->qs + 64 * pc + 32 + 4 * s));
                            const int k = s4 / 2;
                            lo[c][k] = _mm256_add_epi16(lo[c][k], pl);
                            hi[c][k] = _mm256_add_epi16(hi[c][k], ph);
                        }
                    }
                    const __m256i sl = scale_pairs<true>(p + 32 + 16 * jl, h), sh = scale_pairs<true>(p + 32 + 16 * jh, h);
                    for (int c = 0; c < C; ++c) {
                        const __m256i pl = _mm256_add_epi32(_mm256_madd_epi16(lo[c][0], sl), _mm256_madd_epi16(lo[c][1], sl));
                        const __m256i ph = _mm256_add_epi32(_mm256_madd_epi16(hi[c][0], sh), _mm256_madd_epi16(hi[c][1], sh));
                        isum[c] = _mm256_add_epi32(isum[c], _mm256_add_epi32(pl, ph));
                    }
                }
            }
            for (int i = 0; i < 8; ++i) {
                // Row r's scales of sub-blocks 2i and 2i + 1 as two i16, against the pair of activation sub-block sums.
                const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 32 + 16 * (2 * i) + 8 * h));
                const __m128i b2 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 32 + 16 * (2 * i + 1) + 8 * h));
                const __m256i sp = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b2));
                for (int c = 0; c < C; ++c) {
                    int32_t pair;
                    std::memcpy(&pair, xb[c]->bsums + 2 * i, 4);
                    bterm[c] = _mm256_add_epi32(bterm[c], _mm256_madd_epi16(sp, _mm256_set1_epi32(pair)));
                }
            }
            const __m256 dw = f16x8(p + 16 * h);
            for (int c = 0; c < C; ++c) {
                const __m256i total = _mm256_sub_epi32(isum[c], _mm256_slli_epi32(bterm[c], 5));
                acc[c][h] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xb[c]->d)), _mm256_cvtepi32_ps(total), acc[c][h]);
            }
        }
    }
    for (int c = 0; c < C; ++c) {
        _mm256_storeu_ps(out + 16 * c, acc[c][0]);
        _mm256_storeu_ps(out + 16 * c + 8, acc[c][1]);
    }
}

// Decode of n_groups (1..kDecodeGroups) consecutive groups side by side (PackedDecodeFn): one block of each group
// in turn, so that a thread keeps several prefetched memory streams going (in a scratch read loop, one such stream
// per thread read at 75-92% of the plain loop). Each output's chain is tile_1col's, block by block. A block's lines
// are requested into L2 only, kFarPrefetchBytes ahead, and near a group's end in the same group of the next unit of
// kDecodeGroups (prefetch_streams_far: what the thread reads next); the tile's second request into L1
// (kNearPrefetchBytes ahead) costs more than it saves here. Measured, alternated per pass in one process:
//   2048x8192 from memory (30 pairs, median ratio): 4 groups side by side, the tile's prefetches, against the
//   tile (4 runs): Q4_0 1.10-1.20x at 1 thread and 1.00-1.07x at 2; Q8_0 1.07-1.20x and 1.00-1.05x; L2-only
//   prefetches against the tile's (2 runs): Q4_0 1.02-1.04x and 1.03-1.07x, Q8_0 1.28-1.38x and 1.18-1.24x;
//   llama-1b's layer matrices, per token (15-20 pairs): prefetching into the next unit 1.17-1.20x / 1.11x (Q4_0),
//   1.06x / 1.04x (Q8_0); then for Q4_0 one block per turn instead of two 1.06-1.07x / 1.06-1.10x (four: 0.92-0.95x;
//   8 groups of one block: 1.10x / 0.97x).
// Q6_K reads slower side by side and keeps its tile (a super-block per turn: 0.42x / 0.47x; a 64-element pair, as
// decode_q4_k: 0.45-0.54x at 1 and 2 threads, with or without software prefetches, though as fast as the tile
// from L2: its two code regions per group make 8 streams; with a layout that puts each pair's low nibbles and top
// bits in one run: 0.98x / 0.78x, and the tile on that layout 0.95x / 0.97x); Q4_K: decode_q4_k.
template <bool kQ8>
void decode_groups(int64_t nb, const uint8_t* first, size_t group_bytes, int n_groups, const uint8_t* x,
                   const int32_t* corr, float* out) {
    constexpr size_t kBlock = 32 + 64 * (kQ8 ? 8 : 4);
    const auto* xb = reinterpret_cast<const BlockQ8_0*>(x);
    for (int g = 0; g < n_groups; ++g) {
        _mm256_storeu_ps(out + 16 * g, _mm256_setzero_ps());
        _mm256_storeu_ps(out + 16 * g + 8, _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; ++b) {
        for (int g = 0; g < n_groups; ++g) {
            const uint8_t* group = first + static_cast<size_t>(g) * group_bytes;
            prefetch_streams_far(group, group_bytes, n_groups, static_cast<size_t>(b) * kBlock, kBlock);
            __m256 acc0 = _mm256_loadu_ps(out + 16 * g), acc1 = _mm256_loadu_ps(out + 16 * g + 8);
            block_1col<kQ8, false>(group + static_cast<size_t>(b) * kBlock, xb[b], corr + 2 * b, acc0, acc1);
            _mm256_storeu_ps(out + 16 * g, acc0);
            _mm256_storeu_ps(out + 16 * g + 8, acc1);
        }
    }
}

// Q4_K decode side by side: n_groups (1..kDecodeGroups) groups, one 64-element pair of sub-blocks (512 bytes of
// codes; the first also takes the super-block's 320 bytes of scales and mins) of each group in turn, the groups'
// integer sums kept in memory between turns, the lines requested as in decode_groups. The arithmetic is
// q4_k_rows<1, 2>'s own (q4_k_pair_isum, q4_k_block_end), so the bits are the tile's. Against the tile, llama-1b's
// Q4_K layer matrices alternated per token in one process: 1.14-1.17x at 1 thread (3 runs of 10 pairs); at 2 threads
// a median of 1.05x over 14 runs of 12-16 pairs taken at different times (0.93x to 1.10x: it loses while the host's
// memory is slow; an earlier harness that always ran the tile first in each pair read 0.90-0.95x), and tern bench
// Q4_K_M -t 2 decode, 6 alternated pairs: +4% median, 5 wins. Tried: a whole super-block per turn 0.80x / 0.77x,
// half a pair 0.83x / 0.84x, 2 groups 0.97x / 0.94x, 3 groups 1.03x / 1.01x (1 / 2 threads).
void decode_q4_k(int64_t nb, const uint8_t* first, size_t group_bytes, int n_groups, const uint8_t* x, const int32_t* corr,
                 float* out) {
    constexpr size_t kBlock = 64 + 128 + 128 + 2048, kHead = 320, kPairBytes = 512;
    __m256i isum[kDecodeGroups][1][2];
    for (int g = 0; g < n_groups; ++g) {
        _mm256_storeu_ps(out + 16 * g, _mm256_setzero_ps());
        _mm256_storeu_ps(out + 16 * g + 8, _mm256_setzero_ps());
    }
    for (int64_t b = 0; b < nb; ++b) {
        const BlockQ8_K* const xb[1] = {reinterpret_cast<const BlockQ8_K*>(x) + b};
        for (int pair = 0; pair < 4; ++pair)
            for (int g = 0; g < n_groups; ++g) {
                const uint8_t* group = first + static_cast<size_t>(g) * group_bytes;
                const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
                const size_t begin = pair == 0 ? 0 : kHead + kPairBytes * pair, end = kHead + kPairBytes * (pair + 1);
                prefetch_streams_far(group, group_bytes, n_groups, static_cast<size_t>(b) * kBlock + begin, end - begin);
                if (pair == 0) isum[g][0][0] = isum[g][0][1] = _mm256_setzero_si256();
                q4_k_pair_isum<1, 2>(p, pair, 0, false, xb, isum[g]);
                if (pair < 3) continue;
                __m256 acc[1][2] = {{_mm256_loadu_ps(out + 16 * g), _mm256_loadu_ps(out + 16 * g + 8)}};
                q4_k_block_end<1, 2>(p, b, 0, xb, corr, 0, isum[g], acc);
                _mm256_storeu_ps(out + 16 * g, acc[0][0]);
                _mm256_storeu_ps(out + 16 * g + 8, acc[0][1]);
            }
    }
}

// The tiles as templates over the column count, for packed_tile_any_cols (gemm_packed.h).
template <int C> struct Q4_0Tile { static constexpr auto run = tile<C, false>; };
template <int C> struct Q8_0Tile { static constexpr auto run = tile<C, true>; };
template <int C> struct Q4_KTile { static constexpr auto run = tile_q4_k<C>; };
template <int C> struct Q6_KTile { static constexpr auto run = tile_q6_k<C>; };

} // namespace

// Q6_K has no decode kernel: its decode takes the tile one group at a time.
void fill_packed_avx2(CpuKernels& k) {
    k.packed_q4_0 = {packed_tile_any_cols<Q4_0Tile>, decode_groups<false>};
    k.packed_q8_0 = {packed_tile_any_cols<Q8_0Tile>, decode_groups<true>};
    k.packed_q4_k = {packed_tile_any_cols<Q4_KTile>, decode_q4_k};
    k.packed_q6_k = {packed_tile_any_cols<Q6_KTile>, nullptr};
}

} // namespace tern
#endif
