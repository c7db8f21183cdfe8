// Device discovery for `--device auto` and `tern --version`. Never throws: a machine without a
// driver or a GPU is the normal case for a CPU user.
#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/gpu_info.h"

namespace tern {

bool cuda_compiled() { return true; }

std::vector<GpuInfo> list_cuda_devices(std::string* why_none) {
    std::vector<GpuInfo> out;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        if (why_none) {
            // The runtime words a missing driver as an old one; say both.
            *why_none = err == cudaErrorInsufficientDriver
                            ? std::string("no usable CUDA driver (none installed, or one older than the CUDA ") +
                                  std::to_string(CUDART_VERSION / 1000) + " runtime tern was built with)"
                        : err == cudaErrorNoDevice ? std::string("no CUDA GPU found")
                                                   : std::string("CUDA runtime error: ") + cudaGetErrorString(err);
        }
        cudaGetLastError();   // clear the sticky error so later calls start clean
        return out;
    }
    for (int i = 0; i < count; ++i) {
        cudaDeviceProp prop{};
        if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
        GpuInfo g;
        g.index = i;
        g.name = prop.name;
        g.sm_major = prop.major;
        g.sm_minor = prop.minor;
        g.total_bytes = prop.totalGlobalMem;
        size_t free_b = 0, total_b = 0;
        if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) g.free_bytes = free_b;
        out.push_back(g);
    }
    if (out.empty() && why_none) *why_none = "no CUDA device found";
    return out;
}

double measure_cuda_copy_gbps(int device, std::string* method) {
    auto fail = [&](const char* what, cudaError_t e) {
        if (method) *method = std::string(what) + ": " + cudaGetErrorString(e);
        cudaGetLastError();
        return 0.0;
    };
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return fail("cudaSetDevice", e);
    // 1 GiB halves, or a quarter of the free memory on small devices.
    size_t free_b = 0, total_b = 0;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) return fail("cudaMemGetInfo", e);
    const size_t bytes = std::min<size_t>(size_t(1) << 30, free_b / 4) & ~size_t(4095);
    void *a = nullptr, *b = nullptr;
    if ((e = cudaMalloc(&a, bytes)) != cudaSuccess) return fail("cudaMalloc", e);
    if ((e = cudaMalloc(&b, bytes)) != cudaSuccess) {
        cudaFree(a);
        return fail("cudaMalloc", e);
    }
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaMemset(a, 1, bytes);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);   // warm-up
    float best_ms = 0.0f;
    for (int i = 0; i < 8; ++i) {
        cudaEventRecord(start);
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(stop);
        cudaEventSynchronize(stop);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, start, stop);
        if (ms > 0.0f && (best_ms == 0.0f || ms < best_ms)) best_ms = ms;
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    if ((e = cudaGetLastError()) != cudaSuccess || best_ms == 0.0f) return fail("copy", e);
    if (method)
        *method = "best of 8 device-to-device copies of " + std::to_string(bytes >> 20) + " MiB, read + write bytes";
    return 2.0 * static_cast<double>(bytes) / (best_ms * 1e-3) / 1e9;
}

} // namespace tern
