#include "kernels/gpu_info.h"

namespace tern {

bool cuda_compiled() { return false; }

std::vector<GpuInfo> list_cuda_devices(std::string* why_none) {
    if (why_none) *why_none = "this tern was built without CUDA (no nvcc at build time; rebuild with -DTERN_CUDA=ON)";
    return {};
}

double measure_cuda_copy_gbps(int, std::string* method) {
    if (method) *method = "tern was built without CUDA";
    return 0.0;
}

} // namespace tern
