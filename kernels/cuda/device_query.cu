// Device discovery for `--device auto` and `tern --version`. Never throws: a machine without a
// driver or a GPU is the normal case for a CPU user.
#include <cuda_runtime.h>

#include "kernels/gpu_info.h"

namespace tern {

bool cuda_compiled() { return true; }

std::vector<GpuInfo> list_cuda_devices(std::string* why_none) {
    std::vector<GpuInfo> out;
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        if (why_none) {
            *why_none = err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice
                            ? std::string("no usable CUDA driver or device (") + cudaGetErrorString(err) + ")"
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

} // namespace tern
