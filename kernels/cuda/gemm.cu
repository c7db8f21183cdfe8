#include "kernels/cuda/gemm.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace {

__global__ void add_row_vector_kernel(float* __restrict__ y, const float* __restrict__ v, int64_t total, int width) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < total) y[i] += v[i % width];
}

} // namespace

void add_row_vector(float* y, const float* v, int64_t rows, int64_t width, cudaStream_t stream) {
    const int64_t total = rows * width;
    if (total == 0) return;
    constexpr int kThreads = 256;
    launch(add_row_vector_kernel, dim3(static_cast<unsigned>((total + kThreads - 1) / kThreads)), dim3(kThreads), 0,
           stream, y, v, total, static_cast<int>(width));
}

void matmul_gemm(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols,
                 const float* bias, float* y, const int32_t* row_ids, float* scratch, int64_t scratch_floats,
                 cudaStream_t stream) {
    if (n_out == 0 || n_cols == 0) return;
    if (scratch_floats < n_in) throw std::invalid_argument("matmul_gemm: the scratch holds less than one row");
    // Blocks of whole rows; a multiple of 4 keeps each block's first output 16-byte aligned.
    int64_t block = std::min(n_out, scratch_floats / n_in);
    if (block < n_out && block >= 4) block -= block % 4;
    for (int64_t r0 = 0; r0 < n_out; r0 += block) {
        const int64_t rows = std::min(block, n_out - r0);
        embed_rows(type, w, n_in, row_ids + r0, rows, 1.0f, scratch, stream);
        gemm_f32(scratch, rows, n_in, x, n_cols, y + r0, n_out, stream);
    }
    if (bias) add_row_vector(y, bias, n_cols, n_out, stream);
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
