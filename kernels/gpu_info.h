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

// The device's measured copy bandwidth in GB/s: the best of several device-to-device copies of a large
// buffer, counting the bytes read and written (2 x size / time, the convention of CUDA's bandwidthTest
// and of the ceiling a decode step's weight reads are compared with). 0 when it cannot be measured;
// *method then says why, else how it was measured.
double measure_cuda_copy_gbps(int device, std::string* method);

} // namespace tern
