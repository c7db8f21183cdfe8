// The sampler on hand-made logit rows: each step of the chain alone, then the chain and its RNG.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "engine/generation/sampler.h"
#include "engine/logit_candidates.h"

using namespace tern;

namespace {

// Everything off except what a test turns on.
SamplingParams plain(float temp) {
    SamplingParams p;
    p.temp = temp;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.seed = 1234;
    return p;
}

// Logits whose softmax is exactly `probs`.
std::vector<float> logits_of(const std::vector<double>& probs) {
    std::vector<float> l;
    for (double p : probs) l.push_back(p > 0 ? static_cast<float>(std::log(p)) : -INFINITY);
    return l;
}

std::vector<int32_t> ids(const std::vector<TokenProb>& d) {
    std::vector<int32_t> out;
    for (const TokenProb& t : d) out.push_back(t.id);
    return out;
}

} // namespace

TEST_CASE("greedy takes the argmax and the lowest id on exact ties") {
    Sampler s(plain(0.0f));
    const std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f, 2.9f};
    CHECK(s.sample(l, {}) == 1);
    const std::vector<float> all_same(7, 0.5f);
    CHECK(s.sample(all_same, {}) == 0);
    CHECK(argmax_lowest(std::vector<float>{-INFINITY, -1.0f, -1.0f}) == 1);
    CHECK(argmax_lowest(std::vector<float>{NAN, 0.0f}) == 1);
    const auto d = s.distribution(l, {});
    REQUIRE(d.size() == 1);
    CHECK(d[0].id == 1);
    CHECK(d[0].p == 1.0f);
}

TEST_CASE("greedy with a negative temperature is greedy too") {
    Sampler s(plain(-1.0f));
    CHECK(s.greedy());
    CHECK(s.sample(std::vector<float>{0.0f, 5.0f, 1.0f}, {}) == 1);
}

TEST_CASE("repetition penalty divides positive logits and multiplies negative ones") {
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    std::vector<float> l = {4.0f, -4.0f, 4.0f, 1.0f};
    const std::vector<int32_t> hist = {0, 1, 1};
    apply_penalties(l, hist, p);
    CHECK(l[0] == 2.0f);
    CHECK(l[1] == -8.0f);   // once per token, however often it was seen
    CHECK(l[2] == 4.0f);
    CHECK(l[3] == 1.0f);
}

TEST_CASE("frequency and presence penalties subtract count * f + p") {
    SamplingParams p = plain(0.0f);
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    std::vector<float> l = {1.0f, 1.0f, 1.0f};
    const std::vector<int32_t> hist = {2, 0, 2, 2};
    apply_penalties(l, hist, p);
    CHECK(l[0] == doctest::Approx(1.0f - 0.5f - 0.25f));
    CHECK(l[1] == 1.0f);
    CHECK(l[2] == doctest::Approx(1.0f - 1.5f - 0.25f));
}

TEST_CASE("penalties only see the last repeat_last_n tokens; 0 turns them off, -1 means all") {
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 2.0f;
    const std::vector<int32_t> hist = {0, 1, 2};
    p.repeat_last_n = 2;
    std::vector<float> l = {2.0f, 2.0f, 2.0f};
    apply_penalties(l, hist, p);
    CHECK(l == std::vector<float>{2.0f, 1.0f, 1.0f});
    p.repeat_last_n = 0;
    l = {2.0f, 2.0f, 2.0f};
    apply_penalties(l, hist, p);
    CHECK(l == std::vector<float>{2.0f, 2.0f, 2.0f});
    p.repeat_last_n = -1;
    apply_penalties(l, hist, p);
    CHECK(l == std::vector<float>{1.0f, 1.0f, 1.0f});
    // Ids outside the vocabulary are ignored rather than written out of bounds.
    const std::vector<int32_t> bad = {-1, 7};
    apply_penalties(l, bad, p);
    CHECK(l == std::vector<float>{1.0f, 1.0f, 1.0f});
}

TEST_CASE("greedy sees the penalties") {
    SamplingParams p = plain(0.0f);
    p.repeat_penalty = 1.5f;
    Sampler s(p);
    const std::vector<float> l = {3.0f, 2.5f};
    CHECK(s.sample(l, std::vector<int32_t>{}) == 0);
    CHECK(s.sample(l, std::vector<int32_t>{0}) == 1);   // 3 / 1.5 = 2 < 2.5
}

TEST_CASE("top-k keeps the k largest, ties broken by lower id") {
    SamplingParams p = plain(1.0f);
    p.top_k = 2;
    Sampler s(p);
    const std::vector<float> l = {1.0f, 5.0f, 3.0f, 5.0f, 3.0f};
    auto d = s.distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{1, 3});
    CHECK(d[0].p == doctest::Approx(0.5));
    p.top_k = 3;
    d = Sampler(p).distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{1, 2, 3});   // id order; 4 (a tie with 2) lost on id
    p.top_k = 100;   // larger than the vocabulary: everything
    d = Sampler(p).distribution(l, {});
    CHECK(d.size() == 5);
}

TEST_CASE("top-p keeps the smallest prefix whose mass reaches p") {
    SamplingParams p = plain(1.0f);
    const std::vector<float> l = logits_of({0.1, 0.5, 0.25, 0.15});
    p.top_p = 0.7f;   // 0.5 + 0.25 = 0.75 >= 0.7
    auto d = Sampler(p).distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{1, 2});
    CHECK(d[0].p == doctest::Approx(0.5 / 0.75));
    CHECK(d[1].p == doctest::Approx(0.25 / 0.75));
    p.top_p = 0.5f;   // the top token alone reaches it
    d = Sampler(p).distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{1});
    p.top_p = 0.0f;   // keeps at least one
    d = Sampler(p).distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{1});
    p.top_p = 0.95f;
    d = Sampler(p).distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{0, 1, 2, 3});   // 0.5 + 0.25 + 0.15 = 0.9 < 0.95: all four
}

TEST_CASE("top-p refers to the top-k set's probabilities") {
    SamplingParams p = plain(1.0f);
    p.top_k = 2;
    p.top_p = 0.6f;
    // Over all four: 0.4, 0.3, ... so 0.6 needs two; over the top-2 set 0.4/0.7 = 0.57 still
    // needs two. With 0.55: the top-2-normalised first token (0.571) alone reaches it.
    const std::vector<float> l = logits_of({0.4, 0.3, 0.2, 0.1});
    CHECK(ids(Sampler(p).distribution(l, {})) == std::vector<int32_t>{0, 1});
    p.top_p = 0.55f;
    CHECK(ids(Sampler(p).distribution(l, {})) == std::vector<int32_t>{0});
}

TEST_CASE("top-p on a large vocabulary (quickselect on mass) matches the definition") {
    SamplingParams p = plain(1.0f);
    p.top_p = 0.9f;
    std::vector<float> l(5000);
    for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::sin(static_cast<double>(i) * 0.37) * 3.0);
    const auto d = Sampler(p).distribution(l, {});
    // Reference: full sort, cumulative mass.
    std::vector<std::pair<float, int32_t>> all;
    double z = 0;
    float mx = *std::max_element(l.begin(), l.end());
    for (size_t i = 0; i < l.size(); ++i) {
        all.push_back({l[i], static_cast<int32_t>(i)});
        z += std::exp(static_cast<double>(l[i]) - mx);
    }
    std::sort(all.begin(), all.end(),
              [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
    size_t n = 0;
    double cum = 0;
    while (n < all.size()) {
        cum += std::exp(static_cast<double>(all[n].first) - mx) / z;
        ++n;
        if (cum >= 0.9) break;
    }
    REQUIRE(d.size() == n);
    std::vector<int32_t> want;
    for (size_t i = 0; i < n; ++i) want.push_back(all[i].second);
    std::sort(want.begin(), want.end());   // distribution() lists candidates in id order
    CHECK(ids(d) == want);
    CHECK(n > 64);   // the selection had to split the range several times
}

TEST_CASE("min-p keeps tokens with p >= min_p * p_max") {
    SamplingParams p = plain(1.0f);
    p.min_p = 0.5f;
    const std::vector<float> l = logits_of({0.1, 0.4, 0.21, 0.19, 0.1});
    const auto d = Sampler(p).distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{1, 2});   // 0.19 < 0.5 * 0.4
    CHECK(d[0].p == doctest::Approx(0.4 / 0.61));
}

TEST_CASE("temperature reshapes what survived, after the filters") {
    SamplingParams p = plain(2.0f);
    const std::vector<float> l = {0.0f, 2.0f, 4.0f};
    auto d = Sampler(p).distribution(l, {});
    REQUIRE(d.size() == 3);
    // exp(l / 2): 1, e, e^2
    const double z = 1 + std::exp(1.0) + std::exp(2.0);
    CHECK(ids(d) == std::vector<int32_t>{0, 1, 2});
    CHECK(d[2].p == doctest::Approx(std::exp(2.0) / z));
    CHECK(d[0].p == doctest::Approx(1.0 / z));
    CHECK(probability_of(d, 1) == doctest::Approx(std::exp(1.0) / z));
    CHECK(probability_of(d, 7) == 0.0f);
    // min-p works on the un-tempered distribution: with temp 2 the middle token has
    // p / p_max = e^-1 = 0.37, but before temperature e^-2 = 0.135 < 0.2, so it is dropped.
    p.min_p = 0.2f;
    d = Sampler(p).distribution(l, {});
    CHECK(ids(d) == std::vector<int32_t>{2});
}

TEST_CASE("probabilities sum to one and are listed in id order") {
    SamplingParams p;   // the defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
    std::vector<float> l(1000);
    for (size_t i = 0; i < l.size(); ++i) l[i] = static_cast<float>(std::cos(static_cast<double>(i)) * 4.0);
    const auto d = Sampler(p).distribution(l, {});
    double sum = 0;
    for (size_t i = 0; i < d.size(); ++i) {
        sum += d[i].p;
        if (i) CHECK(d[i - 1].id < d[i].id);
    }
    CHECK(sum == doctest::Approx(1.0));
    CHECK(d.size() <= 40);
}

TEST_CASE("the same seed gives the same tokens; another seed other tokens") {
    SamplingParams p = plain(1.0f);
    p.seed = 42;
    const std::vector<float> l = logits_of({0.2, 0.2, 0.2, 0.2, 0.2});
    auto run = [&](uint64_t seed) {
        SamplingParams q = p;
        q.seed = seed;
        Sampler s(q);
        std::vector<int32_t> out;
        for (int i = 0; i < 64; ++i) out.push_back(s.sample(l, out));
        return out;
    };
    CHECK(run(42) == run(42));
    CHECK(run(42) != run(43));
    Sampler s(p);
    const double u0 = s.uniform();
    s.reseed(42);
    CHECK(s.uniform() == u0);
}

TEST_CASE("the RNG stream is fixed: mt19937_64 with 53-bit doubles, the same on every platform") {
    SamplingParams p = plain(1.0f);
    p.seed = 5489;   // the standard's default seed; its 10000th output is fixed by [rand.predef]
    Sampler s(p);
    for (int i = 0; i < 9999; ++i) s.uniform();
    CHECK(s.uniform() == static_cast<double>(9981545732273789042ull >> 11) * 0x1.0p-53);
}

TEST_CASE("draw frequencies match the distribution") {
    SamplingParams p = plain(1.0f);
    p.seed = 7;
    const std::vector<double> probs = {0.5, 0.25, 0.125, 0.0625, 0.0625};
    const std::vector<float> l = logits_of(probs);
    Sampler s(p);
    const int n = 200000;
    std::map<int32_t, int> counts;
    for (int i = 0; i < n; ++i) ++counts[s.sample(l, {})];
    for (size_t i = 0; i < probs.size(); ++i) {
        const double f = static_cast<double>(counts[static_cast<int32_t>(i)]) / n;
        // 5 sigma of a binomial at n = 200000 is under 0.006 for these p.
        CHECK(std::fabs(f - probs[i]) < 0.006);
    }
}

TEST_CASE("draw frequencies with temperature and top-k match the formula") {
    SamplingParams p = plain(0.5f);
    p.top_k = 2;
    p.seed = 99;
    const std::vector<float> l = {0.0f, 1.0f, 0.5f};
    Sampler s(p);
    const int n = 100000;
    int c1 = 0, c2 = 0;
    for (int i = 0; i < n; ++i) {
        const int32_t t = s.sample(l, {});
        CHECK(t != 0);
        c1 += t == 1;
        c2 += t == 2;
    }
    const double want1 = std::exp(2.0) / (std::exp(2.0) + std::exp(1.0));
    CHECK(std::fabs(static_cast<double>(c1) / n - want1) < 0.008);
    CHECK(c1 + c2 == n);
}

TEST_CASE("all -inf or NaN rows do not crash") {
    Sampler s(plain(1.0f));
    const std::vector<float> l = {-INFINITY, -INFINITY, -INFINITY};
    CHECK(s.sample(l, {}) == 0);
    const std::vector<float> n = {NAN, 1.0f, NAN};
    CHECK(s.sample(n, {}) == 1);
}

TEST_CASE("the whole chain equals a literal sort-everything implementation on random rows") {
    // The chain as written in sampler.h, step by step on a fully sorted list: slow and obvious.
    auto literal = [](std::vector<float> l, const std::vector<int32_t>& hist, const SamplingParams& p) {
        apply_penalties(l, hist, p);
        std::vector<std::pair<float, int32_t>> c;
        for (size_t i = 0; i < l.size(); ++i) c.push_back({l[i], static_cast<int32_t>(i)});
        std::sort(c.begin(), c.end(),
                  [](auto a, auto b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
        if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(static_cast<size_t>(p.top_k));
        const double mx = c[0].first;
        double z = 0;
        for (auto& e : c) z += std::exp(e.first - mx);
        if (p.top_p < 1.0f) {
            double cum = 0;
            size_t keep = c.size();
            for (size_t i = 0; i < c.size(); ++i) {
                cum += std::exp(c[i].first - mx) / z;
                if (cum >= p.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            c.resize(keep);
        }
        if (p.min_p > 0.0f) {
            const double lim = mx + std::log(static_cast<double>(p.min_p));
            std::erase_if(c, [&](auto e) { return e.first < lim; });
        }
        std::map<int32_t, double> out;
        double s = 0;
        for (auto& e : c) s += std::exp((e.first - mx) / p.temp);
        for (auto& e : c) out[e.second] = std::exp((e.first - mx) / p.temp) / s;
        return out;
    };
    uint64_t state = 12345;
    auto next = [&] {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        return static_cast<double>(state >> 11) * 0x1.0p-53;
    };
    for (int round = 0; round < 300; ++round) {
        CAPTURE(round);
        const size_t n = 50 + static_cast<size_t>(next() * 3000);
        std::vector<float> l(n);
        // Coarse values make exact ties common, so the id tie-break is exercised too.
        for (float& v : l) v = static_cast<float>(std::floor(next() * 40.0) / 4.0 - 5.0);
        std::vector<int32_t> hist;
        for (int i = 0; i < 20; ++i) hist.push_back(static_cast<int32_t>(next() * static_cast<double>(n)));
        SamplingParams p;
        p.temp = static_cast<float>(0.3 + next() * 1.5);
        p.top_k = next() < 0.3 ? 0 : 1 + static_cast<int32_t>(next() * 200);
        p.top_p = next() < 0.3 ? 1.0f : static_cast<float>(0.5 + next() * 0.5);
        p.min_p = next() < 0.3 ? 0.0f : static_cast<float>(next() * 0.3);
        p.repeat_penalty = next() < 0.5 ? 1.0f : 1.3f;
        p.frequency_penalty = next() < 0.5 ? 0.0f : 0.2f;
        p.presence_penalty = next() < 0.5 ? 0.0f : 0.1f;
        const auto want = literal(l, hist, p);
        const auto got = Sampler(p).distribution(l, hist);
        REQUIRE(got.size() == want.size());
        for (const TokenProb& t : got) {
            REQUIRE(want.count(t.id) == 1);
            CHECK(t.p == doctest::Approx(want.at(t.id)).epsilon(1e-5));
        }
    }
}

TEST_CASE("candidates_needed: 1 when greedy, top_k up to the limit, 0 (the whole row) otherwise") {
    SamplingParams p = plain(0.0f);
    CHECK(Sampler(p).candidates_needed() == 1);
    p.top_k = 5000;   // greedy ignores top-k
    CHECK(Sampler(p).candidates_needed() == 1);
    p.temp = 0.8f;
    CHECK(Sampler(p).candidates_needed() == 0);
    p.top_k = 0;
    CHECK(Sampler(p).candidates_needed() == 0);
    p.top_k = kMaxTopCandidates;
    CHECK(Sampler(p).candidates_needed() == kMaxTopCandidates);
    p.top_k = kMaxTopCandidates + 1;
    CHECK(Sampler(p).candidates_needed() == 0);
    p.top_k = 40;
    CHECK(Sampler(p).candidates_needed() == 40);
}

TEST_CASE("penalties_of lists each distinct id of the window once, in id order, with its count") {
    SamplingParams p = plain(1.0f);
    p.repeat_last_n = 5;
    p.frequency_penalty = 0.5f;
    const std::vector<int32_t> hist = {9, 9, 4, 7, 4, 9, 2};   // the window: 4 7 4 9 2
    const LogitPenalties got = penalties_of(hist, p);
    REQUIRE(got.seen.size() == 4);
    const std::vector<std::pair<int32_t, int32_t>> want = {{2, 1}, {4, 2}, {7, 1}, {9, 1}};
    for (size_t i = 0; i < want.size(); ++i) {
        CHECK(got.seen[i].id == want[i].first);
        CHECK(got.seen[i].count == want[i].second);
    }
    CHECK(got.repeat == 1.0f);
    CHECK(got.frequency == 0.5f);
    p.frequency_penalty = 0.0f;   // every penalty off: nothing to apply
    CHECK(penalties_of(hist, p).seen.empty());
}

TEST_CASE("sampling from the best candidates equals sampling from the whole row: tokens, probabilities, RNG") {
    // The backend's path (Backend::top_logits, then sample_top) against sample() on the row, over random
    // rows and parameters; the candidates come shuffled, since their order must not matter.
    std::mt19937_64 rng(99);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    int compared = 0, drawn_differently = 0;
    for (int round = 0; round < 400; ++round) {
        CAPTURE(round);
        const size_t n = 1 + static_cast<size_t>(u(rng) * (u(rng) < 0.2 ? 60 : 3000));
        SamplingParams p;
        p.temp = u(rng) < 0.2 ? 0.0f : static_cast<float>(0.2 + u(rng) * 1.8);
        p.top_k = 1 + static_cast<int32_t>(u(rng) * kMaxTopCandidates);
        p.top_p = u(rng) < 0.3 ? 1.0f : static_cast<float>(0.3 + u(rng) * 0.7);
        p.min_p = u(rng) < 0.3 ? 0.0f : static_cast<float>(u(rng) * 0.2);
        p.repeat_penalty = u(rng) < 0.4 ? 1.0f : static_cast<float>(0.8 + u(rng));
        p.frequency_penalty = u(rng) < 0.5 ? 0.0f : static_cast<float>(u(rng) - 0.3);
        p.presence_penalty = u(rng) < 0.5 ? 0.0f : static_cast<float>(u(rng) - 0.3);
        p.repeat_last_n = u(rng) < 0.2 ? -1 : static_cast<int32_t>(u(rng) * 100);
        p.seed = rng();
        CAPTURE(n);
        CAPTURE(p.temp);
        CAPTURE(p.top_k);
        Sampler whole(p), top(p);
        REQUIRE(top.candidates_needed() == (p.temp <= 0.0f ? 1 : p.top_k));
        std::vector<float> row(n);
        const bool coarse = u(rng) < 0.5;   // exact ties everywhere
        std::vector<int32_t> history;
        for (int i = 0; i < 10; ++i) history.push_back(static_cast<int32_t>(u(rng) * static_cast<double>(n)));
        for (int step = 0; step < 8; ++step) {
            for (float& v : row) {
                v = coarse ? static_cast<float>(std::floor(u(rng) * 24.0) / 4.0 - 3.0)
                           : static_cast<float>((u(rng) - 0.5) * 12.0);
                const double special = u(rng);
                if (special < 0.01) v = NAN;
                else if (special < 0.02) v = -INFINITY;
                else if (special < 0.025) v = -0.0f;
            }
            std::vector<LogitCandidate> cand(static_cast<size_t>(top.candidates_needed()));
            cand.resize(select_top_logits(row, penalties_of(history, p), cand));
            std::shuffle(cand.begin(), cand.end(), rng);
            const std::vector<TokenProb> want = whole.distribution(row, history), got = top.distribution_top(cand);
            REQUIRE(got.size() == want.size());
            for (size_t i = 0; i < got.size(); ++i) {
                CHECK(got[i].id == want[i].id);
                CHECK(__builtin_bit_cast(uint32_t, got[i].p) == __builtin_bit_cast(uint32_t, want[i].p));
            }
            const int32_t a = whole.sample(row, history), b = top.sample_top(cand);
            REQUIRE(a == b);
            drawn_differently += want.size() > 1 && a != want[0].id;
            ++compared;
            history.push_back(a);
        }
        CHECK(whole.uniform() == top.uniform());   // the same number of draws on both sides
    }
    CHECK(compared == 3200);
    CHECK(drawn_differently > 100);   // the draws were real draws, not forced
}
