#pragma once
// Programmatic dependent launch (compute capability 9.0+): a kernel launched with tern::cuda::launch_dependent
// (launch.h) while programmatic launches are on may start before the kernel ahead of it in the stream has
// finished, so that its blocks are placed and ready while that kernel's last blocks drain, instead of after
// the launch gap. A captured graph keeps the relation as a programmatic edge (CUDA 12.3+).
//
// The rule for a kernel launched that way: every thread calls dependent_launch::wait_and_release() before it
// reads anything an earlier kernel wrote or writes anything an earlier kernel reads: first thing in the kernel.
// The wait (griddepcontrol.wait) returns when the kernels it depends on have completed and their memory is
// visible; since a kernel cannot complete before its own wait returned, that holds for the whole chain. The
// release (griddepcontrol.launch_dependents) lets the next dependent launch once every block of this grid has
// released or exited. Releasing at the start costs the grid nothing: by then all of its blocks are resident,
// and the dependent's blocks only take room this grid's tail leaves idle, waiting in their own wait.
//
// Below sm_90 both compile to nothing (and launch_dependent launches plainly). Under the emulator the wait is
// a mark: a thread of a programmatic launch that exits or uses an atomic without it faults.
//
// The host's switch is per thread: ProgrammaticLaunches on = {enabled} for a scope (the CUDA backend's
// forward), and launches from that thread inside it go out programmatic.
#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// Whether launch_dependent from this thread launches programmatically (set through ProgrammaticLaunches).
inline thread_local bool programmatic_launches_on = false;

class ProgrammaticLaunches {
public:
    explicit ProgrammaticLaunches(bool enabled) : saved_(programmatic_launches_on) {
        programmatic_launches_on = enabled;
    }
    ~ProgrammaticLaunches() { programmatic_launches_on = saved_; }
    ProgrammaticLaunches(const ProgrammaticLaunches&) = delete;
    ProgrammaticLaunches& operator=(const ProgrammaticLaunches&) = delete;

private:
    bool saved_;
};

// Whether `device` runs programmatic dependent launches: compute capability 9.0 or later. The emulator says
// yes, so that the suites check the waits of every kernel the backend launches that way.
inline bool programmatic_launch_supported(int device) {
#if defined(TERN_CUDA_EMULATOR)
    (void)device;
    return true;
#else
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
        cudaGetLastError();   // the failed query is not the caller's launch error
        return false;
    }
    return major >= 9;
#endif
}

#if defined(__CUDACC__) || defined(TERN_CUDA_EMULATOR)
namespace dependent_launch {

// Waits for the kernels this one depends on (complete, memory visible), then lets its own dependents launch.
__device__ __forceinline__ void wait_and_release() {
#if defined(TERN_CUDA_EMULATOR)
    cudaGridDependencySynchronize();
    cudaTriggerProgrammaticLaunchCompletion();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

} // namespace dependent_launch
#endif

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
