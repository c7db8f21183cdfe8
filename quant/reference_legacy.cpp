// Legacy 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (FORMATS.md §3.1, §4.1).
// Quantizers use the unrounded d and min; only the stored copies are rounded to f16.
#include <algorithm>
#include <cmath>

#include "quant/reference_blocks.h"
#include "quant/reference_math.h"

namespace tern {

using detail::signed_max;

// ---- dequantize ---------------------------------------------------------------------------------

void dequantize_block(const BlockQ4_0& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
        y[j] = static_cast<float>((b.qs[j] & 15) - 8) * d;
        y[j + QK4_0 / 2] = static_cast<float>((b.qs[j] >> 4) - 8) * d;
    }
}

void dequantize_block(const BlockQ4_1& b, float* y) {
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
        y[j] = static_cast<float>(b.qs[j] & 15) * d + m;
        y[j + QK4_1 / 2] = static_cast<float>(b.qs[j] >> 4) * d + m;
    }
}

namespace {
uint32_t load_u32_le(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
           static_cast<uint32_t>(p[3]) << 24;
}
void store_u32_le(uint8_t* p, uint32_t v) {
    for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
} // namespace

void dequantize_block(const BlockQ5_0& b, float* y) {
    const float d = f16_to_f32(b.d);
    const uint32_t qh = load_u32_le(b.qh);
    for (int j = 0; j < QK5_0 / 2; ++j) {
        const int lo = (b.qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
        const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
        y[j] = static_cast<float>(lo - 16) * d;
        y[j + QK5_0 / 2] = static_cast<float>(hi - 16) * d;
    }
}

void dequantize_block(const BlockQ5_1& b, float* y) {
    const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
    const uint32_t qh = load_u32_le(b.qh);
    for (int j = 0; j < QK5_1 / 2; ++j) {
        const int lo = (b.qs[j] & 15) | static_cast<int>(((qh >> j) & 1u) << 4);
        const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
        y[j] = static_cast<float>(lo) * d + m;
        y[j + QK5_1 / 2] = static_cast<float>(hi) * d + m;
    }
}

void dequantize_block(const BlockQ8_0& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

void dequantize_block(const BlockQ8_1& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < QK8_1; ++j) y[j] = static_cast<float>(b.qs[j]) * d;
}

// ---- quantize -----------------------------------------------------------------------------------

void quantize_block(const float* x, BlockQ4_0& b) {
    const float max = signed_max(x, QK4_0);
    const float d = max / -8.0f;   // the signed max maps to code 0 (-8); an all-zero block gives d = -0
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
        // trunc(x * id + 8.5) is round-half-up of x * id, offset by 8; 15 caps the +8 side.
        const int q0 = std::min(15, static_cast<int>(x[j] * id + 8.5f));
        const int q1 = std::min(15, static_cast<int>(x[j + QK4_0 / 2] * id + 8.5f));
        b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
}

void quantize_block(const float* x, BlockQ4_1& b) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK4_1; ++j) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    const float d = (mx - mn) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(mn);
    for (int j = 0; j < QK4_1 / 2; ++j) {
        const int q0 = std::min(15, static_cast<int>((x[j] - mn) * id + 0.5f));
        const int q1 = std::min(15, static_cast<int>((x[j + QK4_1 / 2] - mn) * id + 0.5f));
        b.qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
}

void quantize_block(const float* x, BlockQ5_0& b) {
    const float max = signed_max(x, QK5_0);
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_0 / 2; ++j) {
        const int q0 = std::min(31, static_cast<int>(x[j] * id + 16.5f));
        const int q1 = std::min(31, static_cast<int>(x[j + QK5_0 / 2] * id + 16.5f));
        b.qs[j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
        qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
        qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_0 / 2);
    }
    store_u32_le(b.qh, qh);
}

void quantize_block(const float* x, BlockQ5_1& b) {
    float mn = x[0], mx = x[0];
    for (int j = 1; j < QK5_1; ++j) {
        if (x[j] < mn) mn = x[j];
        if (x[j] > mx) mx = x[j];
    }
    const float d = (mx - mn) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.d = f32_to_f16(d);
    b.m = f32_to_f16(mn);
    uint32_t qh = 0;
    for (int j = 0; j < QK5_1 / 2; ++j) {
        // No clamp: (x - mn) * id <= 31 * (1 + 2^-23)^2 stays below 31.5, so trunc(+0.5) <= 31.
        const int q0 = static_cast<int>((x[j] - mn) * id + 0.5f);
        const int q1 = static_cast<int>((x[j + QK5_1 / 2] - mn) * id + 0.5f);
        b.qs[j] = static_cast<uint8_t>((q0 & 15) | ((q1 & 15) << 4));
        qh |= static_cast<uint32_t>((q0 >> 4) & 1) << j;
        qh |= static_cast<uint32_t>((q1 >> 4) & 1) << (j + QK5_1 / 2);
    }
    store_u32_le(b.qh, qh);
}

namespace {
// Shared by Q8_0 and Q8_1: returns the unrounded d. roundf = ties away from zero (FORMATS.md §4.1).
float quantize_q8(const float* x, int8_t* qs) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < QK8_0; ++j) qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
    return d;
}
} // namespace

void quantize_block(const float* x, BlockQ8_0& b) { b.d = f32_to_f16(quantize_q8(x, b.qs)); }

void quantize_block(const float* x, BlockQ8_1& b) {
    const float d = quantize_q8(x, b.qs);
    int sum = 0;
    for (int j = 0; j < QK8_1; ++j) sum += b.qs[j];
    b.d = f32_to_f16(d);
    b.s = f32_to_f16(static_cast<float>(sum) * d);
}

} // namespace tern
