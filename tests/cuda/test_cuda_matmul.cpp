// kernels/cuda/matmul.h through the CUDA emulator: matmul against a double-precision product of the CPU
// reference dequantization (quant/reference.h), and embed_rows bit for bit against dequantize_row (times
// the scale, as the CPU embedding does), for every format matmul_supports, at ragged sizes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/matmul.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/cuda_device_array.h"
#include "tests/cuda_matmul_test_data.h"
#include "tests/kernel_test_data.h"

using tern::GgmlType;
using tern::test::DeviceArray;
using tern::test::dequantize;
using tern::test::is_plain;
using tern::test::kMatmulFormats;
using tern::test::quantized_normal;
using tern::test::random_codes;

namespace {

// Row lengths per format: one block, a few blocks and a long row; the plain formats also a ragged
// length (the element-wise path) and one that is a multiple of 8 but not of 32.
std::vector<int64_t> row_lengths(GgmlType type) {
    if (is_plain(type)) return {1, 37, 8, 264, 2048};
    if (tern::block_elems(type) == 256) return {256, 768, 2048};
    return {32, 96, 2048};
}

struct MatmulError {
    double worst = 0.0;   // max over outputs of |y - ref| / (sum |w x| + |bias|)
    double largest_ref = 0.0;
};

// y (n_cols, n_out) against the double product of the dequantized rows w (n_out, n_in) and x.
MatmulError compare_matmul(const std::vector<float>& y, const std::vector<float>& w, const std::vector<float>& x,
                           const float* bias, int64_t n_in, int64_t n_out, int64_t n_cols) {
    MatmulError e;
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t r = 0; r < n_out; ++r) {
            double ref = bias ? bias[r] : 0.0, mag = bias ? std::fabs(bias[r]) : 0.0;
            for (int64_t i = 0; i < n_in; ++i) {
                const double p = static_cast<double>(w[static_cast<size_t>(r * n_in + i)]) *
                                 static_cast<double>(x[static_cast<size_t>(c * n_in + i)]);
                ref += p;
                mag += std::fabs(p);
            }
            const double got = y[static_cast<size_t>(c * n_out + r)];
            const double err = std::isnan(got) ? INFINITY : std::fabs(got - ref) / (mag > 0.0 ? mag : 1.0);
            e.worst = std::max(e.worst, err);
            e.largest_ref = std::max(e.largest_ref, std::fabs(ref));
        }
    return e;
}

// Tolerance for matmul, relative to the output's scale sum |w_i x_i| (+ |bias|): the dequantized weights
// are the reference's exactly (embed_rows proves it), so only the f32 summation differs. Any f32 sum of
// products whose additions nest at most D deep is within (D + 1) * 2^-24 * sum |w_i x_i| of the exact
// value (one rounding per product, one per level); the kernel's lanes each add n_in / 32 products, five
// shuffle levels join the lanes and one more adds the bias: D <= 2048 / 32 + 6 = 70 here, so the bound is
// 4.3e-6. A wrong code, scale or column shifts one output by a whole term, about 1 / n_in >= 5e-4 of it.
constexpr double kMatmulTolerance = 1e-5;

void check_matmul(GgmlType type, int64_t n_in, const std::vector<uint8_t>& w_bytes, const std::vector<float>& w,
                  uint32_t seed) {
    constexpr int64_t kMaxOut = 130, kMaxCols = 17;
    const std::vector<float> x = tern::test::random_normal(static_cast<size_t>(kMaxCols * n_in), seed + 1);
    const std::vector<float> bias = tern::test::random_normal(kMaxOut, seed + 2);
    const DeviceArray<uint8_t> dw(w_bytes);
    const DeviceArray<float> dx(x), dbias(bias);
    constexpr int64_t kOuts[] = {1, 7, 33, 130}, kCols[] = {1, 2, 3, 8, 9, 17};
    for (size_t io = 0; io < std::size(kOuts); ++io)
        for (size_t ic = 0; ic < std::size(kCols); ++ic) {
            const int64_t n_out = kOuts[io], n_cols = kCols[ic];
            const bool with_bias = (io + ic) % 2 == 1;   // a checkerboard: every size runs with and without
            CAPTURE(n_out);
            CAPTURE(n_cols);
            CAPTURE(with_bias);
            const std::vector<float> y = tern::test::guarded_output(n_cols * n_out, [&](float* dy) {
                tern::cuda::matmul(type, dw.get(), n_in, n_out, dx.get(), n_cols, with_bias ? dbias.get() : nullptr,
                                   dy, nullptr);
            });
            const MatmulError e = compare_matmul(y, w, x, with_bias ? bias.data() : nullptr, n_in, n_out, n_cols);
            REQUIRE(e.largest_ref > 0.0);
            REQUIRE(e.worst <= kMatmulTolerance);
        }
}

} // namespace

TEST_CASE("matmul_supports lists exactly the formats matmul and embed_rows read") {
    for (const tern::TypeInfo& ti : tern::all_types()) {
        CAPTURE(ti.name);
        const bool listed = std::ranges::find(kMatmulFormats, ti.type) != std::end(kMatmulFormats);
        CHECK(tern::cuda::matmul_supports(ti.type) == listed);
    }
    CHECK_FALSE(tern::cuda::matmul_supports(static_cast<GgmlType>(4)));   // a removed ggml id
}

TEST_CASE("matmul matches the double product of the reference dequantization, every format and shape") {
    uint32_t seed = 100;
    for (GgmlType type : kMatmulFormats) {
        CAPTURE(tern::type_name(type));
        for (int64_t n_in : row_lengths(type)) {
            CAPTURE(n_in);
            seed += 10;
            const std::vector<uint8_t> w_bytes = quantized_normal(type, 130, n_in, seed);
            check_matmul(type, n_in, w_bytes, dequantize(type, w_bytes, 130, n_in), seed);
        }
    }
}

TEST_CASE("matmul reads every code and scale bit: random block contents") {
    uint32_t seed = 900;
    for (GgmlType type : kMatmulFormats) {
        if (is_plain(type)) continue;   // random float bits span 2^-126 .. 2^127: the products overflow
        CAPTURE(tern::type_name(type));
        const int64_t n_in = 2 * tern::block_elems(type);
        const std::vector<uint8_t> w_bytes = random_codes(type, 130, n_in, ++seed);
        check_matmul(type, n_in, w_bytes, dequantize(type, w_bytes, 130, n_in), seed);
    }
}

TEST_CASE("embed_rows is dequantize_row times the scale, bit for bit") {
    constexpr int64_t kVocab = 40, kTokens = 13;
    uint32_t seed = 2000;
    std::vector<int32_t> tokens(kTokens);
    std::mt19937 rng(7);
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % kVocab);
    tokens[3] = tokens[9];          // a repeated token
    tokens[kTokens - 1] = kVocab - 1;   // the last row
    const DeviceArray<int32_t> dtokens(tokens);
    for (GgmlType type : kMatmulFormats) {
        CAPTURE(tern::type_name(type));
        for (int64_t dim : row_lengths(type))
            for (bool random_bits : {false, true}) {
                CAPTURE(dim);
                CAPTURE(random_bits);
                const std::vector<uint8_t> table = random_bits ? random_codes(type, kVocab, dim, ++seed)
                                                               : quantized_normal(type, kVocab, dim, ++seed);
                const std::vector<float> rows = dequantize(type, table, kVocab, dim);
                const DeviceArray<uint8_t> dtable(table);
                // gemma scales by sqrt(dim) (engine/model_config.cpp); 1 leaves the values as dequantized.
                for (float scale : {1.0f, std::sqrt(2048.0f)}) {
                    CAPTURE(scale);
                    DeviceArray<float> dx(std::vector<float>(static_cast<size_t>(kTokens * dim), NAN));
                    tern::cuda::embed_rows(type, dtable.get(), dim, dtokens.get(), kTokens, scale, dx.get(), nullptr);
                    const std::vector<float> x = dx.read();
                    size_t mismatches = 0;
                    for (int64_t i = 0; i < kTokens; ++i)
                        for (int64_t d = 0; d < dim; ++d) {
                            float want = rows[static_cast<size_t>(tokens[static_cast<size_t>(i)] * dim + d)];
                            if (scale != 1.0f) want *= scale;
                            const float got = x[static_cast<size_t>(i * dim + d)];
                            const bool same = std::isnan(want) ? std::isnan(got)
                                                               : tern::f32_bits(got) == tern::f32_bits(want);
                            mismatches += !same;
                        }
                    CHECK(mismatches == 0);
                }
            }
    }
}

TEST_CASE("matmul and embed_rows refuse what they cannot read") {
    const DeviceArray<uint8_t> w(4096);
    const DeviceArray<float> x(1024), y(1024);
    const DeviceArray<int32_t> tokens(std::vector<int32_t>{0});
    using tern::cuda::embed_rows;
    using tern::cuda::matmul;
    CHECK_THROWS_AS(matmul(GgmlType::Q8_K, w.get(), 256, 1, x.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul(GgmlType::Q4_K, w.get(), 128, 1, x.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul(GgmlType::Q4_0, w.get() + 2, 32, 1, x.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul(GgmlType::Q4_0, w.get(), 32, 1, x.get() + 1, 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(embed_rows(GgmlType::IQ2_XXS, w.get(), 256, tokens.get(), 1, 1.0f, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(embed_rows(GgmlType::Q5_0, w.get(), 48, tokens.get(), 1, 1.0f, y.get(), nullptr),
                    std::invalid_argument);
    // Nothing to do is not an error.
    CHECK_NOTHROW(matmul(GgmlType::Q4_0, w.get(), 32, 0, x.get(), 1, nullptr, y.get(), nullptr));
    CHECK_NOTHROW(matmul(GgmlType::Q4_0, w.get(), 32, 1, x.get(), 0, nullptr, y.get(), nullptr));
    CHECK_NOTHROW(embed_rows(GgmlType::F16, w.get(), 64, tokens.get(), 0, 1.0f, y.get(), nullptr));
}
