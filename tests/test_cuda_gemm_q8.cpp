// kernels/cuda/gemm_q8.h through the CUDA emulator (or a GPU with TERN_CUDA_TESTS=device): the int8
// tensor-core prefill matmul against matmul_q8 on the same quantized activations (the two differ only in f32
// rounding order) and against a double-precision product of the reference dequantization (quant/reference.h)
// and the dequantized activations, for every format it reads at ragged shapes, with random block contents
// and with the largest integer dot products there are.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/gemm_q8.h"
#include "kernels/cuda/matmul_q8.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/cuda_device_array.h"
#include "tests/kernel_test_data.h"

using tern::GgmlType;
using tern::test::DeviceArray;

namespace {

constexpr GgmlType kFormats[] = {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,   GgmlType::Q5_1,
                                 GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,   GgmlType::Q4_K,
                                 GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS};

constexpr double kU = 0x1p-24;   // f32 unit roundoff

// Whether the device runs gemm_q8 (compute capability 8.0+; the emulator reports 8.9). On an older GPU the
// product tests have nothing to run and the launcher must refuse.
bool device_runs_gemm_q8() {
    int device = 0;
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    return tern::cuda::gemm_q8_device_supported(device);
}

// TERN_TEST_QUICK=1: fewer shapes (the emulator's mma costs 16 shuffles a warp).
bool quick_mode() {
    const char* e = std::getenv("TERN_TEST_QUICK");
    return e && *e && std::string(e) != "0";
}

// ---- tolerances ------------------------------------------------------------------------------------
// Both relative to M = sum_i (|scale_i code_i| + |offset_i|) |x_i| (+ |bias|), the magnitude of the f32
// terms the kernels add (term_magnitudes). Integer dot products are exact in both kernels, so only f32
// roundings differ. gemm_q8 per 32-element block: d * D, + m * S and dx * (...) + acc, the last one also
// the block's place in one running sum of n_in / 32 terms; then the bias: (n_in / 32 + 3) * 2^-24 * M.
// matmul_q8 (its test): (n_in / 512 + 10) * 2^-24 * M. The reference's dequantization rounds each weight
// once more. Doubled for margin: 2.6e-6 against matmul_q8 at n_in = 256, 5.5e-6 at 768. A code, scale or
// block read wrongly moves an output by a whole term, about 1 / n_in of M or more (4e-3 at n_in = 256).
double tolerance_vs_matmul_q8(int64_t n_in) {
    return 2.0 * (static_cast<double>(n_in) / 32.0 + 3.0 + static_cast<double>(n_in) / 512.0 + 10.0) * kU;
}
double tolerance_vs_reference(int64_t n_in) { return 2.0 * (static_cast<double>(n_in) / 32.0 + 4.0) * kU; }

// ---- the activation layout (matmul_q8.h), read on the host ----------------------------------------

// Byte of element e (0..31) of a block inside the block's 32 code bytes: unit (e / 8) % 2, first or last
// half of it as e < 16 or not.
size_t code_position(int e) { return static_cast<size_t>(16 * ((e / 8) % 2) + 8 * (e / 16) + e % 8); }

// What the quantized activations stand for, d * q, element by element in natural order (n_cols, n_in).
std::vector<float> dequantized_activations(const std::vector<uint8_t>& q, int64_t n_cols, int64_t n_in) {
    const auto col_bytes = static_cast<size_t>(tern::cuda::q8_column_bytes(n_in));
    std::vector<float> x(static_cast<size_t>(n_cols * n_in));
    for (int64_t c = 0; c < n_cols; ++c) {
        const uint8_t* col = q.data() + static_cast<size_t>(c) * col_bytes;
        for (int64_t b = 0; b < n_in / 32; ++b) {
            float d;
            std::memcpy(&d, col + n_in + 16 * b, 4);
            for (int e = 0; e < 32; ++e)
                x[static_cast<size_t>(c * n_in + 32 * b + e)] =
                    d * static_cast<float>(static_cast<int8_t>(col[32 * b + code_position(e)]));
        }
    }
    return x;
}

// Gaussian activations whose 32-element blocks have scales from 10^-3 to 10^2.
std::vector<float> activations(int64_t n_cols, int64_t n_in, uint32_t seed) {
    std::vector<float> x = tern::test::random_normal(static_cast<size_t>(n_cols * n_in), seed);
    std::mt19937 rng(seed ^ 0xAC7u);
    std::uniform_real_distribution<float> log_scale(-3.0f, 2.0f);
    for (size_t b = 0; b < x.size(); b += 32) {
        const float s = std::pow(10.0f, log_scale(rng));
        for (size_t i = b; i < b + 32; ++i) x[i] *= s;
    }
    return x;
}

std::vector<uint8_t> quantize_on_device(const std::vector<float>& x, int64_t n_cols, int64_t n_in) {
    const DeviceArray<float> dx(x);
    DeviceArray<uint8_t> dq(tern::cuda::quantized_activation_bytes(n_cols, n_in));
    tern::cuda::quantize_activations(dx.get(), n_cols, n_in, dq.get(), nullptr);
    return dq.read();
}

// ---- weights ---------------------------------------------------------------------------------------

// n_rows rows of n elements: quantize_row of gaussian values, each row with its own scale (0.01 .. 10).
std::vector<uint8_t> quantized_normal(GgmlType type, int64_t n_rows, int64_t n, uint32_t seed) {
    std::vector<float> src = tern::test::random_normal(static_cast<size_t>(n_rows * n), seed);
    std::mt19937 rng(seed ^ 0x5EEDu);
    std::uniform_real_distribution<float> log_scale(-2.0f, 1.0f);
    for (int64_t r = 0; r < n_rows; ++r) {
        const float s = std::pow(10.0f, log_scale(rng));
        for (int64_t i = 0; i < n; ++i) src[static_cast<size_t>(r * n + i)] *= s;
    }
    std::vector<uint8_t> out(tern::row_bytes(type, n) * static_cast<size_t>(n_rows));
    tern::quantize_row(type, src.data(), out.data(), n_rows * n);
    return out;
}

// Offsets of the f16 fields that scale a block (d, and m / dmin where the format has one).
std::vector<size_t> scale_fields(GgmlType type) {
    switch (type) {
    case GgmlType::Q4_1: return {offsetof(tern::BlockQ4_1, d), offsetof(tern::BlockQ4_1, m)};
    case GgmlType::Q5_1: return {offsetof(tern::BlockQ5_1, d), offsetof(tern::BlockQ5_1, m)};
    case GgmlType::Q2_K: return {offsetof(tern::BlockQ2_K, d), offsetof(tern::BlockQ2_K, dmin)};
    case GgmlType::Q3_K: return {offsetof(tern::BlockQ3_K, d)};
    case GgmlType::Q4_K: return {offsetof(tern::BlockQ4_K, d), offsetof(tern::BlockQ4_K, dmin)};
    case GgmlType::Q5_K: return {offsetof(tern::BlockQ5_K, d), offsetof(tern::BlockQ5_K, dmin)};
    case GgmlType::Q6_K: return {offsetof(tern::BlockQ6_K, d)};
    default: return {0};   // Q4_0, Q5_0, Q8_0, IQ4_NL, IQ4_XS: d leads the block
    }
}

// Every byte random, then the f16 scale fields set to finite values of either sign in [2^-12, 2^-4):
// codes the quantizers rarely or never write (Q4_K's high scale bits, Q6_K's scale -128) are read too.
std::vector<uint8_t> random_codes(GgmlType type, int64_t n_rows, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> out(tern::row_bytes(type, n) * static_cast<size_t>(n_rows));
    for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
    std::uniform_real_distribution<float> log2_mag(-12.0f, -4.0f);
    const size_t bb = tern::block_bytes(type);
    for (size_t b = 0; b < out.size(); b += bb)
        for (size_t f : scale_fields(type)) {
            const uint16_t h = tern::f32_to_f16(std::exp2(log2_mag(rng)) * ((rng() & 1) ? -1.0f : 1.0f));
            std::memcpy(&out[b + f], &h, 2);
        }
    return out;
}

// Every byte `fill`, the f16 scale fields +-2^-8 (the sign alternating by row): codes and scales at the ends
// of their ranges, integer dot products toward their bounds (a Q6_K block can reach 2^24 - 2^17).
std::vector<uint8_t> filled_codes(GgmlType type, int64_t n_rows, int64_t n, uint8_t fill) {
    const size_t rb = tern::row_bytes(type, n), bb = tern::block_bytes(type);
    std::vector<uint8_t> out(rb * static_cast<size_t>(n_rows), fill);
    for (size_t b = 0; b < out.size(); b += bb)
        for (size_t f : scale_fields(type)) {
            const uint16_t h = tern::f32_to_f16((b / rb) % 2 ? -0x1p-8f : 0x1p-8f);
            std::memcpy(&out[b + f], &h, 2);
        }
    return out;
}

std::vector<float> dequantize(GgmlType type, const std::vector<uint8_t>& w, int64_t n_rows, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n_rows * n));
    tern::dequantize_row(type, w.data(), out.data(), n_rows * n);
    return out;
}

// |scale * code| + |offset| per element: with the offset field's sign flipped the dequantized value is
// scale * code - offset, and max(|a + b|, |a - b|) = |a| + |b|.
std::vector<float> term_magnitudes(GgmlType type, const std::vector<uint8_t>& w_bytes, const std::vector<float>& w,
                                   int64_t n_rows, int64_t n) {
    std::vector<float> mag(w.size());
    for (size_t i = 0; i < w.size(); ++i) mag[i] = std::fabs(w[i]);
    const std::vector<size_t> fields = scale_fields(type);
    if (fields.size() == 2) {
        std::vector<uint8_t> flipped = w_bytes;
        for (size_t b = 0; b < flipped.size(); b += tern::block_bytes(type)) flipped[b + fields[1] + 1] ^= 0x80;
        const std::vector<float> w2 = dequantize(type, flipped, n_rows, n);
        for (size_t i = 0; i < w.size(); ++i) mag[i] = std::max(mag[i], std::fabs(w2[i]));
    }
    return mag;
}

struct Weights {
    std::vector<uint8_t> bytes;
    std::vector<float> values;       // dequantize_row
    std::vector<float> magnitudes;   // term_magnitudes
};

Weights make_weights(GgmlType type, std::vector<uint8_t> bytes, int64_t n_rows, int64_t n) {
    Weights w;
    w.values = dequantize(type, bytes, n_rows, n);
    w.magnitudes = term_magnitudes(type, bytes, w.values, n_rows, n);
    w.bytes = std::move(bytes);
    return w;
}

// ---- checking products -----------------------------------------------------------------------------

struct Products {
    std::vector<double> value;       // sum w x (+ bias), exact enough in double
    std::vector<double> magnitude;   // sum |w-terms| |x| (+ |bias|)
};

// y (n_cols, n_out) of the first n_out rows of w (rows of n_in) and x (n_cols, n_in) in double.
Products products(const Weights& w, const std::vector<float>& x, const std::vector<float>* bias, int64_t n_in,
                  int64_t n_out, int64_t n_cols) {
    Products p;
    p.value.resize(static_cast<size_t>(n_cols * n_out));
    p.magnitude.resize(p.value.size());
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t r = 0; r < n_out; ++r) {
            const double b = bias ? (*bias)[static_cast<size_t>(r)] : 0.0;
            double v = b, m = std::fabs(b);
            const float* wr = w.values.data() + r * n_in;
            const float* mr = w.magnitudes.data() + r * n_in;
            const float* xc = x.data() + c * n_in;
            for (int64_t i = 0; i < n_in; ++i) {
                v += static_cast<double>(wr[i]) * xc[i];
                m += static_cast<double>(mr[i]) * std::fabs(xc[i]);
            }
            p.value[static_cast<size_t>(c * n_out + r)] = v;
            p.magnitude[static_cast<size_t>(c * n_out + r)] = m;
        }
    return p;
}

// max over outputs of |y - want| / magnitude (infinite for a NaN).
double worst_relative_error(const std::vector<float>& y, const std::vector<double>& want,
                            const std::vector<double>& magnitude) {
    double worst = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
        const double err = std::isnan(y[i]) ? INFINITY : std::fabs(y[i] - want[i]);
        worst = std::max(worst, err / std::max(magnitude[i], 1e-30));
    }
    return worst;
}

enum class Kernel { gemm_q8, matmul_q8 };

// y of one kernel; NaN sentinels in y must all be overwritten, the guard past the end must stay.
std::vector<float> run(Kernel kernel, GgmlType type, const DeviceArray<uint8_t>& w, int64_t n_in, int64_t n_out,
                       const DeviceArray<uint8_t>& xq, int64_t n_cols, const float* bias) {
    constexpr int64_t kGuard = 16;
    std::vector<float> init(static_cast<size_t>(n_cols * n_out + kGuard), NAN);
    for (int64_t i = 0; i < kGuard; ++i) init[static_cast<size_t>(n_cols * n_out + i)] = 1234.5f;
    DeviceArray<float> dy(init);
    if (kernel == Kernel::gemm_q8)
        tern::cuda::gemm_q8(type, w.get(), n_in, n_out, xq.get(), n_cols, bias, dy.get(), nullptr);
    else
        tern::cuda::matmul_q8(type, w.get(), n_in, n_out, xq.get(), n_cols, bias, dy.get(), nullptr);
    std::vector<float> y = dy.read();
    for (int64_t i = 0; i < kGuard; ++i) REQUIRE(y[static_cast<size_t>(n_cols * n_out + i)] == 1234.5f);
    y.resize(static_cast<size_t>(n_cols * n_out));
    REQUIRE(std::none_of(y.begin(), y.end(), [](float v) { return std::isnan(v); }));
    return y;
}

// gemm_q8 for every (n_out, n_cols) given, bias on a checkerboard, against matmul_q8 on the same quantized
// activations and against the double product of the dequantized weights and activations. w holds at least
// max(outs) rows and x at least max(cols) columns. Returns the largest error against matmul_q8.
double check_gemm_q8(GgmlType type, int64_t n_in, const Weights& w, const std::vector<float>& x,
                   const std::vector<int64_t>& outs, const std::vector<int64_t>& cols, uint32_t seed) {
    const int64_t max_cols = *std::max_element(cols.begin(), cols.end());
    const int64_t max_out = *std::max_element(outs.begin(), outs.end());
    const std::vector<uint8_t> q = quantize_on_device(x, max_cols, n_in);
    const std::vector<float> xd = dequantized_activations(q, max_cols, n_in);
    const std::vector<float> bias = tern::test::random_normal(static_cast<size_t>(max_out), seed + 2);
    const DeviceArray<uint8_t> dw(w.bytes), dq(q);
    const DeviceArray<float> dbias(bias);
    double worst = 0.0;
    for (size_t io = 0; io < outs.size(); ++io) {
        const int64_t n_out = outs[io];
        const Products all = products(w, xd, nullptr, n_in, n_out, max_cols);
        for (size_t ic = 0; ic < cols.size(); ++ic) {
            const int64_t n_cols = cols[ic];
            const bool with_bias = (io + ic) % 2 == 1;
            CAPTURE(n_out);
            CAPTURE(n_cols);
            CAPTURE(with_bias);
            // The columns of a smaller n_cols are the first columns of the full product.
            std::vector<double> want(all.value.begin(), all.value.begin() + n_cols * n_out);
            std::vector<double> magnitude(all.magnitude.begin(), all.magnitude.begin() + n_cols * n_out);
            if (with_bias)
                for (size_t i = 0; i < want.size(); ++i) {
                    want[i] += bias[i % static_cast<size_t>(n_out)];
                    magnitude[i] += std::fabs(bias[i % static_cast<size_t>(n_out)]);
                }
            const float* b = with_bias ? dbias.get() : nullptr;
            const std::vector<float> y = run(Kernel::gemm_q8, type, dw, n_in, n_out, dq, n_cols, b);
            const std::vector<float> y8 = run(Kernel::matmul_q8, type, dw, n_in, n_out, dq, n_cols, b);
            const std::vector<double> y8d(y8.begin(), y8.end());
            const double vs_q8 = worst_relative_error(y, y8d, magnitude);
            CHECK(vs_q8 <= tolerance_vs_matmul_q8(n_in));
            CHECK(worst_relative_error(y, want, magnitude) <= tolerance_vs_reference(n_in));
            worst = std::max(worst, vs_q8);
        }
    }
    return worst;
}

// Row lengths per format: a ragged last k step (the kernel takes 4 blocks of 32 a step) and several steps.
std::vector<int64_t> row_lengths(GgmlType type) {
    const bool k_quant = tern::block_elems(type) == 256;
    if (quick_mode()) return {k_quant ? 256 : 96};
    return k_quant ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{96, 288};
}

} // namespace

TEST_CASE("gemm_q8 runs on the emulator, which reports compute capability 8.9") {
#if defined(TERN_CUDA_EMULATOR)
    CHECK(tern::cuda::gemm_q8_device_supported(0));
#endif
    CHECK_FALSE(tern::cuda::gemm_q8_device_supported(-1));
}

TEST_CASE("gemm_q8 equals matmul_q8 up to f32 rounding order, at ragged shapes") {
    if (!device_runs_gemm_q8()) return;
    // n_out: one row, a partial m16 tile, past one 128-row block tile; n_cols: one column, whole and partial
    // n8 tiles, one 64-column block tile, past three of them.
    const std::vector<int64_t> outs = quick_mode() ? std::vector<int64_t>{7, 130} : std::vector<int64_t>{1, 7, 130};
    const std::vector<int64_t> cols =
        quick_mode() ? std::vector<int64_t>{1, 17, 200} : std::vector<int64_t>{1, 16, 17, 64, 200};
    uint32_t seed = 100;
    double worst = 0.0;
    for (GgmlType type : kFormats) {
        CAPTURE(tern::type_name(type));
        for (int64_t n_in : row_lengths(type)) {
            CAPTURE(n_in);
            seed += 10;
            const Weights w = make_weights(type, quantized_normal(type, 130, n_in, seed), 130, n_in);
            worst = std::max(worst, check_gemm_q8(type, n_in, w, activations(200, n_in, seed + 1), outs, cols, seed));
        }
    }
    MESSAGE("largest normalised difference from matmul_q8: " << worst);
}

TEST_CASE("gemm_q8 reads every code and scale bit: random block contents") {
    if (!device_runs_gemm_q8()) return;
    uint32_t seed = 900;
    for (GgmlType type : kFormats) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = 2 * tern::block_elems(type);
        const Weights w = make_weights(type, random_codes(type, 33, n_in, ++seed), 33, n_in);
        check_gemm_q8(type, n_in, w, activations(17, n_in, seed + 1), {33}, {17}, seed);
    }
}

TEST_CASE("gemm_q8 keeps the largest integer dot products exact") {
    if (!device_runs_gemm_q8()) return;
    // Activations of equal magnitude quantize to codes +-127 throughout; with every weight byte at an end of
    // its range a block's integer sum reaches its bound (2 * q8_dot.cuh's kMaxDot: 2^19 for Q8_0 on the
    // converting accumulator, near 2^24 for Q6_K through I2F). Signs: all +, alternating per element, or per 8
    // elements (the halves of the 16-element groups of Q2_K / Q3_K / Q6_K).
    constexpr int64_t kOut = 7, kCols = 3;
    for (GgmlType type : kFormats) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = 2 * tern::block_elems(type);
        std::vector<float> x(static_cast<size_t>(kCols * n_in));
        for (int64_t i = 0; i < n_in; ++i) {
            x[static_cast<size_t>(i)] = 1.0f;
            x[static_cast<size_t>(n_in + i)] = i % 2 ? -1.0f : 1.0f;
            x[static_cast<size_t>(2 * n_in + i)] = (i / 8) % 2 ? -1.0f : 1.0f;
        }
        const std::vector<uint8_t> q = quantize_on_device(x, kCols, n_in);
        const std::vector<float> xd = dequantized_activations(q, kCols, n_in);
        const DeviceArray<uint8_t> dq(q);
        for (uint8_t fill : {0x00, 0xFF, 0x80, 0x7F, 0x88, 0x77}) {
            CAPTURE(static_cast<int>(fill));
            const Weights w = make_weights(type, filled_codes(type, kOut, n_in, fill), kOut, n_in);
            const DeviceArray<uint8_t> dw(w.bytes);
            const std::vector<float> y = run(Kernel::gemm_q8, type, dw, n_in, kOut, dq, kCols, nullptr);
            const Products want = products(w, xd, nullptr, n_in, kOut, kCols);
            CHECK(worst_relative_error(y, want.value, want.magnitude) <= tolerance_vs_reference(n_in));
        }
    }
}

TEST_CASE("gemm_q8 refuses what matmul_q8 refuses, and a device below compute capability 8.0") {
    const DeviceArray<uint8_t> w(8192), q(8192);
    const DeviceArray<float> y(1024);
    using tern::cuda::gemm_q8;
    if (!device_runs_gemm_q8())
        CHECK_THROWS_AS(gemm_q8(GgmlType::Q4_0, w.get(), 32, 1, q.get(), 1, nullptr, y.get(), nullptr),
                        std::invalid_argument);
    for (const tern::TypeInfo& ti : tern::all_types()) {
        if (tern::cuda::matmul_q8_supports(ti.type)) continue;
        CAPTURE(ti.name);
        CHECK_THROWS_AS(gemm_q8(ti.type, w.get(), 256, 1, q.get(), 1, nullptr, y.get(), nullptr),
                        std::invalid_argument);
    }
    CHECK_THROWS_AS(gemm_q8(GgmlType::Q4_K, w.get(), 128, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(gemm_q8(GgmlType::Q4_0, w.get(), 48, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(gemm_q8(GgmlType::Q4_0, w.get() + 2, 32, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(gemm_q8(GgmlType::Q4_0, w.get(), 32, 1, q.get() + 8, 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(gemm_q8(GgmlType::Q4_0, w.get(), 32, -1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    // Nothing to do is not an error.
    CHECK_NOTHROW(gemm_q8(GgmlType::Q4_0, w.get(), 32, 0, q.get(), 1, nullptr, y.get(), nullptr));
    CHECK_NOTHROW(gemm_q8(GgmlType::Q4_0, w.get(), 32, 1, q.get(), 0, nullptr, y.get(), nullptr));
}
