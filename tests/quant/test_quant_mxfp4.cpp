// MXFP4 (GGUF id 39): the block layout, the E8M0 half scale, and the quantizer byte for byte against blocks
// llama.cpp's quantize_row_mxfp4_ref wrote for the inputs below (its libggml-base, linked into a small
// program that quantized these ten blocks).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/blocks.h"
#include "quant/reference.h"
#include "quant/reference_blocks.h"
#include "quant/types.h"

using namespace tern;

namespace {

// Block b's 32 inputs: integers times exactly representable steps, so every platform computes the same floats.
// They cover codes with ties (1, 9), an all-zero block (2), large and tiny magnitudes (3, 4, 8), a largest
// magnitude one ulp below a power of two (5), negative-dominated data (6) and a lone subnormal (7), whose
// exponent falls below E8M0's range.
float input(int b, int i) {
    switch (b) {
    case 0: return static_cast<float>((i * 37) % 61 - 30) * 0.173f;
    case 1: return static_cast<float>((i * 13) % 29 - 14) * 0.0625f;
    case 2: return 0.0f;
    case 3: return static_cast<float>(i - 16) * 1000.5f;
    case 4: return static_cast<float>(i - 15) * 1e-30f;
    case 5: return i == 0 ? f32_from_bits(0x407FFFFFu) : static_cast<float>(i % 7 - 3) * 0.5f;
    case 6: return -static_cast<float>((i * i) % 17) * 0.37f;
    case 7: return i == 3 ? 1e-40f : 0.0f;
    case 8: return static_cast<float>((i * 5) % 11 - 5) * 3.0e37f;
    default: return static_cast<float>(i % 9 - 4) * 0.75f;
    }
}

// quantize_row_mxfp4_ref's output for input(b, .), b = 0..9 (e byte, then the 16 code bytes).
const char* const kLlamaBlocks[] = {
    "7f4fc26d15e95eb36d16d95ea47c26d05e", "7cef49f71c76ad75ce63ef40f72bf69d75", "0000000000000000000000000000000000",
    "8a0f1f2f3f4f4f5e5e6e6d6d7c7c7b7a79", "1d1e1e2e3e3d4d4d5d5c5c5b6b6a696970", "7ea70c2a4052d4c5ad0c2a4052d4c5ad0c",
    "7f90099bbddffdd99ffeeeeff99ddffddb", "f800000000000000000000000000000000", "fbdf60e75bf73df60e75bf73df60e75bf7",
    "7e6f7efdebd0b30536576f7efdebd0b305",
};

std::string to_hex(const void* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
        const uint8_t v = static_cast<const uint8_t*>(p)[i];
        s += digits[v >> 4];
        s += digits[v & 15];
    }
    return s;
}

} // namespace

TEST_CASE("mxfp4: the format table and the block layout") {
    const TypeInfo* ti = find_type(39);
    REQUIRE(ti != nullptr);
    CHECK(ti->type == GgmlType::MXFP4);
    CHECK(ti->name == "mxfp4");
    CHECK(ti->block_elems == 32);
    CHECK(ti->block_bytes == 17);
    CHECK(type_from_name("MXFP4") == GgmlType::MXFP4);
    CHECK(bits_per_weight(GgmlType::MXFP4) == 4.25);
    CHECK(offsetof(BlockMXFP4, qs) == 1);
}

TEST_CASE("mxfp4: E8M0 half scale is 2^(e - 128), subnormal at e = 0 and 1") {
    CHECK(mxfp4_scale_half(0) == std::ldexp(1.0f, -128));
    CHECK(mxfp4_scale_half(1) == std::ldexp(1.0f, -127));
    CHECK(mxfp4_scale_half(2) == std::ldexp(1.0f, -126));
    CHECK(mxfp4_scale_half(127) == 0.5f);
    CHECK(mxfp4_scale_half(128) == 1.0f);
    CHECK(mxfp4_scale_half(131) == 8.0f);
    CHECK(mxfp4_scale_half(254) == std::ldexp(1.0f, 126));
    for (int e = 0; e < 255; ++e) CHECK(mxfp4_scale_half(static_cast<uint8_t>(e)) == std::ldexp(1.0f, e - 128));
}

TEST_CASE("mxfp4: dequantize a hand-built block") {
    BlockMXFP4 b;
    b.e = 130;   // half scale 4: codes 0..7 -> 0, 2, 4, 6, 8, 12, 16, 24 (E2M1 0, 0.5, ... 6 times 2^(130-127) = 8)
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float y[QK_MXFP4];
    dequantize_block(b, y);
    const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    for (int j = 0; j < 16; ++j) {
        const float lo = (j < 8 ? 1.0f : -1.0f) * e2m1[j % 8] * 8.0f;
        const float hi = (15 - j < 8 ? 1.0f : -1.0f) * e2m1[(15 - j) % 8] * 8.0f;
        CHECK(y[j] == lo);
        CHECK(y[j + 16] == hi);
    }
    CHECK(y[7] == 48.0f);
    CHECK(y[16] == -48.0f);
    CHECK(std::signbit(y[8]) == false);   // code 8 (-0) reads as +0, as the doubled code book stores it
}

TEST_CASE("mxfp4: quantize_row is byte-identical to llama.cpp's reference quantizer") {
    constexpr int kBlocks = sizeof kLlamaBlocks / sizeof kLlamaBlocks[0];
    std::vector<float> x(kBlocks * QK_MXFP4);
    for (int b = 0; b < kBlocks; ++b)
        for (int i = 0; i < QK_MXFP4; ++i) x[b * QK_MXFP4 + i] = input(b, i);
    std::vector<BlockMXFP4> q(kBlocks);
    quantize_row(GgmlType::MXFP4, x.data(), q.data(), static_cast<int64_t>(x.size()));
    for (int b = 0; b < kBlocks; ++b) {
        INFO("block " << b);
        CHECK(to_hex(&q[b], sizeof(BlockMXFP4)) == kLlamaBlocks[b]);
    }
}

TEST_CASE("mxfp4: quantizer properties on random data") {
    std::mt19937 rng(31);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    for (int trial = 0; trial < 400; ++trial) {
        float x[QK_MXFP4];
        const float sigma = std::exp2(static_cast<float>(trial % 40) - 20.0f);
        float amax = 0.0f;
        for (float& v : x) {
            v = sigma * gauss(rng);
            amax = std::fmax(amax, std::fabs(v));
        }
        BlockMXFP4 b;
        quantize_block(x, b);
        // The largest magnitude lands in [8, 16) half-scale steps: e = floor(log2 amax) + 125.
        CHECK(static_cast<int>(b.e) == static_cast<int>(std::floor(std::log2(amax))) + 125);
        const float d = mxfp4_scale_half(b.e);
        float y[QK_MXFP4];
        dequantize_block(b, y);
        for (int j = 0; j < QK_MXFP4; ++j) {
            // The stored code is a nearest one (brute force over the 16 codes).
            float best = INFINITY;
            for (int8_t v : kMxfp4Values) best = std::fmin(best, std::fabs(static_cast<float>(v) * d - x[j]));
            CHECK(std::fabs(y[j] - x[j]) == best);
            // So the error is at most half the widest gap (4 steps, between 8 and 12) or the clamp above 12.
            CHECK(std::fabs(y[j] - x[j]) <= std::fmax(2.0f * d, std::fabs(x[j]) - 12.0f * d));
        }
    }
}
