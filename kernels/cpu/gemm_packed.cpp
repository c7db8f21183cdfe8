// Packed matmul: the scalar twin of the tile kernel, the kernel choice and the loop nest (gemm_packed.h).
#include "kernels/cpu/gemm_packed.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <omp.h>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/repack.h"

namespace tern {

// Defined in gemm_packed_avx512.cpp (x86-64 builds): the AVX-512 VNNI tile for t, or nullptr.
PackedTileFn packed_tile_avx512(GgmlType t);

namespace {

// Per-format constants of the packed layouts (quant/repack.h).
struct PackedLayout {
    int chunks;       // 64-byte code chunks per block
    int offset;       // u - offset is the signed code
    size_t block;     // bytes per packed block (16 rows)
};

PackedLayout layout_of(GgmlType t) {
    return t == GgmlType::Q4_0 ? PackedLayout{4, 8, 32 + 4 * 64} : PackedLayout{8, 128, 32 + 8 * 64};
}

// The unsigned code of element i (0..31) of lane r in one packed block's codes.
int packed_code(GgmlType t, const uint8_t* codes, int r, int i) {
    if (t == GgmlType::Q4_0) {
        const int j = i % 16;   // byte j of the row's qs: element j low, element j + 16 high
        const uint8_t v = codes[(j / 4) * 64 + 4 * r + j % 4];
        return i < 16 ? (v & 0x0F) : (v >> 4);
    }
    return codes[(i / 4) * 64 + 4 * r + i % 4];
}

// Per (column, block): -offset * (sum of the block's activation codes), the integer correction that
// turns sum(u * a) into sum((u - offset) * a).
void act_corrections(const QuantizedActs& x, int64_t nb, size_t xstride, int offset, std::vector<int32_t>& corr) {
    corr.resize(static_cast<size_t>(x.n_cols * nb));
    const auto* base = static_cast<const uint8_t*>(x.data);
    for (int64_t c = 0; c < x.n_cols; ++c) {
        const auto* xb = reinterpret_cast<const BlockQ8_0*>(base + static_cast<size_t>(c) * xstride);
        for (int64_t b = 0; b < nb; ++b) {
            int32_t s = 0;
            for (int i = 0; i < QK8_0; ++i) s += xb[b].qs[i];
            corr[static_cast<size_t>(c * nb + b)] = -offset * s;
        }
    }
}

// Below ~256K multiply-adds (e.g. one 512x512 matvec) a fork/join costs more than it saves.
constexpr int64_t kMinParallelWork = 256 * 1024;
// Activation bytes per column chunk: the chunk stays in L2 while every group of the matrix passes it.
constexpr size_t kChunkActBytes = 1u << 20;

} // namespace

void packed_tile_scalar(GgmlType t, int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride,
                        const int32_t* corr, size_t corr_stride, int n_cols, float* out) {
    const PackedLayout L = layout_of(t);
    for (int c = 0; c < n_cols; ++c) {
        const auto* xb = reinterpret_cast<const BlockQ8_0*>(x + static_cast<size_t>(c) * x_stride);
        for (int r = 0; r < kPackRows; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = group + static_cast<size_t>(b) * L.block;
                uint16_t dw;
                std::memcpy(&dw, blk + 2 * r, 2);
                int32_t isum = corr[static_cast<size_t>(c) * corr_stride + static_cast<size_t>(b)];
                for (int i = 0; i < QK8_0; ++i) isum += packed_code(t, blk + 32, r, i) * xb[b].qs[i];
                const float d = f16_to_f32(dw) * f16_to_f32(xb[b].d);
                acc = std::fma(d, static_cast<float>(isum), acc);
            }
            out[c * kPackRows + r] = acc;
        }
    }
}

PackedTileFn packed_tile_for(GgmlType t, const CpuKernels& k) {
#if defined(__x86_64__)
    if (k.isa == CpuIsa::avx512) return packed_tile_avx512(t);
#else
    (void)t;
    (void)k;
#endif
    return nullptr;
}

bool packing_pays(GgmlType t, int64_t n_in, const CpuKernels& k) {
    return packable(t, n_in) && packed_tile_for(t, k) != nullptr;
}

void matmul_packed(const PackedMatrixView& w, const QuantizedActs& x, float* y, int n_threads, const CpuKernels* kernels) {
    const std::string where = std::string("matmul_packed(") + std::string(type_name(w.type)) + "): ";
    if (!packable(w.type, w.n_in)) throw std::invalid_argument(where + "no packed layout for these rows");
    if (x.format != ActFormat::q8_0 || x.n_in != w.n_in)
        throw std::invalid_argument(where + "activations are " + act_format_name(x.format) + " with " +
                                    std::to_string(x.n_in) + " elements per column, expected q8_0 with " +
                                    std::to_string(w.n_in));
    if (w.n_out < 0 || x.n_cols < 0 || (!w.data && w.n_out > 0) || (!x.data && x.n_cols > 0))
        throw std::invalid_argument(where + "null data or negative shape");
    if (w.n_out == 0 || x.n_cols == 0) return;

    const CpuKernels& k = kernels ? *kernels : cpu_kernels();
    const PackedTileFn simd = packed_tile_for(w.type, k);
    const GgmlType t = w.type;
    const int64_t nb = w.n_in / QK8_0, n_out = w.n_out, n_cols = x.n_cols;
    const size_t xstride = x.col_stride ? x.col_stride : act_row_bytes(x.format, x.n_in);
    const size_t gbytes = packed_group_bytes(t, w.n_in);
    const auto* wbase = static_cast<const uint8_t*>(w.data);
    const auto* xbase = static_cast<const uint8_t*>(x.data);

    thread_local std::vector<int32_t> corr;
    act_corrections(x, nb, xstride, layout_of(t).offset, corr);

    const int64_t n_groups = (n_out + kPackRows - 1) / kPackRows;
    const int64_t chunk_cols =
        std::max<int64_t>(kTileCols, static_cast<int64_t>(kChunkActBytes / xstride) / kTileCols * kTileCols);
    int nt = std::max(1, n_threads);
    if (w.n_in * n_out * n_cols < kMinParallelWork) nt = 1;
    nt = static_cast<int>(std::min<int64_t>(nt, n_groups));
    const int32_t* corr_data = corr.data();

    for (int64_t c0 = 0; c0 < n_cols; c0 += chunk_cols) {
        const int64_t c1 = std::min(n_cols, c0 + chunk_cols);
#pragma omp parallel for schedule(static) num_threads(nt)
        for (int64_t g = 0; g < n_groups; ++g) {
            const uint8_t* grp = wbase + static_cast<size_t>(g) * gbytes;
            const int64_t rows = std::min<int64_t>(kPackRows, n_out - g * kPackRows);
            float tile[kTileCols * kPackRows];
            for (int64_t c = c0; c < c1; c += kTileCols) {
                const int nc = static_cast<int>(std::min<int64_t>(kTileCols, c1 - c));
                const uint8_t* xc = xbase + static_cast<size_t>(c) * xstride;
                const int32_t* cc = corr_data + static_cast<size_t>(c * nb);
                if (simd)
                    simd(nb, grp, xc, xstride, cc, static_cast<size_t>(nb), nc, tile);
                else
                    packed_tile_scalar(t, nb, grp, xc, xstride, cc, static_cast<size_t>(nb), nc, tile);
                for (int j = 0; j < nc; ++j)
                    std::memcpy(y + (c + j) * n_out + g * kPackRows, tile + j * kPackRows, static_cast<size_t>(rows) * 4);
            }
        }
    }
}

#if !defined(__x86_64__)
PackedTileFn packed_tile_avx512(GgmlType) { return nullptr; }
#endif

} // namespace tern
