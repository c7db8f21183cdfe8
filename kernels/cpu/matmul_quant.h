#pragma once
// y = W x on the CPU with weights in their file format and activations quantized once per column
// (kernels/cpu/quantize_act.h), through the dispatched dot kernels (kernels/cpu/dispatch.h).
//
// Shapes (GGUF ne[0] is the contiguous dimension):
//   w: (n_out, n_in) rows of w.type blocks, row r at w.data + r * w.row_stride
//   x: (n_cols, n_in) activations in act_format_for(w.type), column c at x.data + c * x.col_stride
//   y: (n_cols, n_out) f32, y[c * n_out + r] = dot(row r, column c)
//
// Each output is ONE call of the same dot kernel on the same bytes, computed by exactly one thread, so the
// result is bit-identical for any thread count and any tiling. Weight rows are read from memory once per
// call whatever n_cols is: decode (1 column) and draft verification (<= 8) take every column while the row
// is in L1; prefill (more) walks tiles of rows that stay in L2 while all columns stream past them.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/dot.h"
#include "quant/types.h"

namespace tern {

struct WeightMatrixView {
    GgmlType type = GgmlType::F32;
    const void* data = nullptr;
    int64_t n_in = 0;          // elements per row (a multiple of the block size)
    int64_t n_out = 0;         // rows
    size_t row_stride = 0;     // bytes between rows; 0 means row_bytes(type, n_in) (dense)
};

struct QuantizedActs {
    ActFormat format = ActFormat::f32;
    const void* data = nullptr;
    int64_t n_in = 0;
    int64_t n_cols = 0;
    size_t col_stride = 0;     // bytes between columns; 0 means act_row_bytes(format, n_in)
};

// Owns the quantized activations of one matmul input; reuse one per backend to avoid reallocating.
class ActBuffer {
public:
    // Quantizes x (n_cols, n_in) f32 for weights of format `w` and returns a view of the result (valid until
    // the next call).
    QuantizedActs quantize(GgmlType w, const float* x, int64_t n_in, int64_t n_cols);

private:
    std::vector<unsigned char> bytes_;
};

// y = W x (shapes above) with n_threads threads of the pool (parallel_for.h over row chunks; fewer for small
// work). `kernels` picks a kernel set (tests force one); nullptr means cpu_kernels(). Throws
// std::invalid_argument when the shapes or formats do not fit together.
void matmul_q(const WeightMatrixView& w, const QuantizedActs& x, float* y, int n_threads,
              const CpuKernels* kernels = nullptr);

// The argument contract of the tiled matmuls over repacked weights (matmul_packed, matmul_f16_panels),
// after each has checked its own layout: activations in act_format_for(type) with n_in elements per
// column, data present, shapes not negative. Throws std::invalid_argument starting with `where`; returns
// false when there is nothing to compute (no rows or no columns).
bool check_tiled_matmul_args(const std::string& where, GgmlType type, int64_t n_in, int64_t n_out,
                             const void* w_data, const QuantizedActs& x);

} // namespace tern
