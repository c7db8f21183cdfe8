#pragma once
// Whether floats are finite, the tests every check of values shares:
// - first_non_finite: where a row stops being finite (the small tensors checked when a model loads,
//   `tern info --check` over every tensor). Bit tests, not std::isfinite, so the answer holds under any
//   floating-point flags, and a branch-free pass over each chunk, which compilers vectorize: a row of
//   finite values costs about as much as reading it once.
// - scan_floats: what a logit row holds (NaN, +inf, anything finite; -inf, a masked logit, is none of
//   these). A row of a 262144-token vocabulary is scanned every decode step (engine/logit_guard.h), so a
//   sound row costs one vectorised pass, as long as a plain sum of it (about 70 us for 262144 floats on one
//   core of a 2-core Xeon). IEEE semantics are required: not for a file built with -ffast-math.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>

namespace tern {

// True for NaN and +-inf: every exponent bit set.
inline bool is_non_finite_bits(uint32_t bits) {
    return (bits & 0x7F800000u) == 0x7F800000u;
}

// The index of the first NaN or +-inf in `values`, or -1 when every value is finite.
inline int64_t first_non_finite(std::span<const float> values) {
    constexpr size_t kChunk = 256;
    const size_t n = values.size();
    for (size_t begin = 0; begin < n; begin += kChunk) {
        const size_t end = begin + kChunk < n ? begin + kChunk : n;
        uint32_t any = 0;
        for (size_t i = begin; i < end; ++i) {
            uint32_t bits;
            std::memcpy(&bits, &values[i], sizeof bits);
            any |= static_cast<uint32_t>(is_non_finite_bits(bits));
        }
        if (!any) continue;
        for (size_t i = begin; i < end; ++i) {
            uint32_t bits;
            std::memcpy(&bits, &values[i], sizeof bits);
            if (is_non_finite_bits(bits)) return static_cast<int64_t>(i);
        }
    }
    return -1;
}

struct FloatScan {
    bool nan = false;
    bool pos_inf = false;
    bool finite = false; // at least one finite value
};

FloatScan scan_floats(std::span<const float> values);

// "nan", "inf", "-inf" or the number (%g): a float as error lines show it.
inline std::string float_text(float v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
    return buf;
}

} // namespace tern
