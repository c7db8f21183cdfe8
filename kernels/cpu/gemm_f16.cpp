// 16-bit GEMM: the scalar twins of the tile and the widening, and the loop nest (gemm_f16.h); the kernels come
// from the set's table (dispatch.h).
#include "kernels/cpu/gemm_f16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>


#include "base/stealing_split.h"
#include "base/thread_pool.h"
#include "quant/half.h"

namespace tern {

namespace {

inline float widen(GgmlType t, uint16_t h) { return t == GgmlType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

// Below ~256K multiply-adds (e.g. one 512x512 matvec) a fork/join costs more than it saves.
constexpr int64_t kMinParallelWork = 256 * 1024;
// f32 activation bytes per column chunk. Each weight block is converted once per chunk, so wide chunks pay:
// the tile reads 4 bytes of activations per two multiply-adds, which even L3 feeds, and the chunk's
// output tile (64 rows x columns of f32, 128 KiB at 512 columns) stays in L2.
constexpr size_t kChunkActBytes = 4u << 20;

} // namespace

void widen16_scalar(GgmlType t, const uint16_t* src, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = widen(t, src[i]);
}

void f16_tile_scalar(GgmlType t, int64_t n_in, const uint16_t* panels, int n_panels, const float* x, int64_t n_cols,
                     float* out) {
    for (int64_t c = 0; c < n_cols; ++c) {
        const float* xc = x + static_cast<size_t>(c / kF16ColGroup) * kF16ColGroup * static_cast<size_t>(n_in) + c % kF16ColGroup;
        for (int r = 0; r < n_panels * kF16PanelRows; ++r) {
            const uint16_t* w = panels + static_cast<size_t>(r / kF16PanelRows) * kF16PanelRows * static_cast<size_t>(n_in) +
                                r % kF16PanelRows;
            float acc = 0.0f;
            for (int64_t k = 0; k < n_in; ++k) acc = std::fma(widen(t, w[k * kF16PanelRows]), xc[k * kF16ColGroup], acc);
            out[c * kF16TileRows + r] = acc;
        }
    }
}

bool panel16_pays(GgmlType t, int64_t n_in, const CpuKernels& k) {
    return panel16_packable(t, n_in) && k.panel_tile(t) != nullptr;
}

void matmul_f16_panels(const Panel16MatrixView& w, const QuantizedActs& x, float* y, int n_threads,
                       const CpuKernels* kernels) {
    const std::string where = std::string("matmul_f16_panels(") + std::string(type_name(w.type)) + "): ";
    if (!panel16_packable(w.type, w.n_in)) throw std::invalid_argument(where + "no panel layout for these rows");
    if (!check_tiled_matmul_args(where, w.type, w.n_in, w.n_out, w.data, x)) return;

    const CpuKernels& k = kernels ? *kernels : cpu_kernels();
    const F16TileFn simd = k.panel_tile(w.type);
    // A set without a tile of its own (tests) runs the scalar twins of both.
    const Widen16Fn widen16 = simd ? k.widen16 : widen16_scalar;
    const GgmlType t = w.type;
    const int64_t n_in = w.n_in, n_out = w.n_out, n_cols = x.n_cols;
    const size_t xstride16 = x.col_stride ? x.col_stride / 2 : static_cast<size_t>(n_in);
    const auto* x16 = static_cast<const uint16_t*>(x.data);
    const auto* wbase = static_cast<const uint16_t*>(w.data);

    // The activations as f32 once per call (exact: every 16-bit value is an f32), interleaved in groups of
    // 8 columns (gemm_f16.h), so the tile broadcasts them straight from one 32-byte run per k.
    const int64_t n_groups = (n_cols + kF16ColGroup - 1) / kF16ColGroup;
    thread_local std::vector<float> xf, col;
    xf.assign(static_cast<size_t>(n_groups * kF16ColGroup * n_in), 0.0f);
    col.resize(static_cast<size_t>(n_in));
    for (int64_t c = 0; c < n_cols; ++c) {
        const uint16_t* src = x16 + static_cast<size_t>(c) * xstride16;
        widen16(t, src, col.data(), n_in);
        float* dst = xf.data() + static_cast<size_t>(c / kF16ColGroup) * kF16ColGroup * static_cast<size_t>(n_in) + c % kF16ColGroup;
        for (int64_t k = 0; k < n_in; ++k) dst[k * kF16ColGroup] = col[static_cast<size_t>(k)];
    }

    const int64_t n_tiles = (n_out + kF16TileRows - 1) / kF16TileRows;
    const int64_t chunk_cols = std::max<int64_t>(
        kF16ColGroup, static_cast<int64_t>(kChunkActBytes / (static_cast<size_t>(n_in) * 4)) / kF16ColGroup * kF16ColGroup);
    int nt = std::max(1, n_threads);
    if (n_in * n_out * n_cols < kMinParallelWork) nt = 1;
    nt = static_cast<int>(std::min<int64_t>(nt, n_tiles));
    const float* xdata = xf.data();
    const size_t panel_words = static_cast<size_t>(kF16PanelRows) * static_cast<size_t>(n_in);

    for (int64_t c0 = 0; c0 < n_cols; c0 += chunk_cols) {
        const int64_t nc = std::min(n_cols, c0 + chunk_cols) - c0;
        // Each thread streams one contiguous slice of the tiles and steals from the others' backs when it runs dry
        // (stealing_split.h); tiles are 64 KiB and more, so every claim is one tile. Which thread computes a tile
        // never changes its results (one tile call per output).
        StealingSplit split(n_tiles, nt);
        parallel_slots(nt, [&](int thread) {
            thread_local std::vector<float> tile;
            tile.resize(static_cast<size_t>(nc * kF16TileRows));
            int64_t g0 = 0, g1 = 0;
            while (split.next(thread, &g0, &g1))
                for (int64_t g = g0; g < g1; ++g) {
                    const int64_t r0 = g * kF16TileRows;
                    const int64_t rows = std::min<int64_t>(kF16TileRows, n_out - r0);
                    const int np = static_cast<int>((rows + kF16PanelRows - 1) / kF16PanelRows);
                    const uint16_t* panels = wbase + static_cast<size_t>(r0 / kF16PanelRows) * panel_words;
                    const float* xc = xdata + static_cast<size_t>(c0 * n_in);   // c0 is a multiple of 8
                    if (simd)
                        simd(t, n_in, panels, np, xc, nc, tile.data());
                    else
                        f16_tile_scalar(t, n_in, panels, np, xc, nc, tile.data());
                    for (int64_t j = 0; j < nc; ++j)
                        std::memcpy(y + (c0 + j) * n_out + r0, tile.data() + j * kF16TileRows, static_cast<size_t>(rows) * 4);
                }
        });
    }
}

} // namespace tern
