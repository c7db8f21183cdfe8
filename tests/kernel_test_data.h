#pragma once
// Test data shared by the CPU kernel suites: the weight formats that have dot kernels, and random
// activations (gaussian, never zeros, so a kernel that drops a term cannot pass by accident).
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "quant/types.h"

namespace tern::test {

// Every weight format with a CPU dot kernel (kernels/cpu/dot.h), in the dispatch table's order.
inline constexpr GgmlType kDotWeightTypes[] = {
    GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,   GgmlType::Q8_0,    GgmlType::Q2_K,
    GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,   GgmlType::Q6_K,   GgmlType::IQ4_NL,  GgmlType::IQ4_XS,
    GgmlType::F8_E4M3, GgmlType::MXFP4, GgmlType::F16, GgmlType::BF16, GgmlType::F32};

// n values from N(0, scale^2), reproducible from `seed`.
inline std::vector<float> random_normal(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v)
        x = dist(rng);
    return v;
}

} // namespace tern::test
