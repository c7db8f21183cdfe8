#pragma once
// Device memory owned by one object: cudaMalloc at construction, cudaFree at destruction. Moves, never
// copies. A failed allocation throws RuntimeFailure naming what it was for and how much it wanted.
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "kernels/cuda/runtime.h"

namespace tern {
inline namespace TERN_CUDA_ABI {

// Throws RuntimeFailure "cuda: <what>: <runtime's description>" when e is not cudaSuccess (exit 3).
void cuda_call(cudaError_t e, const char* what);

class DeviceBuffer {
public:
    DeviceBuffer() = default;
    DeviceBuffer(size_t bytes, const char* what);
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            reset();
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
        }
        return *this;
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    void reset();
    size_t size() const { return bytes_; }
    void* get() const { return ptr_; }
    template <typename T> T* as() const { return static_cast<T*>(ptr_); }
    uint8_t* bytes() const { return static_cast<uint8_t*>(ptr_); }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
};

// A growable scratch buffer: keeps its allocation and replaces it only when a larger one is asked for.
class DeviceScratch {
public:
    float* floats(size_t n, const char* what) { return static_cast<float*>(reserve(n * sizeof(float), what)); }
    void* reserve(size_t bytes, const char* what);
    size_t size() const { return buffer_.size(); }
    void* data() const { return buffer_.get(); }

private:
    DeviceBuffer buffer_;
};

} // namespace TERN_CUDA_ABI
} // namespace tern
