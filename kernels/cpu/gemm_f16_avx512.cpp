// AVX-512 tiles of the 16-bit GEMM (gemm_f16.h; compiled with AVX-512 F/BW/VL flags, kernels/CMakeLists.txt).
// Lane r of every 512-bit register is row r of a 16-row panel, so one multiply-add advances 16 outputs of
// one column by one k, with the column's activation broadcast; nothing is ever summed across lanes, and each
// accumulator is one output's single k-ordered chain (the contract of gemm_f16.h) whatever the tile shape.
#include "kernels/cpu/gemm_f16.h"

#if defined(__x86_64__)
#pragma GCC diagnostic ignored "-Wuninitialized"   // gcc 12 avx512fintrin.h false positives (see dot_avx512.cpp)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

namespace tern {
namespace {

// k values per converted block of two panels: 128 * 32 f32 = 16 KiB, which stays in L1 (48 KiB) next to
// the 8 columns' activations (4 KiB) while every column of the chunk passes over it.
constexpr int64_t kBlockK = 128;
// How far ahead (in k) the streaming path prefetches each panel: into L1 32 k ahead (1 KiB per panel) and,
// as the packed tiles do (gemm_packed_avx512.cpp), into L2 128 k ahead (4 KiB per panel), so more lines are
// in flight than the L1's fill buffers allow. Measured on the shared 2-core Xeon (decode 1 thread, CPU time,
// 2048 x 8192): ~10.5 GB/s without, ~14 GB/s with the L1 prefetch, no better with 64 or 128. The L2 one:
// `tern bench` llama-1b F16 decode at 2 threads 9.66-9.78 -> 9.75-10.23 tok/s (256 k ahead: 9.88-10.01).
constexpr int64_t kPrefetchK = 32;
constexpr int64_t kFarPrefetchK = 128;
// Columns per register tile of the converted path: 2 panels x 8 columns = 16 accumulators.
constexpr int kTileColsF16 = kF16ColGroup;

// 16 consecutive 16-bit values of format T as f32 (exact).
template <GgmlType T>
inline __m512 load16(const uint16_t* p) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (T == GgmlType::F16)
        return _mm512_cvtph_ps(v);
    else
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// Few columns (decode, short drafts): NP panels x C columns, the weights converted as they stream in.
template <GgmlType T, int NP, int C>
void stream_tile(int64_t n_in, const uint16_t* panels, const float* x, float* out) {
    const size_t pw = static_cast<size_t>(kF16PanelRows) * static_cast<size_t>(n_in);
    __m512 acc[NP][C];
    for (int p = 0; p < NP; ++p)
        for (int c = 0; c < C; ++c) acc[p][c] = _mm512_setzero_ps();
    // The loop below prefetches each panel from kFarPrefetchK on; its first lines are requested here, at once,
    // so the panels' starts do not each wait on DRAM in turn.
    for (int p = 0; p < NP; ++p)
        for (int64_t k = 0; k < std::min(kFarPrefetchK, n_in); k += 2) {
            const char* line = reinterpret_cast<const char*>(panels + p * pw + static_cast<size_t>(k) * kF16PanelRows);
            if (k < kPrefetchK)   // the hint must be a constant even where the branch is not folded (-O0)
                _mm_prefetch(line, _MM_HINT_T0);
            else
                _mm_prefetch(line, _MM_HINT_T1);
        }
    for (int64_t k = 0; k < n_in; ++k) {
        if (k % 2 == 0)   // one 64-byte line of each panel per 2 k
            for (int p = 0; p < NP; ++p) {
                _mm_prefetch(reinterpret_cast<const char*>(panels + p * pw + static_cast<size_t>(k + kFarPrefetchK) * kF16PanelRows),
                             _MM_HINT_T1);
                _mm_prefetch(reinterpret_cast<const char*>(panels + p * pw + static_cast<size_t>(k + kPrefetchK) * kF16PanelRows),
                             _MM_HINT_T0);
            }
        __m512 w[NP];
        for (int p = 0; p < NP; ++p) w[p] = load16<T>(panels + p * pw + static_cast<size_t>(k) * kF16PanelRows);
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_set1_ps(x[kF16ColGroup * k + c]);
            for (int p = 0; p < NP; ++p) acc[p][c] = _mm512_fmadd_ps(w[p], xv, acc[p][c]);
        }
    }
    for (int c = 0; c < C; ++c)
        for (int p = 0; p < NP; ++p) _mm512_storeu_ps(out + c * kF16TileRows + p * kF16PanelRows, acc[p][c]);
}

template <GgmlType T, int NP>
void stream_cols(int64_t n_in, const uint16_t* panels, const float* x, int64_t n_cols, float* out) {
    switch (n_cols) {
    case 1: return stream_tile<T, NP, 1>(n_in, panels, x, out);
    case 2: return stream_tile<T, NP, 2>(n_in, panels, x, out);
    default: return stream_tile<T, NP, 3>(n_in, panels, x, out);
    }
}

// Many columns: kb k values of a converted two-panel block (wbuf[32 * k + lane]) against C columns of one
// activation group (x[8 * k + c]), continuing the chains in out (first: starting them from +0).
template <int C>
void block_tile(int64_t kb, const float* wbuf, const float* x, bool first, float* out) {
    __m512 a0[C], a1[C];
    for (int c = 0; c < C; ++c) {
        a0[c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + c * kF16TileRows);
        a1[c] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(out + c * kF16TileRows + kF16PanelRows);
    }
    for (int64_t k = 0; k < kb; ++k) {
        const __m512 w0 = _mm512_load_ps(wbuf + 32 * k);
        const __m512 w1 = _mm512_load_ps(wbuf + 32 * k + 16);
        for (int c = 0; c < C; ++c) {
            const __m512 xv = _mm512_set1_ps(x[kF16ColGroup * k + c]);
            a0[c] = _mm512_fmadd_ps(w0, xv, a0[c]);
            a1[c] = _mm512_fmadd_ps(w1, xv, a1[c]);
        }
    }
    for (int c = 0; c < C; ++c) {
        _mm512_storeu_ps(out + c * kF16TileRows, a0[c]);
        _mm512_storeu_ps(out + c * kF16TileRows + kF16PanelRows, a1[c]);
    }
}

using BlockTileFn = void (*)(int64_t, const float*, const float*, bool, float*);
constexpr BlockTileFn kBlockTiles[kTileColsF16 + 1] = {nullptr,        block_tile<1>, block_tile<2>, block_tile<3>, block_tile<4>,
                                                       block_tile<5>, block_tile<6>, block_tile<7>, block_tile<8>};

template <GgmlType T>
void tile(GgmlType, int64_t n_in, const uint16_t* panels, int n_panels, const float* x, int64_t n_cols, float* out) {
    if (n_cols <= 3) {
        switch (n_panels) {
        case 1: return stream_cols<T, 1>(n_in, panels, x, n_cols, out);
        case 2: return stream_cols<T, 2>(n_in, panels, x, n_cols, out);
        case 3: return stream_cols<T, 3>(n_in, panels, x, n_cols, out);
        default: return stream_cols<T, 4>(n_in, panels, x, n_cols, out);
        }
    }
    alignas(64) float wbuf[kBlockK * 32];
    const size_t pw = static_cast<size_t>(kF16PanelRows) * static_cast<size_t>(n_in);
    for (int q = 0; 2 * q < n_panels; ++q) {
        const uint16_t* p0 = panels + static_cast<size_t>(2 * q) * pw;
        const bool has_p1 = 2 * q + 1 < n_panels;   // else the second half is zeros (rows never stored)
        for (int64_t k0 = 0; k0 < n_in; k0 += kBlockK) {
            const int64_t kb = std::min<int64_t>(kBlockK, n_in - k0);
            for (int64_t k = 0; k < kb; ++k) {
                _mm512_store_ps(wbuf + 32 * k, load16<T>(p0 + static_cast<size_t>(k0 + k) * kF16PanelRows));
                _mm512_store_ps(wbuf + 32 * k + 16,
                                has_p1 ? load16<T>(p0 + pw + static_cast<size_t>(k0 + k) * kF16PanelRows) : _mm512_setzero_ps());
            }
            for (int64_t c0 = 0; c0 < n_cols; c0 += kTileColsF16) {
                const int C = static_cast<int>(std::min<int64_t>(kTileColsF16, n_cols - c0));
                kBlockTiles[C](kb, wbuf, x + static_cast<size_t>(c0 * n_in + kF16ColGroup * k0), k0 == 0,
                               out + c0 * kF16TileRows + 32 * q);
            }
        }
    }
}

void widen16_avx512(GgmlType t, const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    if (t == GgmlType::F16)
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16<GgmlType::F16>(src + i));
    else
        for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load16<GgmlType::BF16>(src + i));
    if (i < n) {
        const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
        const __m256i v = _mm256_maskz_loadu_epi16(m, src + i);
        const __m512 f = t == GgmlType::F16 ? _mm512_cvtph_ps(v)
                                            : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
        _mm512_mask_storeu_ps(dst + i, m, f);
    }
}

} // namespace

void fill_panels_avx512(CpuKernels& k) {
    k.panel_f16 = tile<GgmlType::F16>;
    k.panel_bf16 = tile<GgmlType::BF16>;
    k.widen16 = widen16_avx512;
}

} // namespace tern
#endif
