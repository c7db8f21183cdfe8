// quant/value_check.h and base/finite.h: the first NaN, inf or refused encoding in a row of every format, with
// the block and the scale field named, and nothing reported in rows every encoder writes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "base/finite.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/value_check.h"

namespace tern {
namespace {

std::vector<float> random_row(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v)
        x = dist(rng);
    return v;
}

std::vector<uint8_t> encoded(GgmlType type, const std::vector<float>& values) {
    std::vector<uint8_t> bytes(row_bytes(type, static_cast<int64_t>(values.size())));
    quantize_row(type, values.data(), bytes.data(), static_cast<int64_t>(values.size()));
    return bytes;
}

void put_f16(std::vector<uint8_t>& bytes, size_t at, uint16_t bits) {
    std::memcpy(bytes.data() + at, &bits, 2);
}

struct ScaleCase {
    GgmlType type;
    const char* field;
    size_t offset;
};

} // namespace

TEST_CASE("first_non_finite: the first NaN or inf of a row, -1 when there is none") {
    std::vector<float> v(1000, 1.0f);
    CHECK(first_non_finite(v) == -1);
    CHECK(first_non_finite(std::span<const float>()) == -1);
    v[700] = -INFINITY;
    v[900] = NAN;
    CHECK(first_non_finite(v) == 700);
    v[3] = NAN;
    CHECK(first_non_finite(v) == 3);
    v[3] = 3.4e38f; // the largest finite values are finite
    CHECK(first_non_finite(v) == 700);
    CHECK(float_text(NAN) == "nan");
    CHECK(float_text(-INFINITY) == "-inf");
    CHECK(float_text(0.5f) == "0.5");
}

TEST_CASE("find_bad_value: rows every encoder writes are clean; a NaN or inf element is found in every float format") {
    const std::vector<float> row = random_row(1024, 1);
    for (const TypeInfo& ti : all_types()) {
        if (!ti.can_quantize) continue;
        CAPTURE(ti.name);
        CHECK_FALSE(find_bad_value(ti.type, encoded(ti.type, row).data(), 1024).has_value());
    }
    for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16}) {
        CAPTURE(type_name(type));
        std::vector<float> bad = row;
        bad[517] = INFINITY;
        const std::vector<uint8_t> bytes = encoded(type, bad);
        const std::optional<BadValue> r = find_bad_value(type, bytes.data(), 1024);
        REQUIRE(r.has_value());
        CHECK(r->element == 517);
        CHECK(r->block == 517);
        CHECK(r->what == "element 517 is inf");
        // The same bytes at any alignment, and as a piece of a tensor that starts 100 elements earlier.
        std::vector<uint8_t> shifted(bytes.size() + 1);
        std::memcpy(shifted.data() + 1, bytes.data(), bytes.size());
        const std::optional<BadValue> s = find_bad_value(type, shifted.data() + 1, 1024, 100);
        REQUIRE(s.has_value());
        CHECK(s->what == "element 617 is inf");
    }
    // tern's F8_E4M3: its NaN code (0x7f) as element 8 of block 1.
    std::vector<uint8_t> f8 = encoded(GgmlType::F8_E4M3, row);
    f8[sizeof(BlockF8_E4M3) + offsetof(BlockF8_E4M3, qs) + 8] = 0x7F;
    const std::optional<BadValue> r = find_bad_value(GgmlType::F8_E4M3, f8.data(), 1024);
    REQUIRE(r.has_value());
    CHECK(r->what == "block 1 (elements 32..63): element 40 decodes to nan");
    // Integer tensors hold no NaN; formats tern cannot decode cannot be checked.
    const std::vector<uint8_t> ints(64, 0xFF);
    CHECK(values_checkable(GgmlType::I32));
    CHECK_FALSE(find_bad_value(GgmlType::I32, ints.data(), 16).has_value());
    CHECK_FALSE(values_checkable(GgmlType::IQ2_XS));
    CHECK_THROWS(find_bad_value(GgmlType::IQ2_XS, ints.data(), 256));
}

TEST_CASE("find_bad_value: a block's f16 scale that is NaN or inf is named, wherever its struct keeps it") {
    const std::vector<float> row = random_row(1024, 2);
    const ScaleCase cases[] = {
        {GgmlType::Q4_0, "d", offsetof(BlockQ4_0, d)},       {GgmlType::Q4_1, "m", offsetof(BlockQ4_1, m)},
        {GgmlType::Q5_0, "d", offsetof(BlockQ5_0, d)},       {GgmlType::Q5_1, "d", offsetof(BlockQ5_1, d)},
        {GgmlType::Q8_0, "d", offsetof(BlockQ8_0, d)},       {GgmlType::Q2_K, "dmin", offsetof(BlockQ2_K, dmin)},
        {GgmlType::Q2_K, "d", offsetof(BlockQ2_K, d)},       {GgmlType::Q3_K, "d", offsetof(BlockQ3_K, d)},
        {GgmlType::Q4_K, "d", offsetof(BlockQ4_K, d)},       {GgmlType::Q4_K, "dmin", offsetof(BlockQ4_K, dmin)},
        {GgmlType::Q5_K, "dmin", offsetof(BlockQ5_K, dmin)}, {GgmlType::Q6_K, "d", offsetof(BlockQ6_K, d)},
        {GgmlType::IQ4_NL, "d", offsetof(BlockIQ4_NL, d)},   {GgmlType::IQ4_XS, "d", offsetof(BlockIQ4_XS, d)},
        {GgmlType::F8_E4M3, "d", offsetof(BlockF8_E4M3, d)},
    };
    for (const ScaleCase& c : cases) {
        CAPTURE(type_name(c.type));
        CAPTURE(c.field);
        const TypeInfo& ti = type_info(c.type);
        const int64_t block = 1024 / ti.block_elems - 1; // the last block
        for (const uint16_t bits : {uint16_t{0x7C00}, uint16_t{0xFE00}}) {
            std::vector<uint8_t> bytes = encoded(c.type, row);
            put_f16(bytes, static_cast<size_t>(block) * ti.block_bytes + c.offset, bits);
            const std::optional<BadValue> r = find_bad_value(c.type, bytes.data(), 1024);
            REQUIRE(r.has_value());
            CHECK(r->block == block);
            const std::string value = bits == 0x7C00 ? "inf (0x7c00)" : "nan (0xfe00)";
            CHECK(r->what == "block " + std::to_string(block) + " (elements " + std::to_string(block * ti.block_elems) +
                                 ".." + std::to_string(block * ti.block_elems + ti.block_elems - 1) +
                                 "): its f16 scale " + c.field + " is " + value);
        }
    }
}

TEST_CASE("find_bad_value: MXFP4's scale byte 0xff is refused whatever the codes; 0xfe overflows the largest codes") {
    std::vector<uint8_t> bytes = encoded(GgmlType::MXFP4, random_row(256, 3));
    CHECK_FALSE(find_bad_value(GgmlType::MXFP4, bytes.data(), 256).has_value());
    std::vector<uint8_t> fe = bytes;
    fe[17 * 4] = 0xFE;
    std::memset(fe.data() + 17 * 4 + 1, 0x11, 16); // every code 1 (0.5): 2^126, finite
    CHECK_FALSE(find_bad_value(GgmlType::MXFP4, fe.data(), 256).has_value());
    fe[17 * 4 + 3] = 0x17; // element 2 takes code 7 (6.0): 12 * 2^126 overflows
    std::optional<BadValue> r = find_bad_value(GgmlType::MXFP4, fe.data(), 256);
    REQUIRE(r.has_value());
    CHECK(r->what == "block 4 (elements 128..159): element 130 decodes to inf");
    // The largest code, 12 (6.0), overflows from scale byte 0xfd up and stays finite at 0xfc: the blocks below
    // 0xfd are not decoded, and this bound says why that misses nothing.
    std::vector<uint8_t> fd = bytes;
    fd[17 * 7] = 0xFC;
    fd[17 * 7 + 1] = 0x77;   // elements 224 and 240 take code 7
    CHECK_FALSE(find_bad_value(GgmlType::MXFP4, fd.data(), 256).has_value());
    fd[17 * 7] = 0xFD;
    r = find_bad_value(GgmlType::MXFP4, fd.data(), 256);
    REQUIRE(r.has_value());
    CHECK(r->what == "block 7 (elements 224..255): element 224 decodes to inf");
    std::vector<uint8_t> ff = bytes;
    ff[17 * 2] = 0xFF;
    std::memset(ff.data() + 17 * 2 + 1, 0x00, 16); // all codes 0: the values decode to 0, the scale is still NaN
    r = find_bad_value(GgmlType::MXFP4, ff.data(), 256);
    REQUIRE(r.has_value());
    CHECK(r->what == "block 2 (elements 64..95): its E8M0 scale byte is 0xff (NaN)");
    CHECK(r->element == 64);
}

} // namespace tern
