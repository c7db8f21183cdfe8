// Held-out selection of --calibrate (quant/imatrix_select.h): a fit importance that overfits (it
// spends the precision on columns that are quiet in the held-out activations) loses on them and
// the tensor keeps the reference quantizer; one that matches them wins and keeps the weighted
// form. And the score is the output error dw^T M dw, checked against a direct computation.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/imatrix_select.h"
#include "quant/reference.h"
#include "quant/types.h"

using namespace tern;

namespace {

std::vector<float> diagonal(const std::vector<float>& d) {
    const size_t n = d.size();
    std::vector<float> m(n * n, 0.0f);
    for (size_t i = 0; i < n; ++i) m[i * n + i] = d[i];
    return m;
}

// Rows of random weights scored with one fit importance and one held-out moment matrix.
HeldOutErrors score(GgmlType t, int64_t width, const std::vector<float>& fit, const std::vector<float>& check_moments,
                    uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    HeldOutErrors sum;
    std::vector<float> row(static_cast<size_t>(width));
    for (int r = 0; r < 16; ++r) {
        for (float& v : row) v = 0.02f * gauss(rng);
        sum += held_out_errors(t, row.data(), width, fit.data(), check_moments.data());
    }
    return sum;
}

} // namespace

TEST_CASE("held-out selection: an overfit importance keeps the reference, a matching one the weighted form") {
    for (const GgmlType t : {GgmlType::Q4_0, GgmlType::Q3_K, GgmlType::Q2_K}) {
        for (const int64_t width : {int64_t{256}, int64_t{512}}) {
            std::mt19937 rng(static_cast<uint32_t>(5 + width));
            std::normal_distribution<float> gauss(0.0f, 1.0f);
            std::vector<float> held_out(static_cast<size_t>(width));
            for (float& v : held_out) v = std::exp(1.5f * gauss(rng));
            const std::vector<float> moments = diagonal(held_out);
            // Overfit: the fit half saw loud activations exactly where the held-out half is quietest.
            std::vector<float> overfit(held_out.size());
            for (size_t c = 0; c < overfit.size(); ++c) overfit[c] = 1.0f / (held_out[c] * held_out[c]);
            const HeldOutErrors bad = score(t, width, overfit, moments, 77);
            INFO(type_name(t) << " width " << width << ": overfit " << bad.weighted / bad.reference);
            CHECK(bad.weighted > bad.reference);
            CHECK_FALSE(bad.keep_weighted());
            // Matching: the fit half's importance is a noisy copy of the held-out one.
            std::vector<float> close(held_out.size());
            for (size_t c = 0; c < close.size(); ++c) close[c] = held_out[c] * std::exp(0.2f * gauss(rng));
            const HeldOutErrors good = score(t, width, close, moments, 78);
            INFO(type_name(t) << " width " << width << ": matching " << good.weighted / good.reference);
            CHECK(good.weighted < good.reference);
            CHECK(good.keep_weighted());
        }
    }
}

TEST_CASE("held-out selection: the score is dw^T M dw with the full moment matrix") {
    const int64_t width = 64;
    std::mt19937 rng(3);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(width)), fit(row.size(), 1.0f);
    for (float& v : row) v = gauss(rng);
    // M = a a^T + I: correlated columns, so the off-diagonal terms count.
    std::vector<float> a(row.size()), m(row.size() * row.size());
    for (float& v : a) v = gauss(rng);
    for (int64_t i = 0; i < width; ++i)
        for (int64_t j = 0; j < width; ++j) m[static_cast<size_t>(i * width + j)] = a[i] * a[j] + (i == j ? 1.0f : 0.0f);
    std::vector<uint8_t> q(row_bytes(GgmlType::Q4_0, width));
    std::vector<float> back(row.size());
    quantize_row(GgmlType::Q4_0, row.data(), q.data(), width);
    dequantize_row(GgmlType::Q4_0, q.data(), back.data(), width);
    double sq = 0.0, proj = 0.0;
    for (size_t i = 0; i < row.size(); ++i) {
        const double d = static_cast<double>(row[i]) - back[i];
        sq += d * d;
        proj += a[i] * d;
    }
    const HeldOutErrors e = held_out_errors(GgmlType::Q4_0, row.data(), width, fit.data(), m.data());
    CHECK(e.reference > 0.0);
    CHECK(e.reference == doctest::Approx(sq + proj * proj).epsilon(1e-6));
}

TEST_CASE("held-out selection: a tie (an all-zero tensor) keeps the reference bytes") {
    const HeldOutErrors zero;
    CHECK_FALSE(zero.keep_weighted());
    std::vector<float> row(32, 0.0f), fit(32, 1.0f), m(32 * 32, 0.0f);
    for (int i = 0; i < 32; ++i) m[static_cast<size_t>(i * 33)] = 1.0f;
    const HeldOutErrors e = held_out_errors(GgmlType::Q4_0, row.data(), 32, fit.data(), m.data());
    CHECK(e.reference == 0.0);
    CHECK(e.weighted == 0.0);
    CHECK_FALSE(e.keep_weighted());
}
