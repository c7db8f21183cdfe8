#pragma once
// The prefill path of a projection: many columns at once through cuBLAS (kernels/cuda/blas.h) instead of
// passes of the decode kernel (kernels/cuda/matmul.h), which read the weights once per 8 columns.
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// y (n_cols, n_out) = x (n_cols, n_in) W^T (+ bias), as matmul() computes it: W's rows are dequantized
// (bit for bit as dequantize_row) in blocks of as many rows as `scratch` holds (scratch_floats >= n_in),
// and each block is multiplied in f32 by gemm_f32. row_ids holds 0 .. n_out - 1 on the device (the
// dequantizer is the embedding lookup's). All pointers device memory, 16-byte aligned.
void matmul_gemm(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols,
                 const float* bias, float* y, const int32_t* row_ids, float* scratch, int64_t scratch_floats,
                 cudaStream_t stream);

// y (rows, width) += v (width) in every row.
void add_row_vector(float* y, const float* v, int64_t rows, int64_t width, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
