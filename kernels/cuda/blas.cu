#include "kernels/cuda/blas.h"

#include "kernels/cuda/launch.h"
#include "quant/half.h"

#if !defined(TERN_CUDA_EMULATOR)
#include <cublas_v2.h>

#include <mutex>
#include <string>
#endif

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

#if defined(TERN_CUDA_EMULATOR)

namespace {

// The emulator's product for both entry points: y (n_cols, n_out) = x W^T, each operand read as f32 through
// `value` (the f16 path's values are exactly its halves), f32 sums, queued on the stream like a kernel.
template <typename T, typename Value>
void host_gemm(const T* w, int64_t n_out, int64_t n_in, const T* x, int64_t n_cols, float* y, int64_t ldy,
               cudaStream_t stream, Value value, const char* what) {
    if (n_out == 0 || n_cols == 0) return;
    check(cuda_emu::emu_record_launch(stream,
                                      [=] {
#pragma omp parallel for schedule(static)
                                          for (int64_t c = 0; c < n_cols; ++c)
                                              for (int64_t r = 0; r < n_out; ++r) {
                                                  float acc = 0.0f;
                                                  for (int64_t i = 0; i < n_in; ++i)
                                                      acc += value(w[r * n_in + i]) * value(x[c * n_in + i]);
                                                  y[c * ldy + r] = acc;
                                              }
                                      }),
          what);
}

} // namespace

void gemm_f32(const float* w, int64_t n_out, int64_t n_in, const float* x, int64_t n_cols, float* y, int64_t ldy,
              cudaStream_t stream) {
    host_gemm(w, n_out, n_in, x, n_cols, y, ldy, stream, [](float v) { return v; }, "gemm_f32");
}

void gemm_f16(const uint16_t* w, int64_t n_out, int64_t n_in, const uint16_t* x, int64_t n_cols, float* y,
              int64_t ldy, cudaStream_t stream) {
    host_gemm(w, n_out, n_in, x, n_cols, y, ldy, stream, [](uint16_t v) { return f16_to_f32(v); }, "gemm_f16");
}

#else

namespace {

const char* cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "cuBLAS error";
    }
}

void cublas_check(cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS) throw Error(cudaErrorUnknown, std::string(what) + ": " + cublas_status_name(s));
}

// One handle for the process (the backend uses one device); calls set their stream on it.
cublasHandle_t handle() {
    static std::once_flag once;
    static cublasHandle_t h = nullptr;
    std::call_once(once, [] {
        cublas_check(cublasCreate(&h), "cublasCreate");
        cublas_check(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");   // no TF32
    });
    return h;
}

// The f16 path's handle: the default math mode, which lets f16 inputs run on tensor cores.
cublasHandle_t tensor_op_handle() {
    static std::once_flag once;
    static cublasHandle_t h = nullptr;
    std::call_once(once, [] { cublas_check(cublasCreate(&h), "cublasCreate"); });
    return h;
}

} // namespace

void gemm_f32(const float* w, int64_t n_out, int64_t n_in, const float* x, int64_t n_cols, float* y, int64_t ldy,
              cudaStream_t stream) {
    if (n_out == 0 || n_cols == 0) return;
    cublasHandle_t h = handle();
    cublas_check(cublasSetStream(h, stream), "cublasSetStream");
    // Column-major view: y^T (n_out, n_cols) = W (n_out, n_in) . x^T (n_in, n_cols); W row-major is W^T
    // column-major with leading dimension n_in.
    const float one = 1.0f, zero = 0.0f;
    cublas_check(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_out), static_cast<int>(n_cols),
                             static_cast<int>(n_in), &one, w, static_cast<int>(n_in), x, static_cast<int>(n_in), &zero, y,
                             static_cast<int>(ldy)),
                 "cublasSgemm");
}

void gemm_f16(const uint16_t* w, int64_t n_out, int64_t n_in, const uint16_t* x, int64_t n_cols, float* y,
              int64_t ldy, cudaStream_t stream) {
    if (n_out == 0 || n_cols == 0) return;
    cublasHandle_t h = tensor_op_handle();
    cublas_check(cublasSetStream(h, stream), "cublasSetStream");
    // gemm_f32's column-major view, with f16 operands and an f32 result and compute type.
    const float one = 1.0f, zero = 0.0f;
    cublas_check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n_out), static_cast<int>(n_cols),
                              static_cast<int>(n_in), &one, w, CUDA_R_16F, static_cast<int>(n_in), x, CUDA_R_16F,
                              static_cast<int>(n_in), &zero, y, CUDA_R_32F, static_cast<int>(ldy), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
}

#endif

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
