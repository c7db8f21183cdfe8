#pragma once
// Weight x activation products and embedding lookups on the GPU, reading the weights in their GGUF
// formats as uploaded (kernels/cuda/matmul.cu). Host-callable launchers; every pointer is device memory.
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// Whether matmul() and embed_rows() read this format: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and F8_E4M3.
bool matmul_supports(GgmlType type);

// y (n_cols, n_out) = x (n_cols, n_in) W^T (+ bias (n_out) when bias is not null), f32 row-major. W is
// n_out rows of n_in elements in `type` (row_bytes(type, n_in) bytes each; n_in a multiple of the block
// size). Up to 8 columns share one pass over the weights (decode and draft verification cost about one
// read of W); more columns take ceil(n_cols / 8) passes. Accumulates in f32. w and x must be 16-byte
// aligned (cudaMalloc gives 256, GGUF tensor data 32); a format it does not read, an n_in that is not a
// multiple of the block size or a misaligned pointer throws std::invalid_argument.
void matmul(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols,
            const float* bias, float* y, cudaStream_t stream);

// x (n, dim) = scale * row tokens[i] of `table` (rows of dim elements in `type`), tokens on the device and
// each a row of the table. Bit for bit dequantize_row (quant/reference.h) times the scale; scale 1 leaves
// the values untouched, as the CPU's embedding does. table and x 16-byte aligned, as for matmul.
void embed_rows(GgmlType type, const void* table, int64_t dim, const int32_t* tokens, int64_t n, float scale,
                float* x, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
