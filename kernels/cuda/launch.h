#pragma once
// The one way tern launches a kernel: tern::cuda::launch(kernel, grid, block, shared_bytes, stream, args...)
// is `kernel<<<grid, block, shared_bytes, stream>>>(args...)` followed by a launch-error check under
// nvcc, and the emulator's launch of the same kernel under g++ (TERN_CUDA_EMULATOR), so call sites are
// identical in both builds. Arguments are converted to the kernel's parameter types and copied at the
// call, as the runtime does (a stream under graph capture keeps those copies for every replay).
//
// tern::cuda::launch_dependent(...) takes the same arguments for a kernel that starts with
// dependent_launch::wait_and_release() (kernels/cuda/dependent_launch.h): inside a ProgrammaticLaunches scope
// it launches the kernel as a programmatic dependent of the previous one (cudaLaunchKernelEx with
// cudaLaunchAttributeProgrammaticStreamSerialization), elsewhere as launch() does.
#include <tuple>
#include <utility>

#include "kernels/cuda/dependent_launch.h"
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

template <typename... Params, typename... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                      Args&&... args) {
    static_assert(sizeof...(Params) == sizeof...(Args),
                  "tern::cuda::launch_dependent: argument count differs from the kernel's");
#if defined(TERN_CUDA_EMULATOR)
    cuda_emu::launch(
        grid, block, shared_bytes, stream,
        [kernel, params = std::tuple<Params...>(std::forward<Args>(args)...)] { std::apply(kernel, params); },
        programmatic_launches_on);
    check(cudaGetLastError(), "kernel launch");
#else
    if (!programmatic_launches_on) {
        launch(kernel, grid, block, shared_bytes, stream, std::forward<Args>(args)...);
        return;
    }
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    check(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...), "kernel launch");
#endif
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
