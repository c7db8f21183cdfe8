// kernels/cuda/sampling.h (top_logits) against its host twin, engine/logit_candidates.h select_top_logits
// (itself checked against a literal sort of the whole penalised row), on random rows of ragged lengths
// (not multiples of the 4096-entry block chunk), tiny ones shorter than k and a 262144-entry vocabulary,
// with exact ties, NaN, infinities and signed zeros, with and without penalties; k = 1, 40 and the limit.
//
// The contract is exact: a selection compares values, and the one arithmetic, the penalty, rounds each
// operation as the host does. So every check is bit for bit (ids and logit bits).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine/logit_candidates.h"
#include "kernels/cuda/sampling.h"
#include "tests/cuda_device_array.h"

using tern::LogitCandidate;
using tern::LogitPenalties;
using tern::test::DeviceArray;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t bits(float v) { return __builtin_bit_cast(uint32_t, v); }

std::vector<uint32_t> row_bits(const std::vector<float>& row) {
    std::vector<uint32_t> b(row.size());
    for (size_t i = 0; i < row.size(); ++i) b[i] = bits(row[i]);
    return b;
}

// The kernel's answer: all k entries (those past n included). Checks on the way that the row is unchanged.
std::vector<tern::cuda::TopLogit> device_top(const std::vector<float>& row, const LogitPenalties& penalties, int k) {
    DeviceArray<float> d_row(row);
    std::vector<tern::cuda::PenaltyPair> pairs;
    for (const tern::PenaltyCount& s : penalties.seen) pairs.push_back({s.id, s.count});
    DeviceArray<tern::cuda::PenaltyPair> d_pairs(std::max<size_t>(pairs.size(), 1));
    if (!pairs.empty()) d_pairs.write(pairs);
    DeviceArray<tern::cuda::TopLogit> d_out(static_cast<size_t>(k));
    const int64_t n = static_cast<int64_t>(row.size());
    const int64_t scratch_bytes = tern::cuda::top_logits_scratch_bytes(n, k);
    DeviceArray<uint64_t> d_scratch(static_cast<size_t>(scratch_bytes / 8));
    tern::cuda::TopLogitsPenalties p;
    p.pairs = d_pairs.get();
    p.n_pairs = static_cast<int32_t>(pairs.size());
    p.repeat = penalties.repeat;
    p.frequency = penalties.frequency;
    p.presence = penalties.presence;
    tern::cuda::top_logits(d_row.get(), n, p, k, d_out.get(), scratch_bytes > 0 ? d_scratch.get() : nullptr, nullptr);
    CHECK(row_bits(d_row.read()) == row_bits(row));
    return d_out.read();
}

std::vector<LogitCandidate> host_top(const std::vector<float>& row, const LogitPenalties& penalties, int k) {
    std::vector<LogitCandidate> out(static_cast<size_t>(k));
    out.resize(tern::select_top_logits(row, penalties, out));
    return out;
}

// The definition, slowly: penalise a copy, sort every entry in the total order, keep k.
std::vector<LogitCandidate> literal_top(std::vector<float> row, const LogitPenalties& penalties, int k) {
    tern::apply_logit_penalties(row, penalties);
    std::vector<LogitCandidate> all;
    for (size_t i = 0; i < row.size(); ++i) {
        float v = std::isnan(row[i]) ? -kInf : row[i];
        if (v == 0.0f) v = 0.0f;
        all.push_back({static_cast<int32_t>(i), v});
    }
    std::sort(all.begin(), all.end(), [](const LogitCandidate& a, const LogitCandidate& b) {
        return a.logit != b.logit ? a.logit > b.logit : a.id < b.id;
    });
    all.resize(std::min(all.size(), static_cast<size_t>(k)));
    return all;
}

// Ids and logit bits equal (== on floats would let -0.0 pass for +0.0).
void check_same(const std::vector<tern::cuda::TopLogit>& got, const std::vector<LogitCandidate>& want, int k) {
    REQUIRE(got.size() == static_cast<size_t>(k));
    for (size_t r = 0; r < want.size(); ++r) {
        CAPTURE(r);
        REQUIRE(got[r].id == want[r].id);
        REQUIRE(bits(got[r].logit) == bits(want[r].logit));
    }
    for (size_t r = want.size(); r < got.size(); ++r) {   // k > n: the empty entries
        CHECK(got[r].id == -1);
        CHECK(got[r].logit == -kInf);
    }
}

enum class Values { coarse, spread };

// coarse: steps of 0.25 in [-5, 5) (exact ties everywhere); spread: N(0, 4). Both with a sprinkling of NaN,
// +-inf and signed zeros.
std::vector<float> random_row(size_t n, Values kind, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> row(n);
    for (float& v : row) {
        v = kind == Values::coarse ? std::floor(u(rng) * 40.0f) / 4.0f - 5.0f : normal(rng);
        const float special = u(rng);
        if (special < 0.01f) v = std::numeric_limits<float>::quiet_NaN();
        else if (special < 0.02f) v = -kInf;
        else if (special < 0.025f) v = -0.0f;
        else if (special < 0.03f) v = 0.0f;
        else if (special < 0.0302f) v = kInf;
    }
    return row;
}

// A penalty window aimed at the row's best entries (so that the penalties change the selection), a few
// random ids, and ids outside the row (ignored). Factors that are not round numbers, so a contracted or
// reordered penalty would change bits.
LogitPenalties random_penalties(const std::vector<float>& row, int k, std::mt19937& rng) {
    LogitPenalties p;
    std::uniform_real_distribution<float> u(0.0f, 1.0f);
    p.repeat = 0.7f + u(rng) * 1.3f;
    p.frequency = (u(rng) - 0.5f) * 0.9f;
    p.presence = (u(rng) - 0.3f) * 1.7f;
    std::vector<int32_t> ids;
    for (const LogitCandidate& c : literal_top(row, {}, 2 * k))   // infinities stay infinite
        if (std::isfinite(c.logit) && (ids.empty() || u(rng) < 0.5f)) ids.push_back(c.id);
    for (int i = 0; i < 20; ++i) ids.push_back(static_cast<int32_t>(rng() % row.size()));
    const auto n = static_cast<int32_t>(row.size());
    for (int32_t bad : {-1, -7, n, n + 100, std::numeric_limits<int32_t>::min()}) ids.push_back(bad);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t id : ids) p.seen.push_back({id, 1 + static_cast<int32_t>(rng() % 5)});
    std::shuffle(p.seen.begin(), p.seen.end(), rng);   // the kernel must not rely on id order
    return p;
}

} // namespace

TEST_CASE("the host twin select_top_logits is the literal sort of the penalised row") {
    std::mt19937 rng(11);
    for (size_t n : {size_t{1}, size_t{3}, size_t{100}, size_t{5000}}) {
        for (int k : {1, 2, 40, 256}) {
            for (Values kind : {Values::coarse, Values::spread}) {
                CAPTURE(n);
                CAPTURE(k);
                const std::vector<float> row = random_row(n, kind, rng);
                const LogitPenalties penalties = random_penalties(row, k, rng);
                CHECK(host_top(row, {}, k) == literal_top(row, {}, k));
                const std::vector<LogitCandidate> got = host_top(row, penalties, k);
                const std::vector<LogitCandidate> want = literal_top(row, penalties, k);
                REQUIRE(got.size() == want.size());
                for (size_t r = 0; r < got.size(); ++r) {
                    CHECK(got[r].id == want[r].id);
                    CHECK(bits(got[r].logit) == bits(want[r].logit));
                }
            }
        }
    }
}

TEST_CASE("top_logits selects exactly what the host does: ragged and tiny rows, ties, NaN, infinities, penalties") {
    std::mt19937 rng(2024);
    for (size_t n : {size_t{1}, size_t{7}, size_t{255}, size_t{4095}, size_t{4096}, size_t{4097}, size_t{9001},
                     size_t{70001}}) {
        for (int k : {1, 40, tern::cuda::kTopLogitsMax}) {
            for (Values kind : {Values::coarse, Values::spread}) {
                for (bool penalised : {false, true}) {
                    CAPTURE(n);
                    CAPTURE(k);
                    CAPTURE(penalised);
                    const std::vector<float> row = random_row(n, kind, rng);
                    const LogitPenalties penalties = penalised ? random_penalties(row, k, rng) : LogitPenalties{};
                    const std::vector<LogitCandidate> want = host_top(row, penalties, k);
                    check_same(device_top(row, penalties, k), want, k);
                    // The penalties aimed at the best entries must have changed the answer, or this case
                    // proves nothing about them.
                    if (penalised && n > 1000 && k > 1) CHECK(want != host_top(row, {}, k));
                }
            }
        }
    }
}

TEST_CASE("top_logits on a 262144-entry vocabulary (gemma's): three passes for k = 256") {
    std::mt19937 rng(7);
    const std::vector<float> row = random_row(262144, Values::spread, rng);
    for (int k : {1, 40, tern::cuda::kTopLogitsMax}) {
        CAPTURE(k);
        const LogitPenalties penalties = random_penalties(row, k, rng);
        check_same(device_top(row, penalties, k), host_top(row, penalties, k), k);
    }
    // Coarse values: thousands of exact ties across every block, decided by the lowest id.
    const std::vector<float> ties = random_row(262144, Values::coarse, rng);
    check_same(device_top(ties, {}, 40), host_top(ties, {}, 40), 40);
}

TEST_CASE("top_logits on rows without a finite value: all -inf, all NaN, a lone +inf") {
    for (size_t n : {size_t{5}, size_t{5000}}) {
        for (int k : {1, 40, tern::cuda::kTopLogitsMax}) {
            CAPTURE(n);
            CAPTURE(k);
            std::vector<float> row(n, -kInf);
            const std::vector<LogitCandidate> want = host_top(row, {}, k);
            for (size_t r = 0; r < want.size(); ++r) CHECK(want[r].id == static_cast<int32_t>(r));   // lowest ids
            check_same(device_top(row, {}, k), want, k);
            row.assign(n, std::numeric_limits<float>::quiet_NaN());
            check_same(device_top(row, {}, k), host_top(row, {}, k), k);
            row[n - 1] = kInf;
            const std::vector<tern::cuda::TopLogit> got = device_top(row, {}, k);
            CHECK(got[0].id == static_cast<int32_t>(n - 1));
            check_same(got, host_top(row, {}, k), k);
        }
    }
}

TEST_CASE("top_logits: -0.0 ties with +0.0 (lower id first), reported as +0.0; the penalty's roundings") {
    std::vector<float> row = {-0.0f, 0.0f, -0.0f, -1.0f, 0.0f};
    std::vector<tern::cuda::TopLogit> got = device_top(row, {}, 5);
    for (int r = 0; r < 4; ++r) CHECK(got[static_cast<size_t>(r)].id == (r < 3 ? r : 4));
    CHECK(bits(got[0].logit) == 0u);
    check_same(got, host_top(row, {}, 5), 5);

    // (l > 0 ? l / r : l * r) - (count * f + p): each step rounded on its own; a fused count * f + p gives
    // other bits for some of these values (checked below), so a contracted kernel fails here.
    LogitPenalties p;
    p.repeat = 1.1f;
    p.frequency = 0.3f;
    p.presence = 0.3f;
    row = {2.7f, -1.3f, 0.7f, 3.3f, 1e-8f};
    for (int32_t id = 0; id < 5; ++id) p.seen.push_back({id, id + 1});
    got = device_top(row, p, 5);
    check_same(got, host_top(row, p, 5), 5);
    bool fused_differs = false;
    for (const tern::cuda::TopLogit& c : got) {
        const float l = row[static_cast<size_t>(c.id)];
        const float divided = l > 0.0f ? l / 1.1f : l * 1.1f;
        const float count = static_cast<float>(c.id + 1);
        const float minus = count * 0.3f;   // host code is built with -ffp-contract=off
        CHECK(bits(c.logit) == bits(divided - (minus + 0.3f)));
        fused_differs |= bits(divided - std::fma(count, 0.3f, 0.3f)) != bits(c.logit);
    }
    CHECK(fused_differs);
}

TEST_CASE("top_logits: scratch only past one block, and shapes outside the contract are refused") {
    CHECK(tern::cuda::top_logits_scratch_bytes(4096, 256) == 0);
    CHECK(tern::cuda::top_logits_scratch_bytes(4097, 40) == 2 * 40 * 8);
    // 262144 with k = 256: 64 blocks of keys, then 4: (64 + 4) * 256 keys.
    CHECK(tern::cuda::top_logits_scratch_bytes(262144, 256) == (64 + 4) * 256 * 8);
    CHECK(tern::cuda::top_logits_scratch_bytes(262144, 40) == 64 * 40 * 8);
    CHECK_THROWS_AS(tern::cuda::top_logits_scratch_bytes(0, 1), std::invalid_argument);
    CHECK_THROWS_AS(tern::cuda::top_logits_scratch_bytes(100, 0), std::invalid_argument);
    CHECK_THROWS_AS(tern::cuda::top_logits_scratch_bytes(100, tern::cuda::kTopLogitsMax + 1), std::invalid_argument);
    CHECK_THROWS_AS(tern::cuda::top_logits_scratch_bytes(int64_t{1} << 31, 1), std::invalid_argument);
    DeviceArray<float> row(10);
    DeviceArray<tern::cuda::TopLogit> out(1);
    tern::cuda::TopLogitsPenalties p;
    p.n_pairs = 3;   // pairs missing
    CHECK_THROWS_AS(tern::cuda::top_logits(row.get(), 10, p, 1, out.get(), nullptr, nullptr), std::invalid_argument);
}
