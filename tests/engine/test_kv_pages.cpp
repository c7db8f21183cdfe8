// The paged KV cache's bookkeeping (engine/kv_pages.h) and the CPU cache's sequences over it
// (engine/cpu/kv_cache.h): slots taken in order and given back, prefixes shared by reference,
// copy on write at the first divergent page, refusals that change nothing.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/error.h"
#include "engine/cpu/kv_cache.h"
#include "engine/kv_pages.h"
#include "engine/load_errors.h"

namespace tern {
namespace {

constexpr int32_t P = kKvPagePositions;

std::vector<float> random_row(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng);
    return v;
}

} // namespace

TEST_CASE("KvPageTable: one sequence takes slots 0, 1, 2 ... and gives back the pages past n_past") {
    KvPageTable t(4);
    CHECK(t.exists(0));
    CHECK(t.free_slots() == 4);
    CHECK(t.prepare_write(0, 0, 2 * P + 1).empty());   // fresh pages: nothing to copy
    CHECK(t.pages(0) == std::vector<int32_t>{0, 1, 2});
    CHECK(t.mapped(0) == 3 * P);
    t.set_n_past(0, 2 * P + 1);
    CHECK(t.n_past(0) == 2 * P + 1);
    t.set_n_past(0, P);   // the page of position P - 1 stays
    CHECK(t.pages(0) == std::vector<int32_t>{0});
    CHECK(t.free_slots() == 3);
    CHECK_THROWS_AS(t.set_n_past(0, P + 1), UsageError);   // past the mapped positions
    t.prepare_write(0, P, 2 * P);
    CHECK(t.pages(0) == std::vector<int32_t>{0, 1});   // the lowest free slot again
}

TEST_CASE("KvPageTable: fork shares pages, the first write into a shared page copies it, free drops references") {
    KvPageTable t(8);
    t.prepare_write(0, 0, 2 * P + 10);
    t.set_n_past(0, 2 * P + 10);
    t.fork(0, 3, P + 5);   // dst shares pages 0 and 1 (the second only partly valid)
    CHECK(t.pages(3) == std::vector<int32_t>{0, 1});
    CHECK(t.n_past(3) == P + 5);
    CHECK(t.refs(0) == 2);
    CHECK(t.refs(1) == 2);
    CHECK(t.refs(2) == 1);
    CHECK(t.slots_in_use() == 3);
    // Sequence 3 writes from P + 5: page 1 is shared, so it gets a copy; page 0 stays shared.
    const std::vector<KvSlotCopy> copies = t.prepare_write(3, P + 5, 2 * P + 1);
    REQUIRE(copies.size() == 1);
    CHECK(copies[0].from == 1);
    CHECK(copies[0].to == 3);
    CHECK(t.pages(3) == std::vector<int32_t>{0, 3, 4});
    CHECK(t.refs(1) == 1);
    CHECK(t.pages(0) == std::vector<int32_t>{0, 1, 2});   // the source is untouched
    // Writing again where the page is its own copies nothing.
    CHECK(t.prepare_write(3, P + 6, P + 7).empty());
    t.free(0);
    CHECK(!t.exists(0));
    CHECK(t.refs(0) == 1);   // still held by sequence 3
    CHECK(t.slots_in_use() == 3);
    t.free(3);
    CHECK(t.slots_in_use() == 0);
    CHECK_THROWS_AS(t.n_past(3), UsageError);
    CHECK_THROWS_AS(t.fork(3, 4, 0), UsageError);
    t.create(5);
    CHECK_THROWS_AS(t.create(5), UsageError);
    CHECK_THROWS_AS(t.fork(5, 6, 1), UsageError);   // more than it holds
}

TEST_CASE("KvPageTable: a write the free slots cannot take throws KvPoolExhausted and changes nothing") {
    KvPageTable t(3);
    t.prepare_write(0, 0, 2 * P);
    t.set_n_past(0, 2 * P);
    t.fork(0, 1, 2 * P);
    // Sequence 1 writing [P, 3P) needs a copy of page 1 and a new page 2: two slots, one free.
    CHECK_THROWS_AS(t.prepare_write(1, P, 3 * P), KvPoolExhausted);
    CHECK(t.pages(1) == std::vector<int32_t>{0, 1});
    CHECK(t.refs(1) == 2);
    CHECK(t.free_slots() == 1);
    CHECK(t.prepare_write(1, 2 * P, 3 * P).empty());   // one new page fits
    CHECK(t.free_slots() == 0);
}

TEST_CASE("KvCache sequences: a fork reads the shared prefix, its own writes never reach the source") {
    for (KvType type : {KvType::f16, KvType::q8_0}) {
        CAPTURE(std::string(kv_type_name(type)));
        const int32_t head_dim = 32;
        KvCache c;
        c.init(type, {2, 1}, head_dim, head_dim, 3 * P, 8);
        std::vector<std::vector<float>> rows;   // position -> (2 heads) row, written to both layers
        for (int32_t pos = 0; pos < P + 20; ++pos) {
            rows.push_back(random_row(2 * head_dim, 100 + uint32_t(pos)));
            c.write(0, pos, rows.back().data(), rows.back().data());
            c.write(1, pos, rows.back().data(), rows.back().data());
        }
        c.set_n_past(P + 20);
        c.fork(0, 1, P + 10);
        CHECK(c.pages_in_use() == 2);
        const size_t rb = kv_row_bytes(type, head_dim);
        for (int32_t pos : {0, P - 1, P, P + 9})
            CHECK(std::memcmp(c.k_row(0, 1, pos, 1), c.k_row(0, 1, pos, 0), rb) == 0);
        // The fork diverges at P + 10: its second page is copied, the source keeps its rows.
        c.reserve(P + 12, 1);
        CHECK(c.pages_in_use() == 3);
        const std::vector<float> other = random_row(2 * head_dim, 7);
        c.write(0, P + 10, other.data(), other.data(), 1);
        c.write(1, P + 10, other.data(), other.data(), 1);
        std::vector<uint8_t> expect(rb);
        kv_store_row(type, rows[size_t(P + 10)].data(), expect.data(), head_dim);
        CHECK(std::memcmp(c.k_row(0, 0, P + 10, 0), expect.data(), rb) == 0);
        kv_store_row(type, other.data(), expect.data(), head_dim);
        CHECK(std::memcmp(c.k_row(0, 0, P + 10, 1), expect.data(), rb) == 0);
        CHECK(std::memcmp(c.v_row(1, 0, P + 3, 1), c.v_row(1, 0, P + 3, 0), rb) == 0);   // copied with the page
        c.set_n_past(P + 11, 1);
        // Snapshots and an erase of the fork leave the source alone.
        const KvSnapshot before = c.save(P + 20, 0);
        c.erase(5, P + 2, {}, 1, 1);
        CHECK(c.n_past(1) == P + 11 - (P - 3));
        CHECK(c.save(P + 20, 0).bytes == before.bytes);
        c.free(1);
        CHECK(c.pages_in_use() == 2);
    }
}

} // namespace tern
