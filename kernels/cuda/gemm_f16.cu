// The half-precision prefill path (kernels/cuda/gemm_f16.h): weight rows dequantized into f16, activations
// converted to f16, cuBLAS's f16 GEMM with f32 accumulation.
//
// dequantize_rows_f16: one thread per 8-element slice of a row (dequant.cuh, the decode matmul's unit), the
// slice's two runs of 4 values stored as two 8-byte words; F16 rows are f16 already and are copied. The rows
// of a block land in an L2-sized scratch that the GEMM reads right after (the backend sizes the block).
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <string>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/column_passes.h"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/format_list.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_f16.h"
#include "kernels/cuda/launch.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace {

constexpr int kThreads = 256;
constexpr float kF16Max = 65504.0f;

using Formats = FormatList<GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                           GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                           GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::F8_E4M3, GgmlType::MXFP4>;

// f32 -> f16 bits, round to nearest even, finite values past +-65504 saturated (gemm_f16.h). NaN fails the
// comparison and converts as itself.
__device__ __forceinline__ uint32_t f16_bits(float v) {
    const float a = fabsf(v);
    if (a > kF16Max && a <= FLT_MAX) v = v < 0.0f ? -kF16Max : kF16Max;
    return __half_as_ushort(__float2half_rn(v));
}

__device__ __forceinline__ uint2 pack4(float a, float b, float c, float d) {
    return make_uint2(f16_bits(a) | (f16_bits(b) << 16), f16_bits(c) | (f16_bits(d) << 16));
}

// Row blockIdx.x, slices blockIdx.y * kThreads + threadIdx.x.
template <GgmlType T>
__global__ void __launch_bounds__(kThreads)
    dequantize_f16_slices(const uint8_t* __restrict__ w, int64_t row_bytes, int n_in, uint16_t* __restrict__ out) {
    using D = dequant::Dequant<T>;
    const int q = static_cast<int>(blockIdx.y * kThreads + threadIdx.x);
    if (q >= n_in / 8) return;
    float v[8];
    D::slice(w + static_cast<int64_t>(blockIdx.x) * row_bytes, q, v);
    uint16_t* o = out + static_cast<int64_t>(blockIdx.x) * n_in + D::first(q);
    *reinterpret_cast<uint2*>(o) = pack4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<uint2*>(o + D::kSecond) = pack4(v[4], v[5], v[6], v[7]);
}

__global__ void __launch_bounds__(kThreads)
    convert_to_f16_kernel(const float* __restrict__ x, int64_t count, uint16_t* __restrict__ y) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
    if (i < count) y[i] = static_cast<uint16_t>(f16_bits(x[i]));
}

using column_passes::check_aligned;
using column_passes::kIntMax;
using column_passes::refuse;

void check_format(const char* fn, GgmlType type, int64_t n_in) {
    if (!gemm_f16_supports(type)) refuse(std::string(fn) + ": format " + std::string(type_name(type)) + " is not read");
    if (n_in < 0 || n_in > kIntMax || n_in % block_elems(type) != 0)
        refuse(std::string(fn) + ": n_in = " + std::to_string(n_in) + " is not a multiple of " +
               std::to_string(block_elems(type)) + " in range");
}

} // namespace

bool gemm_f16_supports(GgmlType type) { return Formats::contains(type); }

void dequantize_rows_f16(GgmlType type, const void* w, int64_t n_in, int64_t first_row, int64_t rows, uint16_t* out,
                         cudaStream_t stream) {
    check_format("dequantize_rows_f16", type, n_in);
    if (rows < 0 || rows > kIntMax || first_row < 0)
        refuse("dequantize_rows_f16: rows " + std::to_string(first_row) + " + " + std::to_string(rows) +
               " out of range");
    if (rows == 0 || n_in == 0) return;
    check_aligned("dequantize_rows_f16", w, "w");
    check_aligned("dequantize_rows_f16", out, "out");
    const auto rb = static_cast<int64_t>(row_bytes(type, n_in));
    // Past whole rows every block keeps its natural alignment (dequant.cuh), which is all the loads need.
    const uint8_t* first = static_cast<const uint8_t*>(w) + first_row * rb;
    if (type == GgmlType::F16) {   // already f16: the bits as they are
        check(cudaMemcpyAsync(out, first, static_cast<size_t>(rows * rb), cudaMemcpyDeviceToDevice, stream),
              "dequantize_rows_f16");
        return;
    }
    Formats::visit(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if constexpr (T != GgmlType::F16) {
            const int64_t slices = n_in / 8;
            const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>((slices + kThreads - 1) / kThreads));
            launch(dequantize_f16_slices<T>, grid, dim3(kThreads), 0, stream, first, rb, static_cast<int>(n_in), out);
        }
    });
}

void convert_to_f16(const float* x, int64_t count, uint16_t* y, cudaStream_t stream) {
    if (count < 0 || (count + kThreads - 1) / kThreads > kIntMax)
        refuse("convert_to_f16: count = " + std::to_string(count) + " out of range");
    if (count == 0) return;
    launch(convert_to_f16_kernel, dim3(static_cast<unsigned>((count + kThreads - 1) / kThreads)), dim3(kThreads), 0,
           stream, x, count, y);
}

void matmul_gemm_f16(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const uint16_t* x_h, int64_t n_cols,
                     const float* bias, float* y, uint16_t* scratch, int64_t scratch_elems, cudaStream_t stream) {
    check_format("matmul_gemm_f16", type, n_in);
    if (n_out == 0 || n_cols == 0) return;
    if (type == GgmlType::F16) {   // the weights as uploaded: one GEMM, no scratch
        gemm_f16(static_cast<const uint16_t*>(w), n_out, n_in, x_h, n_cols, y, n_out, stream);
    } else {
        if (scratch_elems < n_in) refuse("matmul_gemm_f16: the scratch holds less than one row");
        // Blocks of whole rows, a multiple of 64 where the scratch allows (whole tensor-core tiles), else of 4
        // (each block's first output stays 16-byte aligned).
        int64_t block = std::min(n_out, scratch_elems / n_in);
        if (block < n_out) block -= block >= 64 ? block % 64 : (block >= 4 ? block % 4 : 0);
        for (int64_t r0 = 0; r0 < n_out; r0 += block) {
            const int64_t rows = std::min(block, n_out - r0);
            dequantize_rows_f16(type, w, n_in, r0, rows, scratch, stream);
            gemm_f16(scratch, rows, n_in, x_h, n_cols, y + r0, n_out, stream);
        }
    }
    if (bias) add_row_vector(y, bias, n_cols, n_out, stream);
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
