// The CPU KV cache (engine/cpu/kv_cache.h) for every --kv-type: rows written and read back in the stored
// format, the head-dim rule of the block formats, and snapshots (save/load round trips, mismatches, TKV1).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu/kv_cache.h"
#include "base/error.h"
#include "engine/load_errors.h"
#include "tests/test_support.h"

namespace tern {
namespace {

std::vector<float> random_vec(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> v(n);
    for (float& x : v)
        x = dist(rng);
    return v;
}

constexpr KvType kTypes[] = {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3};

// A 3-layer cache with 2, 1 and 2 KV heads (per-layer head counts differ in some models), filled with
// random rows at positions 0 .. n - 1.
struct Filled {
    KvCache cache;
    std::vector<std::vector<float>> k, v; // per layer: (n, n_kv_heads, dim) f32 as written
};

void fill(Filled& f, KvType type, int32_t head_dim, int32_t head_dim_v, int32_t n_ctx, int32_t n) {
    const std::vector<int32_t> heads = {2, 1, 2};
    f.cache.init(type, heads, head_dim, head_dim_v, n_ctx);
    for (size_t l = 0; l < heads.size(); ++l) {
        f.k.push_back(random_vec(size_t(n * heads[l] * head_dim), 100 + uint32_t(l)));
        f.v.push_back(random_vec(size_t(n * heads[l] * head_dim_v), 200 + uint32_t(l)));
        for (int32_t pos = 0; pos < n; ++pos)
            f.cache.write(int32_t(l), pos, f.k[l].data() + size_t(pos * heads[l] * head_dim),
                          f.v[l].data() + size_t(pos * heads[l] * head_dim_v));
    }
    f.cache.set_n_past(n);
}

} // namespace

TEST_CASE("KvCache stores rows in the --kv-type format and returns them at k_row / v_row") {
    for (KvType type : kTypes) {
        CAPTURE(std::string(kv_type_name(type)));
        const int32_t head_dim = 64, head_dim_v = 96, n = 9;
        Filled f;
        fill(f, type, head_dim, head_dim_v, 16, n);
        const KvType fmt = f.cache.format();
        // One page of kKvPagePositions rows per head (the 16 positions round up to a page).
        CHECK(f.cache.total_bytes() ==
              5 * size_t(kKvPagePositions) * (kv_row_bytes(fmt, head_dim) + kv_row_bytes(fmt, head_dim_v)));
        std::vector<float> back(head_dim_v), expect(head_dim_v);
        for (int32_t l = 0; l < 3; ++l) {
            const int32_t heads = l == 1 ? 1 : 2;
            for (int32_t h = 0; h < heads; ++h) {
                for (int32_t pos = 0; pos < n; ++pos) {
                    // The stored row is exactly what the format's own encoder makes of the input row.
                    const float* src = f.v[size_t(l)].data() + size_t((pos * heads + h) * head_dim_v);
                    std::vector<uint8_t> row(kv_row_bytes(fmt, head_dim_v));
                    kv_store_row(fmt, src, row.data(), head_dim_v);
                    CHECK(std::memcmp(row.data(), f.cache.v_row(l, h, pos), row.size()) == 0);
                    // And decodes to within a few percent of it (f8_e4m3, the coarsest, keeps 3 mantissa bits).
                    kv_load_row(fmt, f.cache.v_row(l, h, pos), back.data(), head_dim_v);
                    for (int32_t d = 0; d < head_dim_v; ++d)
                        CHECK(std::fabs(back[size_t(d)] - src[d]) <= 0.07f * std::fabs(src[d]) + 0.04f);
                    const float* ksrc = f.k[size_t(l)].data() + size_t((pos * heads + h) * head_dim);
                    std::vector<uint8_t> krow(kv_row_bytes(fmt, head_dim));
                    kv_store_row(fmt, ksrc, krow.data(), head_dim);
                    CHECK(std::memcmp(krow.data(), f.cache.k_row(l, h, pos), krow.size()) == 0);
                    // The rows of a page are consecutive (the attention reads a chunk as one run).
                    CHECK(static_cast<const uint8_t*>(f.cache.k_row(l, h, pos)) ==
                          static_cast<const uint8_t*>(f.cache.k_row(l, h, 0)) + size_t(pos) * krow.size());
                }
            }
        }
    }
}

TEST_CASE("KvCache pages: positions map pages as they are reserved, forgotten ones go back to the pool") {
    Filled f;
    fill(f, KvType::f16, 64, 32, 3 * kKvPagePositions + 5, 2 * kKvPagePositions + 3);   // 3 pages of 4
    CHECK(f.cache.pages_in_use() == 3);
    f.cache.set_n_past(kKvPagePositions + 1);   // a truncation keeps the page of the last position kept
    CHECK(f.cache.pages_in_use() == 2);
    // Pages taken again hold the new rows, the kept ones their old rows.
    const std::vector<float> k = random_vec(2 * 64, 7), v = random_vec(2 * 32, 8);
    for (int32_t pos = kKvPagePositions + 1; pos < 3 * kKvPagePositions + 5; ++pos) f.cache.write(0, pos, k.data(), v.data());
    CHECK(f.cache.pages_in_use() == 4);
    CHECK_THROWS_AS(f.cache.reserve(3 * kKvPagePositions + 6), UsageError);   // past n_ctx
    std::vector<uint8_t> row(kv_row_bytes(KvType::f16, 64));
    kv_store_row(KvType::f16, f.k[0].data() + size_t(kKvPagePositions * 2 * 64), row.data(), 64);
    CHECK(std::memcmp(row.data(), f.cache.k_row(0, 0, kKvPagePositions), row.size()) == 0);
    kv_store_row(KvType::f16, k.data() + 64, row.data(), 64);
    CHECK(std::memcmp(row.data(), f.cache.k_row(0, 1, 3 * kKvPagePositions + 4), row.size()) == 0);
    // A snapshot over several pages restores into a fresh cache with the same bytes.
    f.cache.set_n_past(3 * kKvPagePositions + 5);
    const KvSnapshot snap = f.cache.save(3 * kKvPagePositions);
    KvCache other;
    other.init(KvType::f16, {2, 1, 2}, 64, 32, 3 * kKvPagePositions + 5);   // the header names n_ctx
    other.load(snap);
    CHECK(other.pages_in_use() == 3);
    CHECK(other.save(3 * kKvPagePositions).bytes == snap.bytes);
    CHECK(other.save_range(100, 300).bytes == f.cache.save_range(100, 300).bytes);
}

TEST_CASE("q8_0 and f8_e4m3 KV caches need head dims that are multiples of 32") {
    for (KvType type : {KvType::q8_0, KvType::f8_e4m3}) {
        KvCache c;
        bool threw = false;
        try {
            c.init(type, {1}, 80, 80, 8);
        } catch (const KvHeadDimsUnfit& e) {   // a UsageError with the numbers (engine/load_errors.h)
            threw = true;
            CHECK(e.type == type);
            CHECK(e.block == 32);
            CHECK(e.head_dim == 80);
            CHECK(std::string(e.what()).find("multiples of 32") != std::string::npos);
        }
        CHECK(threw);
        CHECK_NOTHROW(c.init(type, {1}, 64, 128, 8));
    }
    KvCache c;
    CHECK_NOTHROW(c.init(KvType::f16, {1}, 80, 80, 8)); // the float formats take any head dim
}

TEST_CASE("KvCache snapshots round-trip for every type and refuse a different type or shape") {
    for (KvType type : kTypes) {
        CAPTURE(std::string(kv_type_name(type)));
        Filled f;
        fill(f, type, 64, 64, 32, 20);
        const KvSnapshot snap = f.cache.save(12);
        CHECK(snap.n_past == 12);
        CHECK(snap.kv_type == type);

        KvCache other;
        other.init(type, {2, 1, 2}, 64, 64, 32);
        other.load(snap);
        CHECK(other.n_past() == 12);
        const size_t rb = kv_row_bytes(other.format(), 64);
        for (int32_t l = 0; l < 3; ++l)
            for (int32_t h = 0; h < (l == 1 ? 1 : 2); ++h) {
                CHECK(std::memcmp(other.k_row(l, h, 0), f.cache.k_row(l, h, 0), 12 * rb) == 0);   // one page
                CHECK(std::memcmp(other.v_row(l, h, 0), f.cache.v_row(l, h, 0), 12 * rb) == 0);
            }
        // Same bytes again from the restored cache.
        CHECK(other.save(12).bytes == snap.bytes);

        KvCache wrong_type;
        wrong_type.init(type == KvType::q8_0 ? KvType::f8_e4m3 : KvType::q8_0, {2, 1, 2}, 64, 64, 32);
        CHECK_THROWS_AS(wrong_type.load(snap), UsageError);
        KvCache wrong_shape;
        wrong_shape.init(type, {2, 1, 2}, 96, 64, 32);
        CHECK_THROWS_AS(wrong_shape.load(snap), UsageError);
        KvSnapshot cut = snap;
        cut.bytes.pop_back();
        CHECK_THROWS_AS(other.load(cut), UsageError);
    }
}

TEST_CASE("KvCache loads version-1 (TKV1) snapshots of the float types, not of the block types") {
    for (KvType type : kTypes) {
        CAPTURE(std::string(kv_type_name(type)));
        Filled f;
        fill(f, type, 32, 32, 8, 5);
        KvSnapshot snap = f.cache.save(5);
        const int32_t v1 = 0x31564B54;
        std::memcpy(snap.bytes.data(), &v1, sizeof v1);
        KvCache other;
        other.init(type, {2, 1, 2}, 32, 32, 8);
        const bool float_type = type == KvType::f32 || type == KvType::f16 || type == KvType::bf16;
        if (float_type) {
            other.load(snap);
            CHECK(other.n_past() == 5);
        } else {
            CHECK_THROWS_AS(other.load(snap), UsageError);
        }
    }
}

TEST_CASE("tern perplexity takes --kv-type q8_0 and f8_e4m3, and refuses them for head dims off 32") {
    if (!test::shared_available()) return;
    const std::string text = test::shared_path("data/tinystories/cs336-tinystories_sample.txt").string();
    double nll_f16 = 0.0;
    for (const char* type : {"f16", "q8_0", "f8_e4m3"}) {
        CAPTURE(type);
        const auto r = test::run_tern({"perplexity", "-m", test::shared_path("models/synth/synth-k256-f16.gguf").string(),
                                       "-f", text, "-c", "128", "--chunks", "2", "--kv-type", type, "--json"});
        REQUIRE(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["kv_type"] == type);
        const double nll = j["nll_mean"].get<double>();
        if (std::string(type) == "f16")
            nll_f16 = nll;
        else // an 8-bit cache moves the mean NLL a little, not a lot (and not at all would be suspicious)
            CHECK((std::fabs(nll - nll_f16) < 0.02 * std::fabs(nll_f16) && nll != nll_f16));
    }
    const auto bad = test::run_tern({"perplexity", "-m", test::shared_path("models/gguf/llama2xs-tok512-f32.gguf").string(),
                                     "-f", text, "--kv-type", "q8_0"});
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("--kv-type q8_0") != std::string::npos);
}

} // namespace tern
