// token_logprobs (engine/generation/token_logprobs.h) against a long-double softmax of random logit rows.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine/generation/token_logprobs.h"

using namespace tern;

namespace {

std::vector<float> random_row(size_t n, uint32_t seed, float spread) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, spread);
    std::vector<float> row(n);
    for (float& v : row) v = d(rng);
    return row;
}

long double reference_lse(const std::vector<float>& row) {
    long double sum = 0.0L;
    for (float l : row) sum += std::exp(static_cast<long double>(l));
    return std::log(sum);
}

} // namespace

TEST_CASE("log-probabilities are logit minus the row's log-sum-exp, top tokens most likely first") {
    for (size_t n : {1u, 7u, 512u, 32000u, 151936u}) {
        for (float spread : {0.5f, 8.0f}) {
            CAPTURE(n);
            CAPTURE(spread);
            const std::vector<float> row = random_row(n, static_cast<uint32_t>(n), spread);
            const long double lse = reference_lse(row);
            const int32_t token = static_cast<int32_t>(n / 3);
            const TokenLogprobs lp = token_logprobs(row, token, 10);
            CHECK(lp.token == token);
            CHECK(std::fabs(lp.logprob - static_cast<double>(row[static_cast<size_t>(token)] - lse)) < 1e-5);
            REQUIRE(lp.top.size() == std::min<size_t>(10, n));
            std::vector<float> sorted = row;
            std::sort(sorted.begin(), sorted.end(), std::greater<>());
            for (size_t i = 0; i < lp.top.size(); ++i) {
                CHECK(row[static_cast<size_t>(lp.top[i].id)] == sorted[i]);
                CHECK(std::fabs(lp.top[i].logprob - static_cast<double>(sorted[i] - lse)) < 1e-5);
            }
        }
    }
}

TEST_CASE("the probabilities of the whole row sum to one, also with large logits") {
    std::vector<float> row = random_row(4096, 5, 3.0f);
    for (float& v : row) v += 1000.0f;   // exp(1000) overflows unless the maximum is taken out first
    const TokenLogprobs lp = token_logprobs(row, 0, row.size());
    double sum = 0.0;
    for (const TokenLogprob& t : lp.top) sum += std::exp(static_cast<double>(t.logprob));
    CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    CHECK(lp.top.front().logprob <= 0.0f);
}

TEST_CASE("ties list the lower id first; -inf logits get -inf; a token outside the row is refused") {
    const std::vector<float> row = {1.0f, 3.0f, -INFINITY, 3.0f, 0.0f};
    const TokenLogprobs lp = token_logprobs(row, 2, 5);
    REQUIRE(lp.top.size() == 5);
    CHECK(lp.top[0].id == 1);
    CHECK(lp.top[1].id == 3);
    CHECK(lp.top[0].logprob == lp.top[1].logprob);
    CHECK(lp.top[4].id == 2);
    CHECK(std::isinf(lp.logprob));
    CHECK(lp.logprob < 0.0f);
    CHECK(token_logprobs(row, 1, 0).top.empty());
    CHECK_THROWS_AS(token_logprobs(row, 5, 1), std::invalid_argument);
    CHECK_THROWS_AS(token_logprobs(row, -1, 1), std::invalid_argument);
}
