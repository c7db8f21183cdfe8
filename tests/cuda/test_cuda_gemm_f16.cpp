// kernels/cuda/gemm_f16.h and blas.h's gemm_f16 through the CUDA emulator (or a GPU with TERN_CUDA_TESTS=device):
// weight rows dequantized to f16 bit for bit as the reference dequantizer's values (quant/reference.h) rounded
// to f16 (saturating past 65504), for every format the path reads, at edge and ragged sizes; the activations'
// conversion likewise; and the f16 GEMM against double-precision products, both of the f16 values it was given
// (only f32 accumulation may differ) and of the f32 values before rounding (the f16 roundings' bound on top).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "kernels/cuda/blas.h"
#include "kernels/cuda/gemm_f16.h"
#include "kernels/cuda/matmul.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/cuda_device_array.h"
#include "tests/cuda_matmul_test_data.h"
#include "tests/kernel_test_data.h"
#include "tests/quick_mode.h"

using tern::GgmlType;
using namespace tern::test;

namespace {

constexpr double kU32 = 0x1p-24;   // f32 unit roundoff
constexpr double kU16 = 0x1p-11;   // f16 unit roundoff

// Every format the f16 path reads: matmul's but F32 and BF16.
std::vector<GgmlType> f16_formats() {
    std::vector<GgmlType> out;
    for (GgmlType t : kMatmulFormats)
        if (t != GgmlType::F32 && t != GgmlType::BF16) out.push_back(t);
    return out;
}

// gemm_f16.h's conversion: round to nearest even, finite values past 65504 saturated.
uint16_t reference_f16(float v) {
    const float a = std::fabs(v);
    if (a > 65504.0f && std::isfinite(a)) v = v < 0.0f ? -65504.0f : 65504.0f;
    return tern::f32_to_f16(v);
}
bool is_nan_f16(uint16_t h) { return (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0; }

// Positions where got and want differ (both NaN counts as equal: the device writes a canonical NaN).
int64_t mismatches(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want) {
    REQUIRE(got.size() == want.size());
    int64_t bad = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != want[i] && !(is_nan_f16(got[i]) && is_nan_f16(want[i]))) {
            if (bad == 0)
                MESSAGE("first mismatch at " << i << ": got 0x" << std::hex << got[i] << ", want 0x" << want[i]);
            ++bad;
        }
    return bad;
}

std::vector<uint16_t> reference_f16(const std::vector<float>& v) {
    std::vector<uint16_t> out(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = reference_f16(v[i]);
    return out;
}

std::vector<float> f16_values(const std::vector<uint16_t>& h) {
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = tern::f16_to_f32(h[i]);
    return out;
}

// Rows first .. first + rows - 1 of the n_rows in `bytes` through dequantize_rows_f16, against the reference.
void check_dequantize(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n_rows, int64_t n_in, int64_t first,
                      int64_t rows) {
    CAPTURE(first);
    CAPTURE(rows);
    const std::vector<float> values = dequantize(type, bytes, n_rows, n_in);
    const std::vector<float> want_rows(values.begin() + first * n_in, values.begin() + (first + rows) * n_in);
    const DeviceArray<uint8_t> dw(bytes);
    // A guard of sentinels past the rows: nothing may be written there.
    std::vector<uint16_t> init(static_cast<size_t>(rows * n_in + 8), 0x7BFFu);
    DeviceArray<uint16_t> out(init);
    tern::cuda::dequantize_rows_f16(type, dw.get(), n_in, first, rows, out.get(), nullptr);
    std::vector<uint16_t> got = out.read();
    for (size_t i = static_cast<size_t>(rows * n_in); i < got.size(); ++i) REQUIRE(got[i] == 0x7BFFu);
    got.resize(static_cast<size_t>(rows * n_in));
    CHECK(mismatches(got, reference_f16(want_rows)) == 0);
}

// Row lengths per format: one block (the edge), several, and past one launch block of slices (256 slices).
std::vector<int64_t> row_lengths(GgmlType type) {
    if (type == GgmlType::F16)
        return quick_mode() ? std::vector<int64_t>{1, 7, 96} : std::vector<int64_t>{1, 7, 96, 2056};
    const int64_t b = tern::block_elems(type);
    if (quick_mode()) return {b, 3 * b};
    return {b, 3 * b, (2048 / b + 1) * b};
}

// The largest |got - want| over M_i = sum |w x| (+ |bias|) per output, each measured against its own M_i.
struct Reference {
    std::vector<double> y, magnitude;
};
Reference reference_product(const std::vector<float>& w, const std::vector<float>& x, const std::vector<float>* bias,
                            int64_t n_in, int64_t n_out, int64_t n_cols) {
    Reference r;
    r.y.resize(static_cast<size_t>(n_out * n_cols));
    r.magnitude.resize(r.y.size());
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t o = 0; o < n_out; ++o) {
            double s = 0.0, m = 0.0;
            for (int64_t i = 0; i < n_in; ++i) {
                const double p = static_cast<double>(w[static_cast<size_t>(o * n_in + i)]) *
                                 static_cast<double>(x[static_cast<size_t>(c * n_in + i)]);
                s += p;
                m += std::fabs(p);
            }
            if (bias) {
                s += (*bias)[static_cast<size_t>(o)];
                m += std::fabs((*bias)[static_cast<size_t>(o)]);
            }
            r.y[static_cast<size_t>(c * n_out + o)] = s;
            r.magnitude[static_cast<size_t>(c * n_out + o)] = m;
        }
    return r;
}
double worst_error(const std::vector<float>& y, const Reference& r) {
    REQUIRE(y.size() == r.y.size());
    double worst = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
        REQUIRE(std::isfinite(y[i]));
        const double m = std::max(r.magnitude[i], 1e-30);
        worst = std::max(worst, std::fabs(static_cast<double>(y[i]) - r.y[i]) / m);
    }
    return worst;
}

// f32 sums of exact products (two f16 values multiply exactly in f32): one rounding per term plus the bias
// add, doubled for margin (tensor cores may truncate rather than round their internal sums).
double tolerance_f32_sums(int64_t n_in) { return 2.0 * static_cast<double>(n_in + 2) * kU32; }
// Against the unrounded f32 values: each product's two factors rounded to f16 once (relative 2^-11 each).
double tolerance_f16_inputs(int64_t n_in) { return 2.0 * kU16 + kU16 * kU16 + tolerance_f32_sums(n_in); }

// Random activations of mixed magnitude, n_cols columns of n_in.
std::vector<float> activations(int64_t n_cols, int64_t n_in, uint32_t seed) {
    std::vector<float> x = random_normal(static_cast<size_t>(n_cols * n_in), seed);
    std::mt19937 rng(seed ^ 0xA5u);
    std::uniform_real_distribution<float> log_scale(-2.0f, 2.0f);
    for (int64_t c = 0; c < n_cols; ++c) {
        const float s = std::pow(10.0f, log_scale(rng));
        for (int64_t i = 0; i < n_in; ++i) x[static_cast<size_t>(c * n_in + i)] *= s;
    }
    return x;
}

// matmul_gemm_f16 of the first n_out rows of `bytes` with scratch for `scratch_rows` rows (0: the F16 path,
// which takes none), against the double products.
void check_matmul_gemm_f16(GgmlType type, const std::vector<uint8_t>& bytes, int64_t n_in, int64_t n_out,
                           int64_t n_cols, int64_t scratch_rows, bool with_bias, uint32_t seed) {
    CAPTURE(n_out);
    CAPTURE(n_cols);
    CAPTURE(scratch_rows);
    CAPTURE(with_bias);
    const std::vector<float> w = dequantize(type, bytes, n_out, n_in);
    const std::vector<float> x = activations(n_cols, n_in, seed);
    const std::vector<float> bias = random_normal(static_cast<size_t>(n_out), seed + 1);
    const std::vector<uint16_t> xh = reference_f16(x);
    const DeviceArray<uint8_t> dw(bytes);
    const DeviceArray<float> dx(x), db(bias);
    DeviceArray<uint16_t> dxh(xh.size());
    tern::cuda::convert_to_f16(dx.get(), n_cols * n_in, dxh.get(), nullptr);
    CHECK(mismatches(dxh.read(), xh) == 0);
    const int64_t scratch_elems = std::max<int64_t>(scratch_rows * n_in, 1);
    DeviceArray<uint16_t> scratch(static_cast<size_t>(scratch_elems));
    const std::vector<float> y = guarded_output(n_cols * n_out, [&](float* dy) {
        tern::cuda::matmul_gemm_f16(type, dw.get(), n_in, n_out, dxh.get(), n_cols, with_bias ? db.get() : nullptr, dy,
                                    scratch.get(), scratch_elems, nullptr);
    });
    const std::vector<float>* b = with_bias ? &bias : nullptr;
    const Reference of_f16 = reference_product(f16_values(reference_f16(w)), f16_values(xh), b, n_in, n_out, n_cols);
    CHECK(worst_error(y, of_f16) <= tolerance_f32_sums(n_in));
    CHECK(worst_error(y, reference_product(w, x, b, n_in, n_out, n_cols)) <= tolerance_f16_inputs(n_in));
}

} // namespace

TEST_CASE("dequantize_rows_f16 is the reference dequantization rounded to f16, bit for bit, in every format") {
    uint32_t seed = 300;
    for (GgmlType type : f16_formats()) {
        CAPTURE(tern::type_name(type));
        for (int64_t n_in : row_lengths(type)) {
            CAPTURE(n_in);
            const std::vector<uint8_t> normal = quantized_normal(type, 9, n_in, ++seed);
            check_dequantize(type, normal, 9, n_in, 0, 9);
            check_dequantize(type, normal, 9, n_in, 3, 5);   // rows past the first: blocks at any offset
            check_dequantize(type, random_codes(type, 4, n_in, ++seed), 4, n_in, 1, 1);
        }
    }
}

TEST_CASE("dequantize_rows_f16 saturates weights past f16's range instead of making infinities") {
    // Q8_0 with d = 60000: codes of +-127 give +-7.6e6, codes of 1 give 60000 (in range, kept).
    const int64_t n_in = 32;
    std::vector<uint8_t> block(tern::row_bytes(GgmlType::Q8_0, n_in));
    const uint16_t d = tern::f32_to_f16(60000.0f);
    std::memcpy(block.data(), &d, 2);
    const int8_t codes[4] = {127, -127, 1, -1};
    for (int i = 0; i < 32; ++i) block[2 + i] = static_cast<uint8_t>(codes[i % 4]);
    const DeviceArray<uint8_t> dw(block);
    DeviceArray<uint16_t> out(32);
    tern::cuda::dequantize_rows_f16(GgmlType::Q8_0, dw.get(), n_in, 0, 1, out.get(), nullptr);
    const std::vector<uint16_t> got = out.read();
    for (int i = 0; i < 32; ++i) {
        CAPTURE(i);
        const float v = tern::f16_to_f32(got[static_cast<size_t>(i)]);
        const float want = i % 4 == 0 ? 65504.0f : i % 4 == 1 ? -65504.0f : i % 4 == 2 ? 60000.0f : -60000.0f;
        CHECK(v == want);
    }
}

TEST_CASE("convert_to_f16 rounds to nearest even and saturates, bit for bit the host conversion") {
    std::vector<float> x = random_normal(3000, 77, 30.0f);
    // Ties at f16's precision, subnormal and underflowing results, the range's edge and past it, infinities,
    // NaN and signed zeros.
    const float specials[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -(2.0f + 0x1p-10f), 0x1p-20f, -0x1p-25f, 0x1p-26f,
                              65504.0f, 65519.0f, 65520.0f, -70000.0f, 1e30f, -std::numeric_limits<float>::max(),
                              std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                              std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f, 6.1e-5f, 5.96e-8f};
    x.insert(x.end(), std::begin(specials), std::end(specials));
    for (const int64_t count : {int64_t{1}, int64_t{255}, static_cast<int64_t>(x.size())}) {
        CAPTURE(count);
        const std::vector<float> part(x.end() - count, x.end());
        const DeviceArray<float> dx(part);
        std::vector<uint16_t> init(static_cast<size_t>(count + 4), 0x1234u);
        DeviceArray<uint16_t> dy(init);
        tern::cuda::convert_to_f16(dx.get(), count, dy.get(), nullptr);
        std::vector<uint16_t> got = dy.read();
        for (int64_t i = count; i < count + 4; ++i) REQUIRE(got[static_cast<size_t>(i)] == 0x1234u);
        got.resize(static_cast<size_t>(count));
        CHECK(mismatches(got, reference_f16(part)) == 0);
    }
    CHECK(reference_f16(70000.0f) == 0x7BFFu);   // the reference itself: saturated, not inf
    CHECK(reference_f16(std::numeric_limits<float>::infinity()) == 0x7C00u);
}

TEST_CASE("gemm_f16 sums the exact products of f16 values in f32") {
    const int64_t n_in = 200, n_out = 37, n_cols = 19;
    const std::vector<uint16_t> w = reference_f16(random_normal(static_cast<size_t>(n_out * n_in), 11));
    const std::vector<uint16_t> x = reference_f16(activations(n_cols, n_in, 12));
    const DeviceArray<uint16_t> dw(w), dx(x);
    // ldy wider than n_out: the block of a wider output, the columns past it untouched.
    const int64_t ldy = n_out + 5;
    const std::vector<float> y = guarded_output(n_cols * ldy, [&](float* dy) {
        REQUIRE(cudaMemset(dy, 0, static_cast<size_t>(n_cols * ldy) * sizeof(float)) == cudaSuccess);
        tern::cuda::gemm_f16(dw.get(), n_out, n_in, dx.get(), n_cols, dy, ldy, nullptr);
    });
    const Reference want = reference_product(f16_values(w), f16_values(x), nullptr, n_in, n_out, n_cols);
    std::vector<float> packed;
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t o = 0; o < ldy; ++o) {
            const float v = y[static_cast<size_t>(c * ldy + o)];
            if (o < n_out) packed.push_back(v);
            else CHECK(v == 0.0f);
        }
    CHECK(worst_error(packed, want) <= tolerance_f32_sums(n_in));
}

TEST_CASE("matmul_gemm_f16 equals the double product of its f16 inputs, in blocks of rows, in every format") {
    uint32_t seed = 500;
    for (GgmlType type : f16_formats()) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = type == GgmlType::F16 ? 100 : 2 * tern::block_elems(type);
        CAPTURE(n_in);
        const int64_t n_out = 70;
        const std::vector<uint8_t> w = quantized_normal(type, n_out, n_in, ++seed);
        // Scratch for 5 rows (blocks of 4, the last of 2), 66 (one block of 64 and one of 6), all of them.
        for (const int64_t rows : {int64_t{5}, int64_t{66}, n_out})
            check_matmul_gemm_f16(type, w, n_in, n_out, 17, rows, rows == 66, ++seed);
        seed += 2;
        check_matmul_gemm_f16(type, random_codes(type, 9, n_in, seed), n_in, 9, 16, 9, true, seed + 1);
    }
}

TEST_CASE("the f16 path refuses F32, BF16, ragged rows and misaligned pointers") {
    const DeviceArray<uint8_t> w(8192);
    DeviceArray<uint16_t> out(8192);
    using tern::cuda::dequantize_rows_f16;
    for (const GgmlType t : {GgmlType::F32, GgmlType::BF16}) {
        CHECK_FALSE(tern::cuda::gemm_f16_supports(t));
        CHECK_THROWS_AS(dequantize_rows_f16(t, w.get(), 64, 0, 1, out.get(), nullptr), std::invalid_argument);
    }
    for (const GgmlType t : f16_formats()) CHECK(tern::cuda::gemm_f16_supports(t));
    CHECK_THROWS_AS(dequantize_rows_f16(GgmlType::Q4_K, w.get(), 255, 0, 1, out.get(), nullptr), std::invalid_argument);
    CHECK_THROWS_AS(dequantize_rows_f16(GgmlType::Q8_0, w.get() + 2, 32, 0, 1, out.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(dequantize_rows_f16(GgmlType::Q8_0, w.get(), 32, 0, 1, out.get() + 1, nullptr),
                    std::invalid_argument);
    const DeviceArray<float> y(64);
    CHECK_THROWS_AS(tern::cuda::matmul_gemm_f16(GgmlType::Q8_0, w.get(), 64, 2, out.get(), 16, nullptr, y.get(),
                                                out.get(), 32, nullptr),
                    std::invalid_argument);   // scratch below one row
}
