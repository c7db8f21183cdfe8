// The emulated CUDA runtime host API (cuda_emu_host.h).
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <vector>

#include "cuda_emu/cuda_emu.h"

struct CUstream_st {
    cudaGraph_t capturing = nullptr;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point when{};
    bool recorded = false;
    unsigned flags = 0;
};
struct CUgraph_st {
    std::vector<std::function<void()>> nodes;
    bool global_mode = false;   // captured in cudaStreamCaptureModeGlobal
};

namespace {
// Captures in cudaStreamCaptureModeGlobal now under way: while there is one, the runtime refuses the
// "potentially unsafe" calls, cudaMalloc and cudaFree among them. That is what catches a buffer freed (or
// moved) in the middle of a capture while captured launches still point into it: they would run at replay.
std::atomic<int> g_global_captures{0};
} // namespace
struct CUgraphExec_st {
    std::vector<std::function<void()>> nodes;
};

namespace cuda_emu {
namespace {

constexpr size_t kAlign = 256;   // cudaMalloc's alignment
constexpr size_t kDeviceBytes = size_t(16) << 30;

enum class Space : uint8_t { device, pinned };
struct Allocation {
    size_t bytes;
    Space space;
};

std::mutex g_mutex;
std::map<uintptr_t, Allocation> g_allocations;
size_t g_device_bytes = 0;
thread_local cudaError_t t_last_error = cudaSuccess;

// The allocation holding [p, p + bytes), or null.
const Allocation* find(const void* p, size_t bytes, uintptr_t* start = nullptr) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(p);
    auto it = g_allocations.upper_bound(a);
    if (it == g_allocations.begin()) return nullptr;
    --it;
    if (a < it->first || a + bytes > it->first + it->second.bytes) return nullptr;
    if (start) *start = it->first;
    return &it->second;
}

cudaError_t fail(cudaError_t e) { return emu_set_last_error(e); }

cudaError_t allocate(void** ptr, size_t bytes, Space space) {
    if (!ptr) return fail(cudaErrorInvalidValue);
    *ptr = nullptr;
    if (bytes == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(g_mutex);
    if (space == Space::device && g_device_bytes + bytes > kDeviceBytes) return fail(cudaErrorMemoryAllocation);
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (!p) return fail(cudaErrorMemoryAllocation);
    g_allocations[reinterpret_cast<uintptr_t>(p)] = Allocation{bytes, space};
    if (space == Space::device) g_device_bytes += bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t release(void* ptr, Space space) {
    if (!ptr) return cudaSuccess;
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_allocations.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_allocations.end() || it->second.space != space) return fail(cudaErrorInvalidValue);
    if (space == Space::device) g_device_bytes -= it->second.bytes;
    g_allocations.erase(it);
    std::free(ptr);
    return cudaSuccess;
}

bool is_device(const void* p, size_t bytes) {
    const Allocation* a = find(p, bytes);
    return a && a->space == Space::device;
}

// Checks a copy's pointers against the kind, as the runtime does for device pointers it knows, and the
// device side's range against its allocation (a copy past the end of a cudaMalloc is an error here).
cudaError_t check_copy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    if (!dst || !src) return cudaErrorInvalidValue;
    std::lock_guard<std::mutex> lock(g_mutex);
    const bool dst_dev = is_device(dst, bytes), src_dev = is_device(src, bytes);
    switch (kind) {
    case cudaMemcpyHostToHost: return cudaSuccess;
    case cudaMemcpyHostToDevice: return dst_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return dst_dev && src_dev ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

} // namespace

cudaError_t emu_set_last_error(cudaError_t e) {
    if (e != cudaSuccess) t_last_error = e;
    return e;
}

cudaError_t emu_record_launch(cudaStream_t stream, std::function<void()> op) {
    if (stream && stream->capturing) {
        stream->capturing->nodes.push_back(std::move(op));
        return cudaSuccess;
    }
    op();
    return cudaSuccess;
}

size_t device_bytes_in_use() {
    std::lock_guard<std::mutex> lock(g_mutex);
    return g_device_bytes;
}

} // namespace cuda_emu

using cuda_emu::emu_set_last_error;

const char* cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInsufficientDriver: return "cudaErrorInsufficientDriver";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorUnknown: return "cudaErrorUnknown";
    }
    return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorUnknown: return "unknown error";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError() {
    const cudaError_t e = cuda_emu::t_last_error;
    cuda_emu::t_last_error = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError() { return cuda_emu::t_last_error; }

cudaError_t cudaGetDeviceCount(int* count) {
    if (!count) return emu_set_last_error(cudaErrorInvalidValue);
    *count = 1;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int* device) {
    if (!device) return emu_set_last_error(cudaErrorInvalidValue);
    *device = 0;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : emu_set_last_error(cudaErrorInvalidDevice); }

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (!prop) return emu_set_last_error(cudaErrorInvalidValue);
    if (device != 0) return emu_set_last_error(cudaErrorInvalidDevice);
    *prop = cudaDeviceProp{};
    std::strncpy(prop->name, "tern CUDA emulator", sizeof prop->name - 1);
    prop->totalGlobalMem = cuda_emu::kDeviceBytes;
    prop->sharedMemPerBlock = 48 * 1024;
    prop->sharedMemPerBlockOptin = 227 * 1024;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = 1024, prop->maxThreadsDim[1] = 1024, prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = 0x7FFFFFFF, prop->maxGridSize[1] = 65535, prop->maxGridSize[2] = 65535;
    prop->major = 8, prop->minor = 9;
    prop->multiProcessorCount = cuda_emu::worker_threads();
    prop->memoryBusWidth = 256;
    prop->l2CacheSize = 32 << 20;
    prop->maxThreadsPerMultiProcessor = 1536;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaDeviceReset() { return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
    if (!free_bytes || !total_bytes) return emu_set_last_error(cudaErrorInvalidValue);
    *total_bytes = cuda_emu::kDeviceBytes;
    *free_bytes = cuda_emu::kDeviceBytes - cuda_emu::device_bytes_in_use();
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int* version) {
    if (!version) return emu_set_last_error(cudaErrorInvalidValue);
    *version = 13000;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) { return cudaDriverGetVersion(version); }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    if (g_global_captures.load() > 0) return emu_set_last_error(cudaErrorStreamCaptureUnsupported);
    return cuda_emu::allocate(ptr, bytes, cuda_emu::Space::device);
}
cudaError_t cudaFree(void* ptr) {
    if (g_global_captures.load() > 0) return emu_set_last_error(cudaErrorStreamCaptureUnsupported);
    return cuda_emu::release(ptr, cuda_emu::Space::device);
}
cudaError_t cudaMallocHost(void** ptr, size_t bytes) { return cuda_emu::allocate(ptr, bytes, cuda_emu::Space::pinned); }
cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned) { return cudaMallocHost(ptr, bytes); }
cudaError_t cudaFreeHost(void* ptr) { return cuda_emu::release(ptr, cuda_emu::Space::pinned); }

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
    const cudaError_t e = cuda_emu::check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess) return emu_set_last_error(e);
    if (bytes == 0) return cudaSuccess;
    return cuda_emu::emu_record_launch(stream, [dst, src, bytes] { std::memmove(dst, src, bytes); });
}
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
    if (bytes == 0) return cudaSuccess;
    {
        std::lock_guard<std::mutex> lock(cuda_emu::g_mutex);
        if (!cuda_emu::is_device(dst, bytes)) return emu_set_last_error(cudaErrorInvalidValue);
    }
    return cuda_emu::emu_record_launch(stream, [dst, value, bytes] { std::memset(dst, value, bytes); });
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) { return cudaMemsetAsync(dst, value, bytes, nullptr); }

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
    if (!stream) return emu_set_last_error(cudaErrorInvalidValue);
    *stream = new CUstream_st();
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned) { return cudaStreamCreate(stream); }
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    if (!stream) return emu_set_last_error(cudaErrorInvalidResourceHandle);
    if (stream->capturing && stream->capturing->global_mode) --g_global_captures;
    delete stream->capturing;
    delete stream;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    if (stream && stream->capturing) return emu_set_last_error(cudaErrorStreamCaptureUnsupported);
    return cudaSuccess;
}
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t event, unsigned) {
    return event ? cudaSuccess : emu_set_last_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
    if (!event) return emu_set_last_error(cudaErrorInvalidValue);
    *event = new CUevent_st();
    (*event)->flags = flags;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
    if (!event) return emu_set_last_error(cudaErrorInvalidResourceHandle);
    delete event;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    if (!event) return emu_set_last_error(cudaErrorInvalidResourceHandle);
    return cuda_emu::emu_record_launch(stream, [event] {
        event->when = std::chrono::steady_clock::now();
        event->recorded = true;
    });
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    return event ? cudaSuccess : emu_set_last_error(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
    return event ? cudaSuccess : emu_set_last_error(cudaErrorInvalidResourceHandle);
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
    if (!ms || !start || !end) return emu_set_last_error(cudaErrorInvalidValue);
    if ((start->flags | end->flags) & cudaEventDisableTiming) return emu_set_last_error(cudaErrorInvalidResourceHandle);
    if (!start->recorded || !end->recorded) return emu_set_last_error(cudaErrorInvalidResourceHandle);
    *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) {
    // The legacy default stream cannot be captured, as on the device.
    if (!stream || stream->capturing) return emu_set_last_error(cudaErrorStreamCaptureUnsupported);
    stream->capturing = new CUgraph_st();
    stream->capturing->global_mode = mode == cudaStreamCaptureModeGlobal;
    if (stream->capturing->global_mode) ++g_global_captures;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
    if (!stream || !graph) return emu_set_last_error(cudaErrorInvalidValue);
    if (!stream->capturing) return emu_set_last_error(cudaErrorStreamCaptureInvalidated);
    *graph = stream->capturing;
    if (stream->capturing->global_mode) --g_global_captures;
    stream->capturing = nullptr;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
    if (!status) return emu_set_last_error(cudaErrorInvalidValue);
    *status = stream && stream->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
    if (!exec || !graph) return emu_set_last_error(cudaErrorInvalidValue);
    *exec = new CUgraphExec_st{graph->nodes};
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
    if (!exec) return emu_set_last_error(cudaErrorInvalidResourceHandle);
    for (const auto& node : exec->nodes) {
        const cudaError_t e = cuda_emu::emu_record_launch(stream, node);
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    delete exec;
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    delete graph;
    return cudaSuccess;
}
