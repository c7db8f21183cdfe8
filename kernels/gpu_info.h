#pragma once
// Which CUDA devices can be used, and why none can when none can. Implemented in
// kernels/cuda/device_query.cu when tern is built with CUDA, in gpu_info_none.cpp otherwise.
#include <cstddef>
#include <string>
#include <vector>

namespace tern {

struct GpuInfo {
    int index = 0;
    std::string name;
    int sm_major = 0, sm_minor = 0;
    size_t total_bytes = 0, free_bytes = 0;
};

bool cuda_compiled();
// Empty when no device is usable; then *why_none says why (no driver, no device, ...).
std::vector<GpuInfo> list_cuda_devices(std::string* why_none);

} // namespace tern
