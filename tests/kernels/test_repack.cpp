// quant/repack: the row-interleaved layouts (Q4_0, Q8_0, Q4_K, Q6_K) round-trip exactly (random rows, ragged last groups, split
// work ranges), hold the documented bytes where the kernels read them, and refuse what has no layout.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "quant/blocks.h"
#include "quant/reference.h"
#include "quant/repack.h"
#include "quant/types.h"

namespace tern {
namespace {

std::vector<uint8_t> random_rows(GgmlType t, int64_t n_out, int64_t n_in, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n_out * n_in));
    for (float& v : x) v = dist(rng);
    std::vector<uint8_t> w(row_bytes(t, n_in) * static_cast<size_t>(n_out));
    for (int64_t r = 0; r < n_out; ++r)
        quantize_row(t, x.data() + r * n_in, w.data() + static_cast<size_t>(r) * row_bytes(t, n_in), n_in);
    return w;
}

} // namespace

TEST_CASE("repack_rows / unpack_rows round-trip Q4_0 and Q8_0 exactly, ragged groups included") {
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0}) {
        for (int64_t n_out : {1, 15, 16, 17, 48, 70}) {
            for (int64_t n_in : {32, 96, 512}) {
                CAPTURE(type_name(t));
                CAPTURE(n_out);
                CAPTURE(n_in);
                const auto w = random_rows(t, n_out, n_in, uint32_t(n_out * 7 + n_in));
                std::vector<uint8_t> packed(packed_bytes(t, n_out, n_in), 0xAB);
                repack_rows(t, w.data(), n_out, n_in, packed.data());
                std::vector<uint8_t> back(w.size(), 0xCD);
                unpack_rows(t, packed.data(), n_out, n_in, back.data());
                CHECK(std::memcmp(back.data(), w.data(), w.size()) == 0);
                CHECK(packed.size() == size_t((n_out + 15) / 16) * 16 * row_bytes(t, n_in));

                // The same bytes when the groups are packed in two separate ranges (how load splits the work).
                if (n_out > 16) {
                    std::vector<uint8_t> split(packed.size(), 0x11);
                    repack_rows(t, w.data(), n_out, n_in, split.data(), 0, 16);
                    repack_rows(t, w.data(), n_out, n_in, split.data(), 16, n_out);
                    CHECK(split == packed);
                }
            }
        }
    }
}

TEST_CASE("repack_rows / unpack_rows round-trip Q4_K and Q6_K exactly (scales and codes re-encoded)") {
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    CAPTURE(type_name(t));
    for (int64_t n_out : {3, 16, 33}) {
        for (int64_t n_in : {256, 768}) {
            CAPTURE(n_out);
            CAPTURE(n_in);
            const auto w = random_rows(t, n_out, n_in, uint32_t(n_out + n_in));
            std::vector<uint8_t> packed(packed_bytes(t, n_out, n_in), 0xAB);
            repack_rows(t, w.data(), n_out, n_in, packed.data());
            std::vector<uint8_t> back(w.size(), 0xCD);
            unpack_rows(t, packed.data(), n_out, n_in, back.data());
            CHECK(std::memcmp(back.data(), w.data(), w.size()) == 0);
        }
    }
    // Random bytes: every bit of every scale / code field survives (quantized rows rarely reach the extremes).
    std::vector<uint8_t> w(row_bytes(t, 256) * 16);
    std::mt19937 rng(5);
    for (uint8_t& b : w) b = uint8_t(rng());
    std::vector<uint8_t> packed(packed_bytes(t, 16, 256)), back(w.size());
    repack_rows(t, w.data(), 16, 256, packed.data());
    unpack_rows(t, packed.data(), 16, 256, back.data());
    CHECK(back == w);
  }
}

TEST_CASE("packed Q4_0 and Q8_0 blocks hold the scales and codes where repack.h says") {
    const int64_t n_out = 20, n_in = 64;   // two groups (the second padded), two blocks per row
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0}) {
        CAPTURE(type_name(t));
        const auto w = random_rows(t, n_out, n_in, 3);
        std::vector<uint8_t> p(packed_bytes(t, n_out, n_in));
        repack_rows(t, w.data(), n_out, n_in, p.data());
        const size_t qs = t == GgmlType::Q4_0 ? 16 : 32, blk = 2 + qs, rb = row_bytes(t, n_in);
        const uint8_t flip = t == GgmlType::Q4_0 ? 0 : 0x80;
        bool ok = true;
        for (int64_t row = 0; row < n_out; ++row)
            for (int64_t b = 0; b < 2; ++b) {
                const uint8_t* src = w.data() + size_t(row) * rb + size_t(b) * blk;
                const uint8_t* pb = p.data() + size_t(row / 16) * 16 * rb + size_t(b) * 16 * blk;
                const int r = int(row % 16);
                ok &= pb[2 * r] == src[0] && pb[2 * r + 1] == src[1];
                for (size_t i = 0; i < qs; ++i) ok &= pb[32 + (i / 4) * 64 + 4 * r + i % 4] == uint8_t(src[2 + i] ^ flip);
            }
        CHECK(ok);
        // Padding rows 20..31 of the second group: zero scales.
        const uint8_t* g1 = p.data() + 16 * rb;
        bool zero = true;
        for (int r = 4; r < 16; ++r) zero &= g1[2 * r] == 0 && g1[2 * r + 1] == 0;
        CHECK(zero);
    }
}

TEST_CASE("repack refuses formats without a packed layout and ranges that split a group") {
    CHECK_FALSE(packable(GgmlType::Q5_K, 256));
    CHECK_FALSE(packable(GgmlType::Q4_K, 128));
    CHECK_FALSE(packable(GgmlType::Q4_0, 48));
    CHECK(packable(GgmlType::Q8_0, 64));
    std::vector<uint8_t> src(row_bytes(GgmlType::Q5_K, 256)), dst(4096);
    CHECK_THROWS_AS(repack_rows(GgmlType::Q5_K, src.data(), 1, 256, dst.data()), std::invalid_argument);
    const auto w = random_rows(GgmlType::Q4_0, 40, 32, 1);
    std::vector<uint8_t> p(packed_bytes(GgmlType::Q4_0, 40, 32));
    CHECK_THROWS_AS(repack_rows(GgmlType::Q4_0, w.data(), 40, 32, p.data(), 8, 40), std::invalid_argument);
    CHECK_THROWS_AS(repack_rows(GgmlType::Q4_0, w.data(), 40, 32, p.data(), 0, 20), std::invalid_argument);
}

} // namespace tern
