#pragma once
// The one way tern launches a kernel: tern::cuda::launch(kernel, grid, block, shared_bytes, stream, args...)
// is `kernel<<<grid, block, shared_bytes, stream>>>(args...)` followed by a launch-error check under
// nvcc, and the emulator's launch of the same kernel under g++ (TERN_CUDA_EMULATOR), so call sites are
// identical in both builds. Arguments are converted to the kernel's parameter types and copied at the
// call, as the runtime does (a stream under graph capture keeps those copies for every replay).
#include <tuple>
#include <utility>

#include "kernels/cuda/runtime.h"

#if !defined(TERN_CUDA_EMULATOR) && !defined(__CUDACC__)
#error "kernels/cuda/launch.h launches kernels: include it from .cu files (nvcc) or build against the emulator"
#endif

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
            Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args), "tern::cuda::launch: argument count differs from the kernel's");
#if defined(TERN_CUDA_EMULATOR)
    cuda_emu::launch(
        grid, block, shared_bytes, stream,
        [kernel, params = std::tuple<Params...>(std::forward<Args>(args)...)] { std::apply(kernel, params); });
#else
    kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
#endif
    check(cudaGetLastError(), "kernel launch");
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
