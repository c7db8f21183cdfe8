#pragma once
// The one place tern calls cuBLAS (kernels/cuda/blas.cu): under the CUDA emulator the same call runs a
// host implementation queued on the stream, so the backend's prefill path runs unchanged in the tests.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// y (n_cols, n_out) = x (n_cols, n_in) W^T, all f32 row-major on the device, W (n_out, n_in), with ldy the
// row stride of y (>= n_out: a block of W's rows writes its columns of a wider y). f32 arithmetic
// (no TF32): the reference the faster prefill paths are held against.
void gemm_f32(const float* w, int64_t n_out, int64_t n_in, const float* x, int64_t n_cols, float* y, int64_t ldy,
              cudaStream_t stream);

// The same product with W and x in f16 (IEEE binary16 bit patterns, row-major; y f32): products and sums in f32
// (CUBLAS_COMPUTE_32F), on tensor cores where cuBLAS picks them (its own handle in the default math mode;
// gemm_f32's stays pedantic). The half-precision prefill path (kernels/cuda/gemm_f16.h). The emulator adds the
// exact f32 products of the f16 values in order, one f32 rounding per sum.
void gemm_f16(const uint16_t* w, int64_t n_out, int64_t n_in, const uint16_t* x, int64_t n_cols, float* y,
              int64_t ldy, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
