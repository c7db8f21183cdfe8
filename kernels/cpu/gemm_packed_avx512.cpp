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

#include "quant/blocks.h"

namespace tern {
namespace {

inline __m512i bcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// C columns against one group; kQ8: Q8_0x16 (8 chunks of codes + 128), else Q4_0x16 (4 chunks of nibbles).
// Every column runs the same instruction sequence (the arithmetic contract of gemm_packed.h): two integer
// chains (exact, so their split does not matter) and one fused multiply-add per block.
template <int C, bool kQ8>
void tile(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr, size_t corr_stride,
          float* out) {
    constexpr int kChunks = kQ8 ? 8 : 4;
    constexpr size_t kBlock = 32 + 64 * kChunks;
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* p = group + static_cast<size_t>(b) * kBlock;
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
        // w[k] multiplies activation bytes 4k .. 4k+3 of the block.
        __m512i w[8];
        if constexpr (kQ8) {
            for (int s = 0; s < 8; ++s) w[s] = _mm512_loadu_si512(p + 32 + 64 * s);
        } else {
            for (int s = 0; s < 4; ++s) {
                const __m512i v = _mm512_loadu_si512(p + 32 + 64 * s);
                w[s] = _mm512_and_si512(v, m4);                             // elements 4s .. 4s+3
                w[s + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);   // elements 16+4s .. 16+4s+3
            }
        }
        for (int c = 0; c < C; ++c) {
            const auto* xb = reinterpret_cast<const BlockQ8_0*>(x + static_cast<size_t>(c) * x_stride) + b;
            __m512i i0 = _mm512_set1_epi32(corr[static_cast<size_t>(c) * corr_stride + static_cast<size_t>(b)]);
            __m512i i1 = _mm512_setzero_si512();
            for (int k = 0; k < 8; k += 2) {
                i0 = _mm512_dpbusd_epi32(i0, w[k], bcast4(xb->qs + 4 * k));
                i1 = _mm512_dpbusd_epi32(i1, w[k + 1], bcast4(xb->qs + 4 * k + 4));
            }
            const __m512 d = _mm512_mul_ps(dw, _mm512_set1_ps(_cvtsh_ss(xb->d)));
            acc[c] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(i0, i1)), acc[c]);
        }
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, acc[c]);
}

template <bool kQ8>
void tile_any(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
              size_t corr_stride, int n_cols, float* out) {
    switch (n_cols) {
    case 1: tile<1, kQ8>(nb, group, x, x_stride, corr, corr_stride, out); break;
    case 2: tile<2, kQ8>(nb, group, x, x_stride, corr, corr_stride, out); break;
    case 3: tile<3, kQ8>(nb, group, x, x_stride, corr, corr_stride, out); break;
    default: tile<4, kQ8>(nb, group, x, x_stride, corr, corr_stride, out); break;
    }
}

static_assert(kTileCols == 4, "tile_any handles 1..4 columns");

} // namespace

PackedTileFn packed_tile_avx512(GgmlType t) {
    switch (t) {
    case GgmlType::Q4_0: return tile_any<false>;
    case GgmlType::Q8_0: return tile_any<true>;
    default: return nullptr;
    }
}

} // namespace tern
#endif
