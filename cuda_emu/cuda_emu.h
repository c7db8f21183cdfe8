#pragma once
// tern's CUDA emulator: the same kernel sources that nvcc compiles for a GPU, compiled by g++ and run on
// the CPU in the unit tests. A translation unit built with TERN_CUDA_EMULATOR includes this header in
// place of <cuda_runtime.h> / <cuda_fp16.h> / <cuda_bf16.h> / <cuda_fp8.h> (kernels/cuda/runtime.h picks).
//
// What it emulates
//   - The execution model: a grid of blocks of up to 1024 threads; threadIdx / blockIdx / blockDim /
//     gridDim / warpSize per emulated thread. Every thread is a fiber (cuda_emu_context.h) with its own stack; the
//     threads of a block run cooperatively on one OS thread, switching only inside a synchronising call;
//     blocks are spread over OpenMP threads (set_worker_threads). Each thread has a 256 KiB stack (512 KiB
//     under ASan) behind a guard page; stacks are reused across blocks. A barrier or shuffle costs about
//     0.2 us per thread, so tests should use modest grids.
//   - __syncthreads (and _count/_and/_or), __syncwarp(mask), __shfl{,_up,_down,_xor}_sync with width,
//     __ballot_sync, __any_sync, __all_sync, __match_any/all_sync, __reduce_{add,min,max}_sync,
//     __activemask: warps of 32 lanes exchanging through a per-warp rendezvous with masks honoured, so
//     divergent lanes meeting at a shuffle with a partial mask behave as on Volta and later.
//   - Static __shared__ variables (per block: see "shared memory" below) and dynamic shared memory
//     (tern::cuda::dynamic_shared<T>(), guarded by red zones).
//   - Atomics as real atomics (blocks run on several OS threads), __dp4a / __dp2a, __half,
//     __nv_bfloat16 and __nv_fp8_e4m3 with conversions bit-exact with the device (NaN included:
//     the device writes canonical NaNs), the usual integer and float intrinsics.
//   - Tensor cores through tern wrappers (kernels/cuda/mma.h: ldmatrix_x4, mma_m16n8k16_f32_f16 and the int8
//     mma_m16n8k32_s32_s8 / mma_m16n8k16_s32_s8), the PTX fragment layouts rebuilt from shuffles.
//   - The host API as host operations (cuda_emu_host.h): cudaMalloc / cudaMemcpy(Async) / cudaMemset /
//     streams (in order, run synchronously) / events / cudaGraph capture and replay / last error.
//
// What it detects (a launch throws cuda_emu::Fault with a message naming the block, thread and source line)
//   - a warp intrinsic whose mask leaves out the calling lane, names a lane that does not exist or has
//     exited, or a shuffle reading a lane outside the mask; lanes of one mask meeting at different
//     intrinsics; a bad shuffle width;
//   - deadlock: every live thread of a block blocked with no barrier or warp rendezvous complete (a
//     __syncthreads that not all live threads reach, a __syncwarp / shuffle whose lanes never arrive);
//   - dynamic shared memory written out of bounds (red zones checked at every __syncthreads and at block
//     end; under ASan reads and writes are caught at once), misaligned atomics, __trap().
//   The faulting thread is unwound; the block's other threads are abandoned where they wait (objects
//   they own are not destroyed), and later launches run normally.
//   Launch configuration errors (more than 1024 threads, a zero dimension, too much shared memory) are
//   returned as cudaErrorInvalidConfiguration / cudaErrorInvalidValue like the runtime does.
//
// What it does not emulate
//   - timing, occupancy, memory coalescing, bank conflicts, caches, clocks (clock64 counts calls);
//   - warp-synchronous code without _sync intrinsics (implicit lockstep): lanes run one after another
//     and only meet at a synchronising call; __activemask() returns the warp's live lanes, not the
//     lanes the hardware happens to have converged;
//   - blocks waiting on each other (spin locks across blocks, cooperative grid sync): each OS thread
//     runs a block to completion before the next;
//   - the device's approximate math: __expf, __logf, __sinf, __cosf, __powf, __fdividef and rsqrtf are
//     computed exactly here, so compare kernels by tolerance, never bit-exactly, where they use them;
//   - __CUDA_ARCH__ is not defined: device-only paths behind it are not compiled.
//
// How to write kernels that run in both
//   - launch through tern::cuda::launch (kernels/cuda/launch.h), never with <<<>>>;
//   - exchange data inside a warp only through the _sync intrinsics with exact masks, and meet at
//     __syncthreads with every live thread of the block;
//   - static shared memory: `__shared__ float buf[256];` as usual. Under the emulator __shared__ means
//     thread_local: a block's threads all run on one OS thread and an OS thread runs one block at a
//     time, so a block-scope thread_local is exactly per-block storage, and the source stays plain CUDA.
//     Its contents are undefined at block start, as on the device. Bounds: UBSan (-fsanitize=bounds,
//     part of the asan preset) checks indexing of these arrays; there are no red zones around them.
//   - dynamic shared memory: `T* buf = tern::cuda::dynamic_shared<T>();` instead of
//     `extern __shared__ T buf[];` (g++ cannot make the latter per-block); it is filled with 0xFF bytes
//     at every block start so that reading it before writing shows up as NaN / -1.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <source_location>
#include <stdexcept>
#include <string>
#include <type_traits>

#define TERN_CUDA_EMULATOR_ACTIVE 1

// Function and variable qualifiers: plain C++ under the emulator.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __constant__
#define __managed__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// See "static shared memory" above: block-scope thread_local implies static storage, one per OS thread.
#define __shared__ thread_local

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return {x, y, z}; }
};

// The built-in variables: set by the scheduler for the fiber it runs (threadIdx) and the block it runs.
// local-exec TLS (the emulator is linked into executables only): with the default initial-exec model,
// the linker rewrites the address computation into an lea that sets no flags, and UBSan's null-pointer
// check that GCC places after it then fires on a stale zero flag.
#define TERN_EMU_TLS __attribute__((tls_model("local-exec")))
extern thread_local uint3 threadIdx TERN_EMU_TLS;
extern thread_local uint3 blockIdx TERN_EMU_TLS;
extern thread_local dim3 blockDim TERN_EMU_TLS;
extern thread_local dim3 gridDim TERN_EMU_TLS;
inline constexpr int warpSize = 32;

typedef struct CUstream_st* cudaStream_t;

namespace cuda_emu {

// Undefined behaviour seen in a kernel (or a deadlock): the launch throws this after the grid stops.
struct Fault : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Number of OS threads that run blocks (default: OpenMP's maximum). Tests raise it above the core
// count to prove that atomics hold across threads.
void set_worker_threads(int n);
int worker_threads();

namespace detail {

enum class WarpOp : uint8_t {
    syncwarp,
    shfl_idx,
    shfl_up,
    shfl_down,
    shfl_xor,
    ballot,
    any,
    all,
    match_any,
    match_all,
    reduce_add,
    reduce_min_u,
    reduce_max_u,
    reduce_min_i,
    reduce_max_i,
};
enum class BarrierOp : uint8_t { sync, count, all, any };

// The per-warp rendezvous: blocks the calling lane until every lane of `mask` has arrived at the same
// kind of operation, then returns this lane's result. `arg` is the shuffle's lane / delta / xor mask or
// a match/reduce operand flag; `value` the lane's operand bits.
uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const std::source_location& where);
int block_barrier(BarrierOp op, int predicate, const std::source_location& where);
unsigned active_mask();
unsigned char* dynamic_shared_base(size_t* bytes);
[[noreturn]] void fault(const std::string& what, const std::source_location& where);
long long clock_counter();
// Programmatic dependent launch: the calling thread has waited for the grid before it (cudaGridDependencySynchronize);
// check_dependency_waited faults a thread of a programmatic launch that touches memory (`what`) before that.
void grid_dependency_wait(const std::source_location& where);
void check_dependency_waited(const char* what, const std::source_location& where);

template <typename T> uint64_t to_bits(const T& v) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "warp intrinsics take values of up to 8 bytes");
    uint64_t u = 0;
    __builtin_memcpy(&u, &v, sizeof(T));
    return u;
}
template <typename T> T from_bits(uint64_t u) {
    T v;
    __builtin_memcpy(&v, &u, sizeof(T));
    return v;
}

} // namespace detail

} // namespace cuda_emu

#include "cuda_emu/cuda_emu_host.h"

// ---- synchronisation ----------------------------------------------------------------------------------
inline void __syncthreads(const std::source_location& where = std::source_location::current()) {
    cuda_emu::detail::block_barrier(cuda_emu::detail::BarrierOp::sync, 0, where);
}
inline int __syncthreads_count(int pred, const std::source_location& where = std::source_location::current()) {
    return cuda_emu::detail::block_barrier(cuda_emu::detail::BarrierOp::count, pred != 0, where);
}
inline int __syncthreads_and(int pred, const std::source_location& where = std::source_location::current()) {
    return cuda_emu::detail::block_barrier(cuda_emu::detail::BarrierOp::all, pred != 0, where);
}
inline int __syncthreads_or(int pred, const std::source_location& where = std::source_location::current()) {
    return cuda_emu::detail::block_barrier(cuda_emu::detail::BarrierOp::any, pred != 0, where);
}
inline void __syncwarp(unsigned mask = 0xFFFFFFFFu,
                       const std::source_location& where = std::source_location::current()) {
    cuda_emu::detail::warp_op(cuda_emu::detail::WarpOp::syncwarp, mask, 0, 0, 32, where);
}
inline unsigned __activemask() { return cuda_emu::detail::active_mask(); }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
[[noreturn]] inline void __trap(const std::source_location& where = std::source_location::current()) {
    cuda_emu::detail::fault("__trap() called", where);
}
inline long long clock64() { return cuda_emu::detail::clock_counter(); }
inline void __nanosleep(unsigned) {}
// Programmatic dependent launch (griddepcontrol.wait / .launch_dependents, the device runtime's names): the
// launches here run one after another, so waiting is a mark the scheduler checks (see cuda_emu_host.h's launch)
// and the trigger does nothing.
inline void cudaGridDependencySynchronize(const std::source_location& where = std::source_location::current()) {
    cuda_emu::detail::grid_dependency_wait(where);
}
inline void cudaTriggerProgrammaticLaunchCompletion() {}

// ---- warp shuffles and votes --------------------------------------------------------------------------
template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
              const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return from_bits<T>(warp_op(WarpOp::shfl_idx, mask, to_bits(var), src_lane, width, where));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                 const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return from_bits<T>(warp_op(WarpOp::shfl_up, mask, to_bits(var), static_cast<int>(delta), width, where));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                   const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return from_bits<T>(warp_op(WarpOp::shfl_down, mask, to_bits(var), static_cast<int>(delta), width, where));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                  const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return from_bits<T>(warp_op(WarpOp::shfl_xor, mask, to_bits(var), lane_mask, width, where));
}
inline unsigned __ballot_sync(unsigned mask, int pred,
                              const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<unsigned>(warp_op(WarpOp::ballot, mask, pred != 0, 0, 32, where));
}
inline int __any_sync(unsigned mask, int pred, const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<int>(warp_op(WarpOp::any, mask, pred != 0, 0, 32, where));
}
inline int __all_sync(unsigned mask, int pred, const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<int>(warp_op(WarpOp::all, mask, pred != 0, 0, 32, where));
}
template <typename T>
unsigned __match_any_sync(unsigned mask, T value, const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<unsigned>(warp_op(WarpOp::match_any, mask, to_bits(value), 0, 32, where));
}
template <typename T>
unsigned __match_all_sync(unsigned mask, T value, int* pred,
                          const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    const uint64_t r = warp_op(WarpOp::match_all, mask, to_bits(value), 0, 32, where);
    *pred = r != 0;
    return static_cast<unsigned>(r);
}
inline unsigned __reduce_add_sync(unsigned mask, unsigned v,
                                  const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<unsigned>(warp_op(WarpOp::reduce_add, mask, v, 0, 32, where));
}
inline int __reduce_add_sync(unsigned mask, int v,
                             const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<int>(warp_op(WarpOp::reduce_add, mask, static_cast<unsigned>(v), 0, 32, where));
}
inline unsigned __reduce_min_sync(unsigned mask, unsigned v,
                                  const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<unsigned>(warp_op(WarpOp::reduce_min_u, mask, v, 0, 32, where));
}
inline unsigned __reduce_max_sync(unsigned mask, unsigned v,
                                  const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<unsigned>(warp_op(WarpOp::reduce_max_u, mask, v, 0, 32, where));
}
inline int __reduce_min_sync(unsigned mask, int v,
                             const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<int>(warp_op(WarpOp::reduce_min_i, mask, static_cast<uint32_t>(v), 0, 32, where));
}
inline int __reduce_max_sync(unsigned mask, int v,
                             const std::source_location& where = std::source_location::current()) {
    using namespace cuda_emu::detail;
    return static_cast<int>(warp_op(WarpOp::reduce_max_i, mask, static_cast<uint32_t>(v), 0, 32, where));
}

#include "cuda_emu/cuda_emu_atomics.h"
#include "cuda_emu/cuda_emu_math.h"
#include "cuda_emu/cuda_emu_types.h"
