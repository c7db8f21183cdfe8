#pragma once
// Weights for the decode matmul suites (test_cuda_matmul, test_cuda_matmul_q8, test_cuda_gemm_q8,
// test_cuda_fused): the formats each matmul reads, quantized gaussian rows, rows of random or extreme codes
// and their reference dequantization; and the guarded output buffer the suites launch into.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/cuda_device_array.h"
#include "tests/kernel_test_data.h"

namespace tern::test {

// Every format matmul, matmul_outputs, matmul_glu and embed_rows read (kernels/cuda/matmul.h). The order
// sets the seeds the suites hand out.
inline constexpr GgmlType kMatmulFormats[] = {
    GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0,   GgmlType::Q4_1,   GgmlType::Q5_0,
    GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,   GgmlType::Q5_K,
    GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::F8_E4M3, GgmlType::MXFP4};

// Every format the integer-dot matmuls read (kernels/cuda/matmul_q8.h, gemm_q8.h).
inline constexpr GgmlType kMatmulQ8Formats[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,
                                                GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,
                                                GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                                                GgmlType::MXFP4};

// The float formats, which alone allow rows of any length.
inline bool is_plain(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// n_rows rows of n elements: quantize_row of gaussian values, each row with its own scale (0.01 .. 10) so
// rows of very different magnitude meet in one matrix.
inline std::vector<uint8_t> quantized_normal(GgmlType type, int64_t n_rows, int64_t n, uint32_t seed) {
    std::vector<float> src = random_normal(static_cast<size_t>(n_rows * n), seed);
    std::mt19937 rng(seed ^ 0x5EEDu);
    std::uniform_real_distribution<float> log_scale(-2.0f, 1.0f);
    for (int64_t r = 0; r < n_rows; ++r) {
        const float s = std::pow(10.0f, log_scale(rng));
        for (int64_t i = 0; i < n; ++i) src[static_cast<size_t>(r * n + i)] *= s;
    }
    std::vector<uint8_t> out(row_bytes(type, n) * static_cast<size_t>(n_rows));
    quantize_row(type, src.data(), out.data(), n_rows * n);
    return out;
}

// Offsets of the f16 fields that scale a block (d, and m / dmin where the format has one) of a block format.
inline std::vector<size_t> scale_fields(GgmlType type) {
    switch (type) {
    case GgmlType::Q4_1: return {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)};
    case GgmlType::Q5_1: return {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)};
    case GgmlType::Q2_K: return {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)};
    case GgmlType::Q3_K: return {offsetof(BlockQ3_K, d)};
    case GgmlType::Q4_K: return {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)};
    case GgmlType::Q5_K: return {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)};
    case GgmlType::Q6_K: return {offsetof(BlockQ6_K, d)};
    case GgmlType::MXFP4: return {};   // a byte exponent, not an f16: random_codes and filled_codes set it
    default: return {0};   // Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS, F8_E4M3: d leads the block
    }
}

// Random bit patterns for every code, scale and min field, with the f16 scale fields (d, m, dmin) set to
// finite values of either sign in [2^-12, 2^-4): codes the quantizers rarely or never write (Q4_K's high
// scale bits, Q6_K's scale -128, e4m3 subnormals) get dequantized too. e4m3 NaN codes (0x7F, 0xFF) become
// 0x7E, 0xFE; plain formats get random finite values (subnormals included).
inline std::vector<uint8_t> random_codes(GgmlType type, int64_t n_rows, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> out(row_bytes(type, n) * static_cast<size_t>(n_rows));
    for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
    switch (type) {
    case GgmlType::F32:
        for (size_t i = 0; i < out.size(); i += 4)
            while ((out[i + 3] & 0x7F) == 0x7F && (out[i + 2] & 0x80)) out[i + 3] = static_cast<uint8_t>(rng());
        return out;
    case GgmlType::F16:
        for (size_t i = 0; i < out.size(); i += 2)
            while ((out[i + 1] & 0x7C) == 0x7C) out[i + 1] = static_cast<uint8_t>(rng());
        return out;
    case GgmlType::BF16:
        for (size_t i = 0; i < out.size(); i += 2)
            while ((out[i + 1] & 0x7F) == 0x7F && (out[i] & 0x80)) out[i + 1] = static_cast<uint8_t>(rng());
        return out;
    default: break;
    }
    std::uniform_real_distribution<float> log2_mag(-12.0f, -4.0f);
    const std::vector<size_t> fields = scale_fields(type);
    const size_t bb = block_bytes(type);
    for (size_t b = 0; b < out.size(); b += bb) {
        for (size_t f : fields) {
            const uint16_t h = f32_to_f16(std::exp2(log2_mag(rng)) * ((rng() & 1) ? -1.0f : 1.0f));
            std::memcpy(&out[b + f], &h, 2);
        }
        // MXFP4: exponents 2^-12 .. 2^2 (e = 115 .. 129) keep products and sums far from f32's range.
        if (type == GgmlType::MXFP4) out[b + offsetof(BlockMXFP4, e)] = static_cast<uint8_t>(115 + rng() % 15);
        if (type == GgmlType::F8_E4M3)
            for (size_t i = offsetof(BlockF8_E4M3, qs); i < bb; ++i)
                if ((out[b + i] & 0x7F) == 0x7F) out[b + i] = static_cast<uint8_t>(out[b + i] - 1);
    }
    return out;
}

// Every byte `fill`, the f16 scale fields +-2^-8 (the sign alternating by row, so that a row's blocks add up
// rather than cancel): codes and scales at the ends of their ranges, the largest integer dot products there
// are (Q6_K: sc = -128 with q - 32 = -32 reaches 2^23 per unit, near 2^24 per block).
inline std::vector<uint8_t> filled_codes(GgmlType type, int64_t n_rows, int64_t n, uint8_t fill) {
    const size_t rb = row_bytes(type, n), bb = block_bytes(type);
    std::vector<uint8_t> out(rb * static_cast<size_t>(n_rows), fill);
    for (size_t b = 0; b < out.size(); b += bb) {
        // MXFP4's exponent: 2^-8 times 2^(e - 127) for the row's parity, like the f16 scales (no sign bit here).
        if (type == GgmlType::MXFP4) out[b + offsetof(BlockMXFP4, e)] = static_cast<uint8_t>((b / rb) % 2 ? 118 : 120);
        for (size_t f : scale_fields(type)) {
            const uint16_t h = f32_to_f16((b / rb) % 2 ? -0x1p-8f : 0x1p-8f);
            std::memcpy(&out[b + f], &h, 2);
        }
    }
    return out;
}

// The reference dequantization (quant/reference.h) of n_rows rows of n elements.
inline std::vector<float> dequantize(GgmlType type, const std::vector<uint8_t>& w, int64_t n_rows, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n_rows * n));
    dequantize_row(type, w.data(), out.data(), n_rows * n);
    return out;
}

// The n floats one launch writes into a fresh device buffer y (launch(y) runs it): y starts as NaN (every
// output must be written) followed by a guard of sentinels no launch may touch, which must come back intact.
template <class Launch> std::vector<float> guarded_output(int64_t n, Launch&& launch) {
    constexpr int64_t kGuard = 16;
    std::vector<float> init(static_cast<size_t>(n + kGuard), NAN);
    for (int64_t i = 0; i < kGuard; ++i) init[static_cast<size_t>(n + i)] = 1234.5f;
    DeviceArray<float> dy(init);
    launch(dy.get());
    std::vector<float> y = dy.read();
    for (int64_t i = 0; i < kGuard; ++i) REQUIRE(y[static_cast<size_t>(n + i)] == 1234.5f);
    y.resize(static_cast<size_t>(n));
    return y;
}

} // namespace tern::test
