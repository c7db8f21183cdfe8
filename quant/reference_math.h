#pragma once
// Rounding helpers shared by the reference quantizers (internal to quant/). FORMATS.md §0: every
// operation is one binary32 operation; these files build with -ffp-contract=off (root CMakeLists).
#include <cmath>
#include <cstdint>

#include "quant/half.h"

namespace tern::detail {

// rint with ties to even, the way the GGUF quantizers do it: adding 1.5 * 2^23 leaves the integer
// in the low mantissa bits (the FPU's round-to-nearest-even does the rounding). Valid for |v| < 2^22,
// which every caller guarantees (codes are at most 127 in magnitude after clamping the search range).
inline int nearest_int(float v) {
    const float t = v + 12582912.0f;
    return static_cast<int>(f32_bits(t) & 0x007FFFFFu) - 0x00400000;
}

// The first element with the largest |x| ("signed max", FORMATS.md §0); +0 for an all-zero block.
inline float signed_max(const float* x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    return max;
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

} // namespace tern::detail
