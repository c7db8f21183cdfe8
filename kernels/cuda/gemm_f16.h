#pragma once
// The half-precision prefill path of a projection: the weights as f16 (F16 as uploaded, every other format
// dequantized block by block into f16) times the activations converted to f16 once, by cuBLAS on tensor
// cores with f32 accumulation (gemm_f16, kernels/cuda/blas.h). Where the f32 path (kernels/cuda/gemm.h) runs
// SGEMM on the CUDA cores, this one runs at tensor-core rate and moves half the bytes; the price is one f16
// rounding of every weight (none for F16, whose values are f16 already) and of every activation.
// Host-callable; every pointer is device memory, f16 values as IEEE binary16 bit patterns (uint16_t).
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// Whether matmul_gemm_f16 and dequantize_rows_f16 read this format: every format matmul reads but F32 and
// BF16, whose values f16's range (+-65504) and precision would cut: they stay on the f32 path.
bool gemm_f16_supports(GgmlType type);

// The f16 value of a dequantized f32 weight or an activation: round to nearest even, except that finite
// values past f16's largest (65504) saturate to +-65504 rather than become infinities (a quantized block
// with a huge scale stays a huge finite weight, as it is in f32); infinities and NaN stay what they are.
// quant/half.h's f32_to_f16 on the host, with this saturation, gives the same bits (NaN payloads aside).

// out (rows, n_in) = rows first_row .. first_row + rows - 1 of W (n_in elements each, row_bytes(type, n_in) bytes
// apart) as f16:
// each value dequantize_row's (quant/reference.h) bit for bit, then converted as above. w and out 16-byte
// aligned; n_in a multiple of the format's block size (F16: any n_in). Throws std::invalid_argument for a
// format gemm_f16_supports refuses, a bad n_in or a misaligned pointer.
void dequantize_rows_f16(GgmlType type, const void* w, int64_t n_in, int64_t first_row, int64_t rows, uint16_t* out,
                         cudaStream_t stream);

// y (count) = x (count) as f16, converted as above: a projection input converted once for all the
// projections that read it.
void convert_to_f16(const float* x, int64_t count, uint16_t* y, cudaStream_t stream);

// y (n_cols, n_out) = x W^T (+ bias (n_out) when bias is not null), f32 row-major, with x_h the n_cols columns
// of n_in f16 activations (convert_to_f16) and W n_out rows of n_in elements in `type`. F16 weights are
// multiplied as they are; other formats are dequantized into `scratch` (f16, scratch_elems >= n_in) in blocks
// of as many whole rows as it holds, each block then one gemm_f16. Refusals as dequantize_rows_f16's.
void matmul_gemm_f16(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const uint16_t* x_h, int64_t n_cols,
                     const float* bias, float* y, uint16_t* scratch, int64_t scratch_elems, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
