// kernels/kv_format.h: the one table of KV formats every layer sizes caches with.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "base/error.h"
#include "kernels/kv_format.h"

using namespace tern;

TEST_CASE("kv format table: names round-trip, block sizes, row bytes") {
    for (const KvFormatInfo& f : kKvFormats) {
        CHECK(kv_type_from_name(f.name) == f.type);
        CHECK(kv_type_name(f.type) == f.name);
        CHECK(&kv_format_info(f.type) == &f);
    }
    CHECK_THROWS_AS(kv_type_from_name("q4_0"), UsageError);
    CHECK(kv_row_bytes(KvType::f32, 64) == 256);
    CHECK(kv_row_bytes(KvType::f16, 64) == 128);
    CHECK(kv_row_bytes(KvType::bf16, 64) == 128);
    CHECK(kv_row_bytes(KvType::q8_0, 256) == 8 * 34);
    CHECK(kv_row_bytes(KvType::f8_e4m3, 64) == 2 * 34);
    CHECK(kv_block_elems(KvType::q8_0) == 32);
    CHECK(kv_block_elems(KvType::f16) == 1);
    CHECK(kv_format_info(KvType::q8_0).quantized);
    CHECK(!kv_format_info(KvType::bf16).quantized);
}

TEST_CASE("kv_position_bytes: K and V rows of every head of every layer") {
    const std::vector<int32_t> heads = {4, 4, 2};
    CHECK(kv_position_bytes(KvType::f16, heads, 64, 32) == 10 * (128 + 64));
    CHECK(kv_position_bytes(KvType::q8_0, heads, 64, 32) == 10 * (2 * 34 + 34));
    CHECK(kv_position_bytes(KvType::f32, {}, 64, 64) == 0);
}
