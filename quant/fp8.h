#pragma once
// FP8 E4M3 ("e4m3fn"): 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits; no infinities,
// 0x7F / 0xFF are NaN, the largest finite value is 1.75 * 2^8 = 448, subnormals are m * 2^-9.
// The encoder rounds to nearest even and saturates finite and infinite inputs to +-448, which is
// what tern's F8_E4M3 weight format (models.md) stores. Every NaN encodes as 0x7F: a NaN's sign is
// not data (x86 makes inf * 0 a negative NaN, an NVIDIA GPU a positive one), and 0x7F is what the
// GPU's own conversion gives. Integer-only and constexpr, so host and CUDA code (TERN_HOST_DEVICE)
// give identical bytes.
#include <cstdint>

#include "quant/half.h"

namespace tern {

inline constexpr float E4M3_MAX = 448.0f;

TERN_HOST_DEVICE constexpr float e4m3_to_f32(uint8_t q) {
    const uint32_t sign = static_cast<uint32_t>(q & 0x80u) << 24;
    const uint32_t exp = (q >> 3) & 0xFu;
    uint32_t mant = q & 0x7u;
    if ((q & 0x7Fu) == 0x7Fu) return f32_from_bits(sign | 0x7FC00000u);   // NaN
    if (exp != 0) return f32_from_bits(sign | ((exp + 120u) << 23) | (mant << 20));   // 120 = 127 - 7
    if (mant == 0) return f32_from_bits(sign);
    // Subnormal m * 2^-9: normalise from the exponent of 2^-6 (121 = 127 - 6).
    uint32_t e = 121;
    while ((mant & 0x8u) == 0) {
        mant <<= 1;
        --e;
    }
    return f32_from_bits(sign | (e << 23) | ((mant & 0x7u) << 20));
}

TERN_HOST_DEVICE constexpr uint8_t f32_to_e4m3(float f) {
    const uint32_t bits = f32_bits(f);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t abs = bits & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return 0x7Fu;   // NaN, whatever its sign
    if (abs >= 0x43E00000u) return static_cast<uint8_t>(sign | 0x7Eu);   // >= 448 (inf included): saturate
    if (abs < 0x3C800000u) {   // below 2^-6: subnormal (or zero) in units of 2^-9
        const uint32_t e = abs >> 23;
        const uint32_t m = (abs & 0x7FFFFFu) | 0x800000u;   // value = m * 2^(e - 150)
        const uint32_t shift = 141u - e;                    // units of 2^-9: m * 2^(e - 141)
        if (shift > 24) return static_cast<uint8_t>(sign);   // < 0.5 units
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u);
        const uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) ++r;   // may carry into the smallest normal 0x08
        return static_cast<uint8_t>(sign | r);
    }
    // Normal: rebias (127 -> 7) and drop 20 mantissa bits. Values in (448, 464) would round down to
    // 448 and values from 464 up would round to the NaN code, so both were saturated above.
    uint32_t r = (abs >> 20) - (120u << 3);
    const uint32_t rem = abs & 0xFFFFFu;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
    return static_cast<uint8_t>(sign | r);
}

// A 256-entry decode table, for host code that dequantizes many values (kernels/cpu).
const float* e4m3_table();

// F8_E4M3 block encoders (quant/reference.cpp; models.md "F8_E4M3"). `full` is the weight quantizer
// (quantize_row / quantize_block): 64 block scales per octave plus a least-squares step, 1.79% RMS
// error on gaussian data. `fast` tries 16 scales, no least-squares step (1.95%), at a quarter of the
// cost: for the f8_e4m3 KV cache, which encodes every new token's K and V rows (the full search would
// add about 4x the old encoding time to every decode step and prefill).
struct BlockF8_E4M3;
enum class F8Search : uint8_t { fast, full };
void quantize_block_f8_e4m3(const float* x, BlockF8_E4M3& b, F8Search search);
// n (a multiple of 32) values to n / 32 blocks with the fast search.
void quantize_row_f8_e4m3_fast(const float* src, void* dst, int64_t n);

} // namespace tern
