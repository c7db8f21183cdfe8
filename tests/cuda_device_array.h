#pragma once
// Device memory for the test_cuda_* suites: an owned cudaMalloc'd array filled from and read back into
// std::vector, and the error measures the suites compare kernels with. Only the runtime API is used, so a
// suite runs against the emulator or, built without TERN_CUDA_EMULATOR, against a GPU.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/runtime.h"

namespace tern::test {

template <typename T> class DeviceArray {
public:
    explicit DeviceArray(size_t n) : n_(n) { REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p_), bytes()) == cudaSuccess); }
    explicit DeviceArray(const std::vector<T>& v) : DeviceArray(v.size()) { write(v); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    ~DeviceArray() { cudaFree(p_); }

    T* get() const { return p_; }
    size_t size() const { return n_; }
    void write(const std::vector<T>& v) {
        REQUIRE(v.size() == n_);
        REQUIRE(cudaMemcpy(p_, v.data(), bytes(), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    std::vector<T> read() const {
        std::vector<T> v(n_);
        REQUIRE(cudaMemcpy(v.data(), p_, bytes(), cudaMemcpyDeviceToHost) == cudaSuccess);
        return v;
    }

private:
    size_t bytes() const { return std::max<size_t>(n_, 1) * sizeof(T); }
    size_t n_;
    T* p_ = nullptr;
};

// max |got - want| / max |want| over [begin, end) (0 when both are all zeros).
inline double normalised_error(const std::vector<float>& got, const std::vector<float>& want, size_t begin = 0,
                               size_t end = SIZE_MAX) {
    end = std::min(end, want.size());
    double diff = 0.0, scale = 0.0;
    for (size_t i = begin; i < end; ++i) {
        diff = std::max(diff, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
        scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    return scale > 0.0 ? diff / scale : diff;
}

// Distance in units in the last place between two finite floats (0 for +0 / -0).
inline int64_t ulp_distance(float a, float b) {
    auto ordered = [](float f) {
        const auto bits = static_cast<int64_t>(__builtin_bit_cast(int32_t, f));
        return bits < 0 ? -(bits & 0x7FFFFFFF) : bits;
    };
    const int64_t d = ordered(a) - ordered(b);
    return d < 0 ? -d : d;
}

} // namespace tern::test
