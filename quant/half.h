#pragma once
// f32 <-> f16 (IEEE binary16) and f32 <-> bf16 conversions, exact per ../shared/FORMATS.md §3:
//   f16 -> f32: exact, subnormals included, NaN payload kept.
//   f32 -> f16: round to nearest even, subnormal results kept, anything that rounds past 65504
//               becomes +-inf, NaN becomes sign|0x7E00.
//   bf16 -> f32: bits << 16.
//   f32 -> bf16: NaN -> (bits >> 16) | 0x40, otherwise round to nearest even on the upper half.
// Integer-only, so the results do not depend on the FPU's rounding mode, FTZ/DAZ or F16C.
// TERN_HOST_DEVICE lets the CUDA kernels call the same functions.
#include <cstdint>

#ifndef TERN_HOST_DEVICE
#if defined(__CUDACC__)
#define TERN_HOST_DEVICE __host__ __device__
#else
#define TERN_HOST_DEVICE
#endif
#endif

namespace tern {

TERN_HOST_DEVICE constexpr uint32_t f32_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
TERN_HOST_DEVICE constexpr float f32_from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

TERN_HOST_DEVICE constexpr float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) return f32_from_bits(sign | 0x7F800000u | (mant << 13));   // inf / NaN
    if (exp != 0) return f32_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));   // 112 = 127 - 15
    if (mant == 0) return f32_from_bits(sign);
    // Subnormal: mant * 2^-24. Normalise until the implicit bit (0x400) is set; each shift halves the
    // exponent, starting from the f32 exponent of 2^-14 (113 = 127 - 14).
    uint32_t e = 113;
    while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --e;
    }
    return f32_from_bits(sign | (e << 23) | ((mant & 0x3FFu) << 13));
}

TERN_HOST_DEVICE constexpr uint16_t f32_to_f16(float f) {
    const uint32_t bits = f32_bits(f);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    const uint32_t abs = bits & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u);   // NaN
    // 65520 (0x477FF000) is halfway between 65504 and 2^16; ties go to the even neighbour, which is
    // 2^16 = inf, so everything from 65520 up overflows.
    if (abs >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);
    if (abs < 0x38800000u) {   // below 2^-14: an f16 subnormal (or zero) in units of 2^-24
        const uint32_t e = abs >> 23;
        const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;   // value = m * 2^(e - 150)
        const uint32_t shift = 126u - e;                    // units of 2^-24: m * 2^(e - 126)
        if (shift > 24) return static_cast<uint16_t>(sign);   // < 0.5 units (also f32 zero/subnormal)
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) ++r;   // may carry into the smallest normal 0x0400
        return static_cast<uint16_t>(sign | r);
    }
    // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits; a carry out of the mantissa
    // correctly bumps the exponent.
    uint32_t r = (abs >> 13) - (112u << 10);
    const uint32_t rem = abs & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
}

TERN_HOST_DEVICE constexpr float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

TERN_HOST_DEVICE constexpr uint16_t f32_to_bf16(float f) {
    const uint32_t bits = f32_bits(f);
    if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);   // quiet NaN
    return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// Round-trip through f16: what a value becomes once stored as an f16 scale.
TERN_HOST_DEVICE constexpr float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

} // namespace tern
