// AVX2 + FMA + F16C tiles of the 16-bit GEMM (gemm_f16.h; compiled with -mavx2 -mfma -mf16c,
// kernels/CMakeLists.txt), for x86-64 CPUs without AVX-512. A 16-row panel is two 8-lane registers (rows
// 0..7, 8..15); each accumulator lane is one output's single k-ordered chain, as in the AVX-512 file, so
// both are bit-identical to the scalar twin. 16 registers allow 1 panel x 6 columns (12 accumulators).
#include "kernels/cpu/gemm_f16.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

namespace tern {
namespace {

constexpr int64_t kBlockK = 256;    // converted k per panel block: 256 * 16 f32 = 16 KiB, in L1
constexpr int kTileCols = 6;        // columns per register tile of the converted path
constexpr int64_t kPrefetchK = 32;  // as in gemm_f16_avx512.cpp: 1 KiB ahead per panel

// 8 consecutive 16-bit values of format T as f32 (exact).
template <GgmlType T>
inline __m256 load8(const uint16_t* p) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (T == GgmlType::F16)
        return _mm256_cvtph_ps(v);
    else
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}

// Few columns: P panels x C columns, the weights converted as they stream in. Each output is still one k-ordered
// chain (the same bits whatever P); P panels at once give 2 P C independent chains, enough to cover the FMA latency
// (one panel against one column is 2 chains: a quarter of the FMA rate, barely above the memory's).
template <GgmlType T, int C, int P>
void stream_panels(int64_t n_in, const uint16_t* panels, size_t panel_words, const float* x, float* out) {
    __m256 lo[P][C], hi[P][C];
    for (int p = 0; p < P; ++p)
        for (int c = 0; c < C; ++c) lo[p][c] = hi[p][c] = _mm256_setzero_ps();
    for (int64_t k = 0; k < n_in; ++k) {
        __m256 xv[C];
        for (int c = 0; c < C; ++c) xv[c] = _mm256_broadcast_ss(x + kF16ColGroup * k + c);
        for (int p = 0; p < P; ++p) {
            const uint16_t* w = panels + p * panel_words + static_cast<size_t>(k) * kF16PanelRows;
            if (k % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchK * kF16PanelRows), _MM_HINT_T0);
            const __m256 w0 = load8<T>(w), w1 = load8<T>(w + 8);
            for (int c = 0; c < C; ++c) {
                lo[p][c] = _mm256_fmadd_ps(w0, xv[c], lo[p][c]);
                hi[p][c] = _mm256_fmadd_ps(w1, xv[c], hi[p][c]);
            }
        }
    }
    for (int p = 0; p < P; ++p)
        for (int c = 0; c < C; ++c) {
            _mm256_storeu_ps(out + c * kF16TileRows + p * kF16PanelRows, lo[p][c]);
            _mm256_storeu_ps(out + c * kF16TileRows + p * kF16PanelRows + 8, hi[p][c]);
        }
}

// Decode's 1 or 2 columns over n_panels panels: 4 (1 column) or 2 (2 columns) panels at a time, then one by one.
template <GgmlType T, int C>
void stream_tile(int64_t n_in, const uint16_t* panels, int n_panels, const float* x, float* out) {
    constexpr int kPanelsAtOnce = C == 1 ? 4 : 2;
    const size_t pw = static_cast<size_t>(kF16PanelRows) * static_cast<size_t>(n_in);
    int p = 0;
    for (; p + kPanelsAtOnce <= n_panels; p += kPanelsAtOnce)
        stream_panels<T, C, kPanelsAtOnce>(n_in, panels + p * pw, pw, x, out + p * kF16PanelRows);
    for (; p < n_panels; ++p) stream_panels<T, C, 1>(n_in, panels + p * pw, pw, x, out + p * kF16PanelRows);
}

// Many columns: kb k values of a converted panel block (wbuf[16 * k + lane]) against C columns, column c's value
// for k at xc[c][kF16ColGroup * k] (its activation group's interleave; a tile may span two groups), continuing
// the chains in out (first: starting them from +0). 16 rows x 6 columns: 12 independent FMA chains, more than
// the FMA latency x pipes of current cores (4 x 2), with 2 weight registers and the broadcast in the other 2.
// The 12 accumulators are named variables: with arrays, gcc 12 kept a stack copy of every accumulator and
// stored all of them each k (prefill ran at ~40% of the FMA peak).
template <int C>
void block_tile(int64_t kb, const float* wbuf, const float* const* xc, bool first, float* out) {
    static_assert(C >= 1 && C <= 6, "1..6 columns");
    __m256 l0 = _mm256_setzero_ps(), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0, l4 = l0, h4 = l0,
           l5 = l0, h5 = l0;
    auto load_pair = [&](int c, __m256& lo, __m256& hi) {
        lo = _mm256_loadu_ps(out + c * kF16TileRows);
        hi = _mm256_loadu_ps(out + c * kF16TileRows + 8);
    };
    if (!first) {
        load_pair(0, l0, h0);
        if constexpr (C > 1) load_pair(1, l1, h1);
        if constexpr (C > 2) load_pair(2, l2, h2);
        if constexpr (C > 3) load_pair(3, l3, h3);
        if constexpr (C > 4) load_pair(4, l4, h4);
        if constexpr (C > 5) load_pair(5, l5, h5);
    }
    const float* x0 = xc[0];
    const float* x1 = C > 1 ? xc[1] : x0;
    const float* x2 = C > 2 ? xc[2] : x0;
    const float* x3 = C > 3 ? xc[3] : x0;
    const float* x4 = C > 4 ? xc[4] : x0;
    const float* x5 = C > 5 ? xc[5] : x0;
    for (int64_t k = 0; k < kb; ++k) {
        const __m256 w0 = _mm256_load_ps(wbuf + 16 * k), w1 = _mm256_load_ps(wbuf + 16 * k + 8);
        const int64_t o = kF16ColGroup * k;
        auto step = [&](const float* xcol, __m256& lo, __m256& hi) {
            const __m256 xv = _mm256_broadcast_ss(xcol + o);
            lo = _mm256_fmadd_ps(w0, xv, lo);
            hi = _mm256_fmadd_ps(w1, xv, hi);
        };
        step(x0, l0, h0);
        if constexpr (C > 1) step(x1, l1, h1);
        if constexpr (C > 2) step(x2, l2, h2);
        if constexpr (C > 3) step(x3, l3, h3);
        if constexpr (C > 4) step(x4, l4, h4);
        if constexpr (C > 5) step(x5, l5, h5);
    }
    auto store_pair = [&](int c, __m256 lo, __m256 hi) {
        _mm256_storeu_ps(out + c * kF16TileRows, lo);
        _mm256_storeu_ps(out + c * kF16TileRows + 8, hi);
    };
    store_pair(0, l0, h0);
    if constexpr (C > 1) store_pair(1, l1, h1);
    if constexpr (C > 2) store_pair(2, l2, h2);
    if constexpr (C > 3) store_pair(3, l3, h3);
    if constexpr (C > 4) store_pair(4, l4, h4);
    if constexpr (C > 5) store_pair(5, l5, h5);
}

using BlockTileFn = void (*)(int64_t, const float*, const float* const*, bool, float*);
constexpr BlockTileFn kBlockTiles[kTileCols + 1] = {nullptr,       block_tile<1>, block_tile<2>, block_tile<3>,
                                                    block_tile<4>, block_tile<5>, block_tile<6>};

template <GgmlType T>
void tile(GgmlType, int64_t n_in, const uint16_t* panels, int n_panels, const float* x, int64_t n_cols, float* out) {
    const size_t pw = static_cast<size_t>(kF16PanelRows) * static_cast<size_t>(n_in);
    if (n_cols <= 2) {
        if (n_cols == 1)
            stream_tile<T, 1>(n_in, panels, n_panels, x, out);
        else
            stream_tile<T, 2>(n_in, panels, n_panels, x, out);
        return;
    }
    alignas(32) float wbuf[kBlockK * kF16PanelRows];
    for (int p = 0; p < n_panels; ++p) {
        const uint16_t* panel = panels + p * pw;
        for (int64_t k0 = 0; k0 < n_in; k0 += kBlockK) {
            const int64_t kb = std::min<int64_t>(kBlockK, n_in - k0);
            for (int64_t k = 0; k < kb; ++k) {
                const uint16_t* w = panel + static_cast<size_t>(k0 + k) * kF16PanelRows;
                _mm256_store_ps(wbuf + 16 * k, load8<T>(w));
                _mm256_store_ps(wbuf + 16 * k + 8, load8<T>(w + 8));
            }
            // Column c of the chunk sits in group c / 8 at lane c % 8; a tile may span two groups.
            for (int64_t c0 = 0; c0 < n_cols; c0 += kTileCols) {
                const int C = static_cast<int>(std::min<int64_t>(kTileCols, n_cols - c0));
                const float* xc[kTileCols];
                for (int j = 0; j < C; ++j) {
                    const int64_t c = c0 + j;
                    xc[j] = x + static_cast<size_t>((c / kF16ColGroup) * kF16ColGroup * n_in + kF16ColGroup * k0 + c % kF16ColGroup);
                }
                kBlockTiles[C](kb, wbuf, xc, k0 == 0, out + c0 * kF16TileRows + p * kF16PanelRows);
            }
        }
    }
}

void widen16_avx2(GgmlType t, const uint16_t* src, float* dst, int64_t n) {
    int64_t i = 0;
    if (t == GgmlType::F16)
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8<GgmlType::F16>(src + i));
    else
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8<GgmlType::BF16>(src + i));
    for (; i < n; ++i) dst[i] = t == GgmlType::F16 ? _cvtsh_ss(src[i]) : _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(int(src[i]) << 16)));
}

} // namespace

void fill_panels_avx2(CpuKernels& k) {
    k.panel_f16 = tile<GgmlType::F16>;
    k.panel_bf16 = tile<GgmlType::BF16>;
    k.widen16 = widen16_avx2;
}

} // namespace tern
#endif
