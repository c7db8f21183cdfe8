#pragma once
// The CUDA headers every kernel source includes, for either compiler: nvcc gets the toolkit's runtime
// and number types; g++ with TERN_CUDA_EMULATOR gets the emulator (cuda_emu/cuda_emu.h), which
// runs the same sources on the CPU in the tests. Kernels written against this header must follow the
// emulator's rules (see its top comment): launch through launch.h, exchange data in a warp only through
// the _sync intrinsics, and take dynamic shared memory from dynamic_shared<T>() below.
#include <stdexcept>
#include <string>

#if defined(TERN_CUDA_EMULATOR)
#include "cuda_emu/cuda_emu.h"
#elif defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#else
#include <cuda_runtime.h>
#endif

// Every kernel, launcher and backend class compiled from tern's CUDA sources lives in the inline
// namespace TERN_CUDA_ABI: `dev` for the real build (nvcc kernels, the CUDA runtime), `emu` for the same
// sources built against the emulator. Code names them without it (tern::cuda::matmul, tern::CudaBackend),
// and a test executable can hold both builds at once without their symbols colliding.
#if defined(TERN_CUDA_EMULATOR)
#define TERN_CUDA_ABI emu
#else
#define TERN_CUDA_ABI dev
#endif

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// A CUDA runtime call that failed; the message names the call and the runtime's description.
struct Error : std::runtime_error {
    cudaError_t code;
    Error(cudaError_t e, const std::string& what)
        : std::runtime_error(what + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")"), code(e) {}
};

inline void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw Error(e, what);
}

#if defined(TERN_CUDA_EMULATOR)
// The block's dynamic shared memory (the launch's shared_bytes), 16-byte aligned.
template <typename T> T* dynamic_shared() {
    return reinterpret_cast<T*>(cuda_emu::detail::dynamic_shared_base(nullptr));
}
#elif defined(__CUDACC__)
// One untyped extern array for all kernels: typed `extern __shared__ T x[]` declarations with different
// T in one translation unit conflict under nvcc.
template <typename T> __device__ __forceinline__ T* dynamic_shared() {
    extern __shared__ __align__(16) unsigned char tern_dynamic_shared_bytes[];
    return reinterpret_cast<T*>(tern_dynamic_shared_bytes);
}
#endif

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
