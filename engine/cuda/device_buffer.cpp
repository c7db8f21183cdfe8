#include "engine/cuda/device_buffer.h"

#include "base/error.h"

namespace tern {
inline namespace TERN_CUDA_ABI {

void cuda_call(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    throw RuntimeFailure(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

DeviceBuffer::DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
    if (bytes == 0) return;
    const cudaError_t e = cudaMalloc(&ptr_, bytes);
    if (e != cudaSuccess) {
        ptr_ = nullptr;
        bytes_ = 0;
        cudaGetLastError();   // an allocation failure is not sticky; clear it for later calls
        throw RuntimeFailure(std::string("cuda: cannot allocate ") + std::to_string(bytes >> 20) + " MiB of GPU memory for " +
                             what + ": " + cudaGetErrorString(e));
    }
}

void DeviceBuffer::reset() {
    if (ptr_) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
}

void* DeviceScratch::reserve(size_t bytes, const char* what) {
    if (bytes > buffer_.size()) {
        buffer_.reset();   // the old one goes first: both may not fit at once
        buffer_ = DeviceBuffer(bytes, what);
    }
    return buffer_.get();
}

} // namespace TERN_CUDA_ABI
} // namespace tern
