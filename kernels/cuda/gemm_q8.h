#pragma once
// Prefill matmul with int8 activations on tensor cores: the many-column counterpart of matmul_q8
// (kernels/cuda/matmul_q8.h), for the same weight formats and the same quantized activations
// (quantize_activations' q8 units). Where matmul_q8 reads the weights once per 8 columns, this reads them
// once per 64, decoded into shared memory as int8 codes and per-block scales, and takes the integer dot
// products from int8 mma.sync (kernels/cuda/mma.h). Needs compute capability 8.0 or later.
// Host-callable; every pointer is device memory.
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// Whether gemm_q8 runs on CUDA device `device`: compute capability 8.0 or later (the int8 mma shapes
// appeared with sm_80). False when the device cannot be asked.
bool gemm_q8_device_supported(int device);

// y (n_cols, n_out) = x W^T (+ bias (n_out) when bias is not null), f32 row-major, with x the n_cols columns
// of n_in quantized activations at x_q (quantize_activations' output) and W n_out rows of n_in elements in
// `type`, one of the formats matmul_q8_supports; the arguments are those of matmul_q8 (n_in a multiple of the
// block size, w and x_q 16-byte aligned), any n_cols and n_out. Per 32-element block the integer dot
// product of the codes is exact (for Q3_K and Q6_K, the two 16-element halves' products weighed by their
// integer scales), and it is scaled as matmul_q8 scales a unit's, dx * (d * D + m * S), into f32
// accumulators: the two differ only in f32 rounding order. Throws std::invalid_argument for what matmul_q8
// refuses, and on a current device below compute capability 8.0.
void gemm_q8(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const void* x_q, int64_t n_cols,
             const float* bias, float* y, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
