// Row-parallel quantized matmul (see matmul_quant.h for shapes and the determinism argument).
#include "kernels/cpu/matmul_quant.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "base/parallel_for.h"
#include "kernels/cpu/quantize_act.h"

namespace tern {

QuantizedActs ActBuffer::quantize(GgmlType w, const float* x, int64_t n_in, int64_t n_cols) {
    const ActFormat f = act_format_for(w);
    const size_t rb = act_row_bytes(f, n_in);
    bytes_.resize(rb * static_cast<size_t>(n_cols));
    quantize_acts(f, x, n_in, n_cols, bytes_.data());
    return QuantizedActs{f, bytes_.data(), n_in, n_cols, rb};
}

namespace {

// Rows per prefill tile: ~48 KiB of weights stays in L2 (1-2 MiB on current x86) next to the streaming
// activations, so each row tile is read from DRAM once and reused by every column.
constexpr size_t kTileWeightBytes = 48 * 1024;
// Below ~256K multiply-adds (e.g. one 512x512 matvec) a fork/join costs more than it saves.
constexpr int64_t kMinParallelWork = 256 * 1024;

} // namespace

void matmul_q(const WeightMatrixView& w, const QuantizedActs& x, float* y, int n_threads, const CpuKernels* kernels) {
    const std::string where = std::string("matmul_q(") + std::string(type_name(w.type)) + "): ";
    const ActFormat want = act_format_for(w.type);
    if (x.format != want)
        throw std::invalid_argument(where + "activations are " + act_format_name(x.format) + ", expected " +
                                    act_format_name(want));
    if (x.n_in != w.n_in)
        throw std::invalid_argument(where + "activations have " + std::to_string(x.n_in) + " elements per column, weights " +
                                    std::to_string(w.n_in) + " per row");
    if (w.n_in <= 0 || w.n_in % block_elems(w.type) != 0 || w.n_in % act_block_elems(want) != 0)
        throw std::invalid_argument(where + "n_in = " + std::to_string(w.n_in) + " is not a positive multiple of the block size");
    if (w.n_out < 0 || x.n_cols < 0 || (!w.data && w.n_out > 0) || (!x.data && x.n_cols > 0))
        throw std::invalid_argument(where + "null data or negative shape");
    if (w.n_out == 0 || x.n_cols == 0) return;

    const CpuKernels& k = kernels ? *kernels : cpu_kernels();
    const VecDotFn dot = k.dot(w.type);
    // Its bits per column are dot's (dot.h), so which of the two runs changes no output.
    const size_t wstride = w.row_stride ? w.row_stride : row_bytes(w.type, w.n_in);
    const size_t xstride = x.col_stride ? x.col_stride : act_row_bytes(x.format, x.n_in);
    const auto* wbase = static_cast<const unsigned char*>(w.data);
    const auto* xbase = static_cast<const unsigned char*>(x.data);
    const int64_t n_in = w.n_in, n_out = w.n_out, n_cols = x.n_cols;
    // Its bits per column are dot's (dot.h), so which of the two runs changes no output.
    const VecDotColsFn dot_cols = n_cols > 1 ? k.find_dot_cols(w.type) : nullptr;

    // Rows per work item: decode takes chunks of 16 rows (a few KiB of weights, enough to amortise the
    // loop); prefill takes L2-sized tiles.
    const int64_t rows_per_item =
        n_cols <= 8 ? 16 : std::max<int64_t>(1, static_cast<int64_t>(kTileWeightBytes / std::max<size_t>(wstride, 1)));
    const int64_t n_items = (n_out + rows_per_item - 1) / rows_per_item;
    int nt = std::max(1, n_threads);
    if (n_in * n_out * n_cols < kMinParallelWork) nt = 1;
    nt = static_cast<int>(std::min<int64_t>(nt, n_items));

    // Claims of up to ~64 KiB of weights: small enough that the end of the matmul never waits long for a
    // descheduled thread's batch (parallel_for.h), large enough that claiming costs nothing.
    const int64_t max_batch = std::max<int64_t>(1, static_cast<int64_t>((size_t{64} << 10) / (static_cast<size_t>(rows_per_item) * wstride + 1)));
    parallel_for(n_items, nt, max_batch, [&](int64_t item0, int64_t item1) {
        const int64_t r0 = item0 * rows_per_item;
        const int64_t r1 = std::min(n_out, item1 * rows_per_item);
        if (dot_cols) {
            // kDotCols columns at a time over the item's rows: each row's blocks unpacked once per pass.
            for (int64_t c0 = 0; c0 < n_cols; c0 += kDotCols) {
                const int cols = static_cast<int>(std::min<int64_t>(kDotCols, n_cols - c0));
                const unsigned char* xc = xbase + static_cast<size_t>(c0) * xstride;
                for (int64_t r = r0; r < r1; ++r)
                    dot_cols(n_in, wbase + static_cast<size_t>(r) * wstride, xc, xstride, cols, y + c0 * n_out + r,
                             static_cast<size_t>(n_out));
            }
        } else if (n_cols <= 8) {
            for (int64_t r = r0; r < r1; ++r) {
                const unsigned char* wr = wbase + static_cast<size_t>(r) * wstride;
                for (int64_t c = 0; c < n_cols; ++c) y[c * n_out + r] = dot(n_in, wr, xbase + static_cast<size_t>(c) * xstride);
            }
        } else {
            for (int64_t c = 0; c < n_cols; ++c) {
                const unsigned char* xc = xbase + static_cast<size_t>(c) * xstride;
                float* yc = y + c * n_out;
                for (int64_t r = r0; r < r1; ++r) yc[r] = dot(n_in, wbase + static_cast<size_t>(r) * wstride, xc);
            }
        }
    });
}

bool check_tiled_matmul_args(const std::string& where, GgmlType type, int64_t n_in, int64_t n_out,
                             const void* w_data, const QuantizedActs& x) {
    if (x.format != act_format_for(type) || x.n_in != n_in)
        throw std::invalid_argument(where + "activations are " + act_format_name(x.format) + " with " +
                                    std::to_string(x.n_in) + " elements per column, expected " +
                                    act_format_name(act_format_for(type)) + " with " + std::to_string(n_in));
    if (n_out < 0 || x.n_cols < 0 || (!w_data && n_out > 0) || (!x.data && x.n_cols > 0))
        throw std::invalid_argument(where + "null data or negative shape");
    return n_out > 0 && x.n_cols > 0;
}

} // namespace tern
