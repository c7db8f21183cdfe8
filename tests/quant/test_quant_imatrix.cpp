// Importance-weighted Q2_K / Q3_K / Q4_0 (quant/imatrix.h): on random rows with random per-column
// importance, the weighted quantizers must give a smaller importance-weighted squared error than
// the reference quantizers (which ignore the importance), at several row lengths; and they must
// refuse what they cannot do.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "base/error.h"
#include "quant/half.h"
#include "quant/imatrix.h"
#include "quant/reference.h"
#include "quant/types.h"

using namespace tern;

namespace {

double weighted_error(GgmlType t, const std::vector<float>& x, const std::vector<float>& imp, bool use_importance) {
    const auto n = static_cast<int64_t>(x.size());
    std::vector<uint8_t> q(row_bytes(t, n));
    std::vector<float> y(x.size());
    if (use_importance) quantize_row_importance(t, x.data(), q.data(), n, imp.data());
    else quantize_row(t, x.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    double e = 0;
    for (size_t i = 0; i < x.size(); ++i) e += imp[i] * (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    return e;
}

} // namespace

TEST_CASE("importance-weighted q4_0: the Q4_0 layout, an all-zero block as the reference stores it") {
    // Codes and scale read back through the reference dequantizer; a zero block is d = 0, codes 8.
    std::vector<float> x(64, 0.0f), imp(64, 1.0f);
    std::mt19937 rng(9);
    std::normal_distribution<float> gauss(0.0f, 1.0f);
    for (int i = 32; i < 64; ++i) x[static_cast<size_t>(i)] = gauss(rng);
    std::vector<uint8_t> q(row_bytes(GgmlType::Q4_0, 64)), ref(q.size());
    quantize_row_importance(GgmlType::Q4_0, x.data(), q.data(), 64, imp.data());
    quantize_row(GgmlType::Q4_0, x.data(), ref.data(), 64);
    CHECK(std::equal(q.begin(), q.begin() + 18, ref.begin()));   // the zero block
    std::vector<float> y(64);
    dequantize_row(GgmlType::Q4_0, q.data(), y.data(), 64);
    // Every value within one step of its input (the fit may move a code off the nearest one).
    const float d = std::fabs(f16_to_f32(static_cast<uint16_t>(q[18] | (q[19] << 8))));
    CHECK(d > 0.0f);
    for (int i = 32; i < 64; ++i) CHECK(std::fabs(y[static_cast<size_t>(i)] - x[static_cast<size_t>(i)]) <= d);
}

TEST_CASE("importance-weighted q2_K / q3_K / q4_0 beat the reference on the weighted error") {
    for (const GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_0}) {
        REQUIRE(supports_importance(t));
        for (const int64_t n : {int64_t{256}, int64_t{1024}, int64_t{4096}}) {
            std::mt19937 rng(static_cast<uint32_t>(11 + n));
            std::normal_distribution<float> gauss(0.0f, 1.0f);
            // Log-normal importance (activations whose mean squares span ~3 orders of magnitude),
            // shared by all rows of the matrix as a calibration would give it.
            std::vector<float> imp(static_cast<size_t>(n));
            for (float& v : imp) v = std::exp(1.5f * gauss(rng));
            double plain = 0, weighted = 0;
            int rows_better = 0, rows = 0;
            for (int r = 0; r < 64; ++r, ++rows) {
                std::vector<float> x(static_cast<size_t>(n));
                for (float& v : x) v = 0.02f * gauss(rng);
                const double ep = weighted_error(t, x, imp, false), ew = weighted_error(t, x, imp, true);
                plain += ep;
                weighted += ew;
                rows_better += ew < ep;
            }
            INFO(type_name(t) << " n=" << n << ": weighted error / reference = " << weighted / plain << ", rows better "
                               << rows_better << "/" << rows);
            CHECK(weighted < 0.85 * plain);
            CHECK(rows_better >= rows * 3 / 4);
        }
    }
}

TEST_CASE("importance-weighted quantizers: uniform importance stays close to the reference") {
    // With every column equally important the weighted fit has no information the reference lacks:
    // its plain squared error must be within a few percent of the reference quantizer's.
    for (const GgmlType t : {GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_0}) {
        std::mt19937 rng(3);
        std::normal_distribution<float> gauss(0.0f, 1.0f);
        std::vector<float> x(4096), ones(4096, 1.0f);
        for (float& v : x) v = gauss(rng);
        const double ref = weighted_error(t, x, ones, false), w = weighted_error(t, x, ones, true);
        INFO(type_name(t) << ": uniform-importance error / reference = " << w / ref);
        CHECK(w < 1.05 * ref);
    }
}

TEST_CASE("importance-weighted quantizers refuse other types, odd widths and bad importance") {
    std::vector<float> x(256, 0.5f), imp(256, 1.0f);
    std::vector<uint8_t> q(row_bytes(GgmlType::Q4_K, 256));
    CHECK_FALSE(supports_importance(GgmlType::Q4_K));
    CHECK_THROWS_AS(quantize_row_importance(GgmlType::Q4_K, x.data(), q.data(), 256, imp.data()), InputError);
    CHECK_THROWS_AS(quantize_row_importance(GgmlType::Q3_K, x.data(), q.data(), 128, imp.data()), InputError);
    CHECK(supports_importance(GgmlType::Q4_0));
    CHECK_THROWS_AS(quantize_row_importance(GgmlType::Q4_0, x.data(), q.data(), 48, imp.data()), InputError);
    imp[7] = -1.0f;
    CHECK_THROWS_AS(quantize_row_importance(GgmlType::Q3_K, x.data(), q.data(), 256, imp.data()), InputError);
    imp[7] = NAN;
    CHECK_THROWS_AS(quantize_row_importance(GgmlType::Q2_K, x.data(), q.data(), 256, imp.data()), InputError);
}
