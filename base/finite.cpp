#include "base/finite.h"

#include <cstddef>
#include <cstdint>
#include <limits>

namespace tern {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// The exact kinds, value by value: only for a row the fast pass found something wrong with (once, then
// generation stops), or a short tail.
FloatScan scan_slowly(const float* p, size_t n) {
    FloatScan s;
    for (size_t i = 0; i < n; ++i) {
        const float v = p[i];
        if (v != v)
            s.nan = true;
        else if (v == kInf)
            s.pos_inf = true;
        else if (v != -kInf)
            s.finite = true;
    }
    return s;
}

} // namespace

FloatScan scan_floats(std::span<const float> values) {
    // The fast pass: v * 0 is 0 for a finite v and NaN for NaN and both infinities, so lanes of such products
    // summed over the row stay 0 exactly when every value is finite; that vectorises as a plain sum does
    // (4 to 16 values per instruction) and a sound row costs no more. Any other row is examined value by
    // value: once, as generation then stops (or a row with masked -inf entries, which the backends' rows
    // never hold).
    constexpr size_t kLanes = 16;
    const float* p = values.data();
    const size_t n = values.size();
    const size_t whole = n / kLanes * kLanes;
    float lanes[kLanes] = {};
    for (size_t i = 0; i < whole; i += kLanes)
        for (size_t j = 0; j < kLanes; ++j)
            lanes[j] += p[i + j] * 0.0f;
    float sum = 0.0f;
    for (size_t j = 0; j < kLanes; ++j)
        sum += lanes[j];
    for (size_t i = whole; i < n; ++i)
        sum += p[i] * 0.0f;
    if (sum == 0.0f) return {false, false, n > 0};
    return scan_slowly(p, n);
}

} // namespace tern
