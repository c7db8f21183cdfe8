// Packed matmul: the scalar twin of the tile kernel and the loop nest (gemm_packed.h); the kernels come from
// the set's table (dispatch.h).
#include "kernels/cpu/gemm_packed.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>


#include "base/stealing_split.h"
#include "base/thread_pool.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/repack.h"

namespace tern {

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

// Q4_0 / Q8_0, per (column, block), 2 words: -offset * (sum of the block's activation codes), the integer
// correction that turns sum(u * a) into sum((u - offset) * a), and the bits of the block's scale as an f32
// (the tile then broadcasts it from memory instead of converting the f16 in every tile: the same value).
// Q4_K, per (column, super-block), 4 words: word k holds the activation sums of sub-blocks 2k and 2k + 1
// (each bsums[2j] + bsums[2j + 1], |.| <= 2 * 16 * 127) as two i16, the multiplicands of the mins.
void act_corrections(GgmlType t, const QuantizedActs& x, int64_t nb, size_t xstride, int offset, std::vector<int32_t>& corr) {
    const auto* base = static_cast<const uint8_t*>(x.data);
    if (t == GgmlType::Q6_K) {   // 16 words: -32 * bsums[j], the offset of the codes, per sub-block
        corr.resize(static_cast<size_t>(x.n_cols * nb * 16));
        for (int64_t c = 0; c < x.n_cols; ++c) {
            const auto* xb = reinterpret_cast<const BlockQ8_K*>(base + static_cast<size_t>(c) * xstride);
            for (int64_t b = 0; b < nb; ++b)
                for (int j = 0; j < 16; ++j) corr[static_cast<size_t>((c * nb + b) * 16 + j)] = -32 * xb[b].bsums[j];
        }
        return;
    }
    if (t == GgmlType::Q4_K) {
        corr.resize(static_cast<size_t>(x.n_cols * nb * 4));
        for (int64_t c = 0; c < x.n_cols; ++c) {
            const auto* xb = reinterpret_cast<const BlockQ8_K*>(base + static_cast<size_t>(c) * xstride);
            for (int64_t b = 0; b < nb; ++b)
                for (int k = 0; k < 4; ++k) {
                    const int lo = xb[b].bsums[4 * k] + xb[b].bsums[4 * k + 1];
                    const int hi = xb[b].bsums[4 * k + 2] + xb[b].bsums[4 * k + 3];
                    corr[static_cast<size_t>((c * nb + b) * 4 + k)] =
                        static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
                                             (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
                }
        }
        return;
    }
    corr.resize(static_cast<size_t>(x.n_cols * nb * 2));
    for (int64_t c = 0; c < x.n_cols; ++c) {
        const auto* xb = reinterpret_cast<const BlockQ8_0*>(base + static_cast<size_t>(c) * xstride);
        for (int64_t b = 0; b < nb; ++b) {
            int32_t s = 0;
            for (int i = 0; i < QK8_0; ++i) s += xb[b].qs[i];
            const float d = f16_to_f32(xb[b].d);
            int32_t d_bits;
            std::memcpy(&d_bits, &d, 4);
            corr[static_cast<size_t>((c * nb + b) * 2)] = -offset * s;
            corr[static_cast<size_t>((c * nb + b) * 2 + 1)] = d_bits;
        }
    }
}

// Below ~256K multiply-adds (e.g. one 512x512 matvec) a fork/join costs more than it saves.
constexpr int64_t kMinParallelWork = 256 * 1024;
// Weight bytes (times column tiles) a thread claims at most at once from its slice (stealing_split.h): 14 groups
// of Q4_0 at n_in = 2048.
constexpr size_t kClaimBytes = 256u << 10;
// Activation bytes per column chunk: the chunk stays in L2 while every group of the matrix passes it.
constexpr size_t kChunkActBytes = 1u << 20;

} // namespace

namespace {

// Q4_K: per super-block  isum = sum_j sc_j * sum_{i in j} q_i a_i,  msum = sum_j m_j * (sum_{i in j} a_i),
// acc = fma(f32(d) * d_x, float(isum), acc),  acc = fma(-(f32(dmin) * d_x), float(msum), acc).
void packed_tile_q4_k_scalar(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
                             size_t corr_stride, int n_cols, float* out) {
    constexpr size_t kBlock = 64 + 128 + 128 + 2048;
    for (int c = 0; c < n_cols; ++c) {
        const auto* xb = reinterpret_cast<const BlockQ8_K*>(x + static_cast<size_t>(c) * x_stride);
        for (int r = 0; r < kPackRows; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = group + static_cast<size_t>(b) * kBlock;
                uint16_t dw, dm;
                std::memcpy(&dw, blk + 2 * r, 2);
                std::memcpy(&dm, blk + 32 + 2 * r, 2);
                int32_t isum = 0, msum = 0;
                for (int j = 0; j < 8; ++j) {
                    int32_t sj = 0;
                    for (int i = 0; i < 32; ++i) {
                        const int e = 32 * j + i;                   // element of the super-block
                        const int byte = 32 * (e / 64) + e % 32;    // its qs byte (Q4_K order)
                        const uint8_t v = blk[320 + (byte / 4) * 64 + 4 * r + byte % 4];
                        sj += ((e % 64) < 32 ? (v & 0x0F) : (v >> 4)) * xb[b].qs[e];
                    }
                    isum += blk[64 + 16 * j + r] * sj;
                    const uint32_t w = static_cast<uint32_t>(corr[static_cast<size_t>(c) * corr_stride + static_cast<size_t>(b) * 4 + j / 2]);
                    const int16_t bs = static_cast<int16_t>(j % 2 ? w >> 16 : w & 0xFFFF);
                    msum += blk[192 + 32 * (j / 2) + 2 * r + j % 2] * bs;
                }
                const float dx = xb[b].d;
                acc = std::fma(f16_to_f32(dw) * dx, static_cast<float>(isum), acc);
                acc = std::fma(-(f16_to_f32(dm) * dx), static_cast<float>(msum), acc);
            }
            out[c * kPackRows + r] = acc;
        }
    }
}

// Q6_K: per super-block  isum = sum_j sc_j * (sum_{i in j} q_i a_i - 32 * sum_{i in j} a_i) over the 16
// sub-blocks of 16 (q the unsigned 6-bit code), acc = fma(f32(d) * d_x, float(isum), acc).
void packed_tile_q6_k_scalar(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
                             size_t corr_stride, int n_cols, float* out) {
    constexpr size_t kBlock = 32 + 256 + 2048 + 1024;
    for (int c = 0; c < n_cols; ++c) {
        const auto* xb = reinterpret_cast<const BlockQ8_K*>(x + static_cast<size_t>(c) * x_stride);
        for (int r = 0; r < kPackRows; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = group + static_cast<size_t>(b) * kBlock;
                uint16_t dw;
                std::memcpy(&dw, blk + 2 * r, 2);
                int32_t isum = 0;
                for (int j = 0; j < 16; ++j) {
                    int32_t sj = 0;
                    for (int i = 0; i < 16; ++i) {
                        const int e = 16 * j + i;
                        const int pc = e / 64, w = e % 64, half = w / 32, s = (w % 32) / 4, t = w % 4;
                        const uint8_t lo = blk[288 + (8 * pc + s) * 64 + 4 * r + t];
                        const uint8_t hi = blk[288 + 2048 + (4 * pc + s % 4) * 64 + 4 * r + t];
                        const int q = ((lo >> (4 * half)) & 0x0F) | (((hi >> (4 * half + 2 * (s / 4))) & 3) << 4);
                        sj += q * xb[b].qs[e];
                    }
                    const int sc = static_cast<int8_t>(blk[32 + 16 * j + r]);
                    isum += sc * (sj + corr[static_cast<size_t>(c) * corr_stride + static_cast<size_t>(b) * 16 + j]);
                }
                acc = std::fma(f16_to_f32(dw) * xb[b].d, static_cast<float>(isum), acc);
            }
            out[c * kPackRows + r] = acc;
        }
    }
}

} // namespace

void packed_tile_scalar(GgmlType t, int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride,
                        const int32_t* corr, size_t corr_stride, int n_cols, float* out) {
    if (t == GgmlType::Q4_K) return packed_tile_q4_k_scalar(nb, group, x, x_stride, corr, corr_stride, n_cols, out);
    if (t == GgmlType::Q6_K) return packed_tile_q6_k_scalar(nb, group, x, x_stride, corr, corr_stride, n_cols, out);
    const PackedLayout L = layout_of(t);
    for (int c = 0; c < n_cols; ++c) {
        const auto* xb = reinterpret_cast<const BlockQ8_0*>(x + static_cast<size_t>(c) * x_stride);
        for (int r = 0; r < kPackRows; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const uint8_t* blk = group + static_cast<size_t>(b) * L.block;
                uint16_t dw;
                std::memcpy(&dw, blk + 2 * r, 2);
                int32_t isum = corr[static_cast<size_t>(c) * corr_stride + 2 * static_cast<size_t>(b)];
                for (int i = 0; i < QK8_0; ++i) isum += packed_code(t, blk + 32, r, i) * xb[b].qs[i];
                const float d = f16_to_f32(dw) * f16_to_f32(xb[b].d);
                acc = std::fma(d, static_cast<float>(isum), acc);
            }
            out[c * kPackRows + r] = acc;
        }
    }
}

void packed_act_words(GgmlType t, const QuantizedActs& x, std::vector<int32_t>& words) {
    const bool k_quant = t == GgmlType::Q4_K || t == GgmlType::Q6_K;
    const size_t xstride = x.col_stride ? x.col_stride : act_row_bytes(x.format, x.n_in);
    act_corrections(t, x, x.n_in / (k_quant ? QK_K : QK8_0), xstride, k_quant ? 0 : layout_of(t).offset, words);
}

bool packing_pays(GgmlType t, int64_t n_in, const CpuKernels& k) {
    return packable(t, n_in) && k.packed(t).tile != nullptr;
}

void matmul_packed(const PackedMatrixView& w, const QuantizedActs& x, float* y, int n_threads, const CpuKernels* kernels) {
    const std::string where = std::string("matmul_packed(") + std::string(type_name(w.type)) + "): ";
    if (!packable(w.type, w.n_in)) throw std::invalid_argument(where + "no packed layout for these rows");
    if (!check_tiled_matmul_args(where, w.type, w.n_in, w.n_out, w.data, x)) return;

    const CpuKernels& k = kernels ? *kernels : cpu_kernels();
    const CpuKernels::Packed kernel = k.packed(w.type);
    const PackedTileFn simd = kernel.tile;
    const GgmlType t = w.type;
    const bool k_quant = t == GgmlType::Q4_K || t == GgmlType::Q6_K;
    const int64_t nb = w.n_in / (k_quant ? QK_K : QK8_0), n_out = w.n_out, n_cols = x.n_cols;
    const int corr_words = t == GgmlType::Q6_K ? 16 : t == GgmlType::Q4_K ? 4 : 2;   // per block and column
    const size_t corr_stride = static_cast<size_t>(corr_words * nb);
    const size_t xstride = x.col_stride ? x.col_stride : act_row_bytes(x.format, x.n_in);
    const size_t gbytes = packed_group_bytes(t, w.n_in);
    const auto* wbase = static_cast<const uint8_t*>(w.data);
    const auto* xbase = static_cast<const uint8_t*>(x.data);

    thread_local std::vector<int32_t> corr;
    packed_act_words(t, x, corr);

    const int64_t n_groups = (n_out + kPackRows - 1) / kPackRows;
    const int64_t chunk_cols =
        std::max<int64_t>(kTileCols, static_cast<int64_t>(kChunkActBytes / xstride) / kTileCols * kTileCols);
    // Decode with a decode kernel hands out kDecodeGroups groups at a time, read side by side.
    const PackedDecodeFn decode = n_cols == 1 && simd ? kernel.decode : nullptr;
    const int64_t unit = decode ? kDecodeGroups : 1;
    const int64_t n_units = (n_groups + unit - 1) / unit;
    int nt = std::max(1, n_threads);
    if (w.n_in * n_out * n_cols < kMinParallelWork) nt = 1;
    nt = static_cast<int>(std::min<int64_t>(nt, n_units));
    const int32_t* corr_data = corr.data();
    auto copy_rows = [&](int64_t c, int64_t g, const float* from) {
        std::memcpy(y + c * n_out + g * kPackRows, from, static_cast<size_t>(std::min<int64_t>(kPackRows, n_out - g * kPackRows)) * 4);
    };

    for (int64_t c0 = 0; c0 < n_cols; c0 += chunk_cols) {
        const int64_t c1 = std::min(n_cols, c0 + chunk_cols);
        // Unit u: its groups against the chunk's columns, kTileCols at a time (or all at once by the decode kernel).
        auto run_unit = [&](int64_t u, float* tile) {
            if (decode) {
                const int64_t g0 = u * unit;
                const int ng = static_cast<int>(std::min<int64_t>(unit, n_groups - g0));
                decode(nb, wbase + static_cast<size_t>(g0) * gbytes, gbytes, ng, xbase, corr_data, tile);
                for (int i = 0; i < ng; ++i) copy_rows(0, g0 + i, tile + i * kPackRows);
                return;
            }
            const uint8_t* grp = wbase + static_cast<size_t>(u) * gbytes;
            for (int64_t c = c0; c < c1; c += kTileCols) {
                const int nc = static_cast<int>(std::min<int64_t>(kTileCols, c1 - c));
                const uint8_t* xc = xbase + static_cast<size_t>(c) * xstride;
                const int32_t* cc = corr_data + static_cast<size_t>(c) * corr_stride;
                if (simd)
                    simd(nb, grp, xc, xstride, cc, corr_stride, nc, tile);
                else
                    packed_tile_scalar(t, nb, grp, xc, xstride, cc, corr_stride, nc, tile);
                for (int j = 0; j < nc; ++j) copy_rows(c + j, u, tile + j * kPackRows);
            }
        };
        // Each thread streams one contiguous slice of the units and steals from the others' backs when it runs
        // dry (stealing_split.h). Which thread computes a group never changes its results (one kernel call per
        // output).
        const int64_t col_tiles = (c1 - c0 + kTileCols - 1) / kTileCols;
        const size_t unit_bytes = gbytes * static_cast<size_t>(unit * col_tiles);
        StealingSplit split(n_units, nt, static_cast<int64_t>(kClaimBytes / unit_bytes));
        parallel_slots(nt, [&](int thread) {
            float tile[std::max(kTileCols, kDecodeGroups) * kPackRows];
            int64_t u0 = 0, u1 = 0;
            while (split.next(thread, &u0, &u1))
                for (int64_t u = u0; u < u1; ++u) run_unit(u, tile);
        });
    }
}

} // namespace tern
