// kernels/cuda/matmul_q8.h through the CUDA emulator: quantize_activations bit for bit against the CPU's
// runtime Q8_0 quantizer (kernels/cpu/quantize_act.h) laid out in q8 units by a twin written here;
// matmul_q8 against a double-precision product of the reference dequantization (quant/reference.h) and the
// dequantized activations, for every format it reads at ragged sizes, with extreme codes, against the CPU's
// dot kernels where the two quantize the activations alike, and end to end against the f32 activations
// within the bound that int8 rounding explains.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/quantize_act.h"
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

// ---- the activation layout, written out on the host ----------------------------------------------

// Byte of element e (0..31) of a block inside the block's 32 code bytes: unit (e / 8) % 2, first or last
// half of it as e < 16 or not.
size_t code_position(int e) { return static_cast<size_t>(16 * ((e / 8) % 2) + 8 * (e / 16) + e % 8); }

// The CPU's quantize_act_q8_0_scalar of every column, laid out as matmul_q8.h says: the twin the device
// output must equal byte for byte.
std::vector<uint8_t> expected_layout(const std::vector<float>& x, int64_t n_cols, int64_t n_in) {
    const int64_t nb = n_in / 32;
    const auto col_bytes = static_cast<size_t>(tern::cuda::q8_column_bytes(n_in));
    std::vector<uint8_t> out(static_cast<size_t>(n_cols) * col_bytes);
    std::vector<tern::BlockQ8_0> blocks(static_cast<size_t>(nb));
    for (int64_t c = 0; c < n_cols; ++c) {
        tern::quantize_act_q8_0_scalar(x.data() + c * n_in, blocks.data(), n_in);
        uint8_t* col = out.data() + static_cast<size_t>(c) * col_bytes;
        for (int64_t b = 0; b < nb; ++b) {
            const tern::BlockQ8_0& blk = blocks[static_cast<size_t>(b)];
            int piece_sum[4] = {0, 0, 0, 0};
            for (int e = 0; e < 32; ++e) {
                col[32 * b + code_position(e)] = static_cast<uint8_t>(blk.qs[e]);
                piece_sum[e / 8] += blk.qs[e];
            }
            const float d = tern::f16_to_f32(blk.d);
            for (int h = 0; h < 2; ++h) {
                uint8_t* meta = col + n_in + 8 * (2 * b + h);
                std::memcpy(meta, &d, 4);
                const auto first = static_cast<int16_t>(piece_sum[h]), last = static_cast<int16_t>(piece_sum[h + 2]);
                std::memcpy(meta + 4, &first, 2);
                std::memcpy(meta + 6, &last, 2);
            }
        }
    }
    return out;
}

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

// The f16 offset field (m or dmin) of the formats whose values are scale * code + offset.
std::optional<size_t> offset_field(GgmlType type) {
    const std::vector<size_t> f = scale_fields(type);
    if (f.size() < 2) return std::nullopt;
    return f[1];
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

// Every byte `fill`, the f16 scale fields +-2^-8 (the sign alternating by row, so that a row's blocks add
// up rather than cancel): codes and scales at the ends of their ranges, the largest integer dot products
// there are (Q6_K: sc = -128 with q - 32 = -32 reaches 2^23).
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

// |scale * code| + |offset| per element: with the offset's sign flipped the dequantized value is
// scale * code - offset, and max(|a + b|, |a - b|) = |a| + |b|. The magnitude the kernel's f32 terms have
// (it sums d * D and m * S separately), which can exceed |w| where they cancel.
std::vector<float> term_magnitudes(GgmlType type, const std::vector<uint8_t>& w_bytes, const std::vector<float>& w,
                                   int64_t n_rows, int64_t n) {
    std::vector<float> mag(w.size());
    for (size_t i = 0; i < w.size(); ++i) mag[i] = std::fabs(w[i]);
    if (const std::optional<size_t> f = offset_field(type)) {
        std::vector<uint8_t> flipped = w_bytes;
        for (size_t b = 0; b < flipped.size(); b += tern::block_bytes(type)) flipped[b + *f + 1] ^= 0x80;
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

// Tolerance of matmul_q8 against the exact product of the dequantized weights and activations, relative to
// M = sum_i (|scale_i code_i| + |offset_i|) |x_i| (+ |bias|). Every integer dot product is exact, so only
// f32 roundings differ: per unit d * D, + m * S and dx * (...) + acc (3, the last also the lane's running
// sum: n_in / 512 units per lane), then 5 shuffle levels and the bias; the reference's own dequantization
// rounds each weight once more. Each nesting level costs at most 2^-24 of the terms below it:
// (n_in / 512 + 10) * 2^-24 * M, doubled for margin (2.7e-6 at n_in = 2304). A code, scale or unit read
// wrongly moves an output by a whole term, about 1 / n_in of M or more.
double matmul_tolerance(int64_t n_in) { return 2.0 * (static_cast<double>(n_in) / 512.0 + 10.0) * kU; }

struct Products {
    std::vector<double> value;       // sum w x (+ bias), exact enough in double
    std::vector<double> magnitude;   // sum |w-terms| |x| (+ |bias|)
};

// y (n_cols, n_out) of w (n_out, n_in) and x (n_cols, n_in) in double.
Products products(const Weights& w, const std::vector<float>& x, const float* bias, int64_t n_in, int64_t n_out,
                  int64_t n_cols) {
    Products p;
    p.value.resize(static_cast<size_t>(n_cols * n_out));
    p.magnitude.resize(p.value.size());
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t r = 0; r < n_out; ++r) {
            double v = bias ? bias[r] : 0.0, m = bias ? std::fabs(bias[r]) : 0.0;
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
double worst_relative_error(const std::vector<float>& y, const Products& want) {
    double worst = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
        const double err = std::isnan(y[i]) ? INFINITY : std::fabs(y[i] - want.value[i]);
        worst = std::max(worst, err / std::max(want.magnitude[i], 1e-30));
    }
    return worst;
}

std::vector<uint8_t> quantize_on_device(const std::vector<float>& x, int64_t n_cols, int64_t n_in) {
    const DeviceArray<float> dx(x);
    DeviceArray<uint8_t> dq(tern::cuda::quantized_activation_bytes(n_cols, n_in));
    tern::cuda::quantize_activations(dx.get(), n_cols, n_in, dq.get(), nullptr);
    return dq.read();
}

// matmul_q8 of the device's quantized x; NaN sentinels in y must all be overwritten, the guard past the end
// must stay.
std::vector<float> run_matmul_q8(GgmlType type, const DeviceArray<uint8_t>& w, int64_t n_in, int64_t n_out,
                                 const DeviceArray<uint8_t>& xq, int64_t n_cols, const float* bias) {
    constexpr int64_t kGuard = 16;
    std::vector<float> init(static_cast<size_t>(n_cols * n_out + kGuard), NAN);
    for (int64_t i = 0; i < kGuard; ++i) init[static_cast<size_t>(n_cols * n_out + i)] = 1234.5f;
    DeviceArray<float> dy(init);
    tern::cuda::matmul_q8(type, w.get(), n_in, n_out, xq.get(), n_cols, bias, dy.get(), nullptr);
    std::vector<float> y = dy.read();
    for (int64_t i = 0; i < kGuard; ++i) REQUIRE(y[static_cast<size_t>(n_cols * n_out + i)] == 1234.5f);
    y.resize(static_cast<size_t>(n_cols * n_out));
    return y;
}

// Every (n_out, n_cols) of the brief's grid, bias on a checkerboard, against the double product of the
// dequantized weights and the dequantized activations.
void check_matmul_q8(GgmlType type, int64_t n_in, const Weights& w, const std::vector<float>& x, uint32_t seed) {
    constexpr int64_t kOuts[] = {1, 7, 33, 130}, kCols[] = {1, 2, 3, 8, 9, 17};
    constexpr int64_t kMaxCols = 17;
    const std::vector<uint8_t> q = quantize_on_device(x, kMaxCols, n_in);
    const std::vector<float> xd = dequantized_activations(q, kMaxCols, n_in);
    const std::vector<float> bias = tern::test::random_normal(130, seed + 2);
    const DeviceArray<uint8_t> dw(w.bytes), dq(q);
    const DeviceArray<float> dbias(bias);
    for (size_t io = 0; io < std::size(kOuts); ++io) {
        const int64_t n_out = kOuts[io];
        // One double product per n_out: the columns of a smaller n_cols are the first columns of it.
        const Products all = products(w, xd, nullptr, n_in, n_out, kMaxCols);
        for (size_t ic = 0; ic < std::size(kCols); ++ic) {
            const int64_t n_cols = kCols[ic];
            const bool with_bias = (io + ic) % 2 == 1;
            CAPTURE(n_out);
            CAPTURE(n_cols);
            CAPTURE(with_bias);
            Products want;
            want.value.assign(all.value.begin(), all.value.begin() + n_cols * n_out);
            want.magnitude.assign(all.magnitude.begin(), all.magnitude.begin() + n_cols * n_out);
            if (with_bias)
                for (size_t i = 0; i < want.value.size(); ++i) {
                    want.value[i] += bias[i % static_cast<size_t>(n_out)];
                    want.magnitude[i] += std::fabs(bias[i % static_cast<size_t>(n_out)]);
                }
            const std::vector<float> y =
                run_matmul_q8(type, dw, n_in, n_out, dq, n_cols, with_bias ? dbias.get() : nullptr);
            CHECK(worst_relative_error(y, want) <= matmul_tolerance(n_in));
        }
    }
}

// Row lengths per format: one block, three, and a long row that leaves some lanes without a last unit.
std::vector<int64_t> row_lengths(GgmlType type) {
    if (tern::block_elems(type) == 256) return {256, 768, 2304};
    return {32, 96, 2080};
}

// Gaussian activations whose 32-element blocks have scales from 10^-3 to 10^2, so that f16 block scales
// of very different exponents meet in one column.
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

} // namespace

TEST_CASE("matmul_q8_supports lists exactly the integer formats") {
    for (const tern::TypeInfo& ti : tern::all_types()) {
        CAPTURE(ti.name);
        const bool listed = std::find(std::begin(kFormats), std::end(kFormats), ti.type) != std::end(kFormats);
        CHECK(tern::cuda::matmul_q8_supports(ti.type) == listed);
    }
}

TEST_CASE("quantize_activations is the CPU's Q8_0 quantization in q8 units, bit for bit") {
    CHECK(tern::cuda::quantized_activation_bytes(3, 64) == 3 * 96);
    uint32_t seed = 10;
    for (int64_t n_in : {32, 96, 2080})
        for (int64_t n_cols : {1, 3, 17}) {
            CAPTURE(n_in);
            CAPTURE(n_cols);
            std::vector<float> x = activations(n_cols, n_in, ++seed);
            // Blocks that exercise the rounding rules (column 0, as far as n_in reaches):
            auto block = [&](int64_t b) { return x.data() + 32 * b; };
            std::fill(block(0), block(1), 0.0f);   // all zero: d = 0, codes 0
            if (n_in >= 96) {
                // amax = 127 makes id = 1: x.5 are ties, rounded to even (2.5 -> 2, -3.5 -> -4), not away.
                for (int e = 0; e < 32; ++e) block(1)[e] = static_cast<float>(e % 9) - 4.5f;
                block(1)[31] = -127.0f;
                // d = 1e-6 / 127 underflows f16 (d = 0 with nonzero codes); 1e-3 / 127 is an f16 subnormal.
                for (int e = 0; e < 32; ++e) block(2)[e] = (e % 2 ? 1e-6f : 1e-3f) * static_cast<float>(e - 16) / 16.0f;
            }
            if (n_in >= 2080)
                for (int e = 0; e < 32; ++e) block(3)[e] = 1e-6f * static_cast<float>(e - 16) / 16.0f;
            const std::vector<uint8_t> got = quantize_on_device(x, n_cols, n_in);
            const std::vector<uint8_t> want = expected_layout(x, n_cols, n_in);
            REQUIRE(got.size() == want.size());
            size_t mismatches = 0;
            for (size_t i = 0; i < got.size(); ++i) mismatches += got[i] != want[i];
            CHECK(mismatches == 0);
            // Each activation is within half a step of the grid amax / 127 plus the f16 rounding of the step
            // (127 codes times 2^-11 of it, for a normal f16 d): the bound the end-to-end test builds on.
            const std::vector<float> xd = dequantized_activations(got, n_cols, n_in);
            for (size_t b = 0; b < x.size(); b += 32) {
                float amax = 0.0f;
                for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
                if (amax / 127.0f < 0x1p-14f) continue;   // f16-subnormal scales round coarser
                for (size_t i = b; i < b + 32; ++i)
                    REQUIRE(std::fabs(x[i] - xd[i]) <= amax * (1.0f / 254.0f + 1.0f / 2048.0f + 1e-6f));
            }
        }
}

TEST_CASE("matmul_q8 matches the double product of the dequantized weights and activations") {
    uint32_t seed = 100;
    for (GgmlType type : kFormats) {
        CAPTURE(tern::type_name(type));
        for (int64_t n_in : row_lengths(type)) {
            CAPTURE(n_in);
            seed += 10;
            const Weights w = make_weights(type, quantized_normal(type, 130, n_in, seed), 130, n_in);
            check_matmul_q8(type, n_in, w, activations(17, n_in, seed + 1), seed);
        }
    }
}

TEST_CASE("matmul_q8 reads every code and scale bit: random block contents") {
    uint32_t seed = 900;
    for (GgmlType type : kFormats) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = 2 * tern::block_elems(type);
        const Weights w = make_weights(type, random_codes(type, 130, n_in, ++seed), 130, n_in);
        check_matmul_q8(type, n_in, w, activations(17, n_in, seed + 1), seed);
    }
}

TEST_CASE("matmul_q8 keeps the largest integer dot products exact") {
    // Activations of equal magnitude quantize to codes +-127 throughout; with every weight byte at an end of
    // its range the integer sums reach their bounds (q8_dot.cuh kMaxDot). Signs: all +, or alternating per
    // element, or per 8 elements (the unit halves of Q2_K / Q3_K / Q6_K).
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
            const std::vector<float> y = run_matmul_q8(type, dw, n_in, kOut, dq, kCols, nullptr);
            CHECK(worst_relative_error(y, products(w, xd, nullptr, n_in, kOut, kCols)) <= matmul_tolerance(n_in));
        }
    }
}

TEST_CASE("matmul_q8 agrees with the CPU's dot kernels where both quantize the activations alike") {
    // Q4_0, Q5_0, Q8_0 and IQ4_NL meet Q8_0 activations on the CPU: the same codes and f16 scales as here, so
    // both are the same exact sum rounded differently. The CPU's scalar kernel adds n_in / 32 block terms
    // in order (each a product of exact integers and scales: 3 roundings), so together with the device's
    // bound: (n_in / 32 + 4) * 2^-24 * M more.
    constexpr GgmlType kPaired[] = {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::IQ4_NL};
    constexpr tern::VecDotFn kCpuDot[] = {tern::vec_dot_q4_0_q8_0_scalar, tern::vec_dot_q5_0_q8_0_scalar,
                                          tern::vec_dot_q8_0_q8_0_scalar, tern::vec_dot_iq4_nl_q8_0_scalar};
    constexpr int64_t n_in = 1024, kOut = 33, kCols = 9;
    uint32_t seed = 3000;
    for (size_t f = 0; f < std::size(kPaired); ++f) {
        const GgmlType type = kPaired[f];
        CAPTURE(tern::type_name(type));
        const Weights w = make_weights(type, quantized_normal(type, kOut, n_in, ++seed), kOut, n_in);
        const std::vector<float> x = activations(kCols, n_in, ++seed);
        const std::vector<uint8_t> q = quantize_on_device(x, kCols, n_in);
        const DeviceArray<uint8_t> dw(w.bytes), dq(q);
        const std::vector<float> y = run_matmul_q8(type, dw, n_in, kOut, dq, kCols, nullptr);
        Products cpu = products(w, dequantized_activations(q, kCols, n_in), nullptr, n_in, kOut, kCols);
        std::vector<tern::BlockQ8_0> xq(n_in / 32);
        const size_t rb = tern::row_bytes(type, n_in);
        for (int64_t c = 0; c < kCols; ++c) {
            tern::quantize_act_q8_0_scalar(x.data() + c * n_in, xq.data(), n_in);
            for (int64_t r = 0; r < kOut; ++r)
                cpu.value[static_cast<size_t>(c * kOut + r)] = kCpuDot[f](n_in, w.bytes.data() + r * rb, xq.data());
        }
        CHECK(worst_relative_error(y, cpu) <= matmul_tolerance(n_in) + (n_in / 32.0 + 4.0) * kU);
    }
}

TEST_CASE("matmul_q8 end to end: within the int8 rounding of the activations of the f32 product") {
    // |x_i - d q_i| <= amax_b (1/254 + 1/2048 + 2^-20) for the block b of element i (the quantize test checks
    // it element by element): half a step of the grid amax / 127, the f16 rounding of the step over 127 codes,
    // and the f32 roundings of id and x * id. So |y - sum w x| <= sum_i |w_i| amax_b(i) (1/254 + 1/2048 + 2^-20),
    // plus the kernel's own f32 rounding (matmul_tolerance of the magnitudes). This bound is what int8
    // activations cost at worst; random signs make the typical error some sqrt(n_in) times smaller.
    constexpr int64_t kOut = 33, kCols = 9;
    uint32_t seed = 5000;
    for (GgmlType type : kFormats) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = tern::block_elems(type) == 256 ? 2048 : 2080;
        const Weights w = make_weights(type, quantized_normal(type, kOut, n_in, ++seed), kOut, n_in);
        std::vector<float> x = tern::test::random_normal(static_cast<size_t>(kCols * n_in), ++seed);
        const std::vector<uint8_t> q = quantize_on_device(x, kCols, n_in);
        const DeviceArray<uint8_t> dw(w.bytes), dq(q);
        const std::vector<float> y = run_matmul_q8(type, dw, n_in, kOut, dq, kCols, nullptr);
        const Products exact = products(w, x, nullptr, n_in, kOut, kCols);
        double worst_ratio = 0.0;
        for (int64_t c = 0; c < kCols; ++c)
            for (int64_t r = 0; r < kOut; ++r) {
                double bound = 0.0;
                for (int64_t b = 0; b < n_in / 32; ++b) {
                    double amax = 0.0, wsum = 0.0;
                    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
                        amax = std::max(amax, std::fabs(static_cast<double>(x[static_cast<size_t>(c * n_in + i)])));
                        wsum += std::fabs(w.values[static_cast<size_t>(r * n_in + i)]);
                    }
                    bound += wsum * amax * (1.0 / 254.0 + 1.0 / 2048.0 + 0x1p-20);
                }
                const size_t o = static_cast<size_t>(c * kOut + r);
                bound += matmul_tolerance(n_in) * exact.magnitude[o] * 2.0;   // x's magnitudes, rounded up
                const double err = std::fabs(y[o] - exact.value[o]);
                REQUIRE(err <= bound);
                worst_ratio = std::max(worst_ratio, err / bound);
            }
        MESSAGE(tern::type_name(type) << ": worst error / int8 bound = " << worst_ratio);
    }
}

TEST_CASE("matmul_q8 and quantize_activations refuse what they cannot read") {
    const DeviceArray<uint8_t> w(8192), q(8192);
    const DeviceArray<float> x(2048), y(1024);
    using tern::cuda::matmul_q8;
    using tern::cuda::quantize_activations;
    CHECK_THROWS_AS(matmul_q8(GgmlType::F16, w.get(), 256, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8(GgmlType::F8_E4M3, w.get(), 256, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8(GgmlType::Q8_K, w.get(), 256, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8(GgmlType::Q4_K, w.get(), 128, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8(GgmlType::Q4_0, w.get() + 2, 32, 1, q.get(), 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8(GgmlType::Q4_0, w.get(), 32, 1, q.get() + 8, 1, nullptr, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(quantize_activations(x.get(), 1, 48, q.get(), nullptr), std::invalid_argument);
    CHECK_THROWS_AS(quantize_activations(x.get() + 1, 1, 32, q.get(), nullptr), std::invalid_argument);
    CHECK_THROWS_AS(quantize_activations(x.get(), 1, 32, q.get() + 4, nullptr), std::invalid_argument);
    // Nothing to do is not an error.
    CHECK_NOTHROW(matmul_q8(GgmlType::Q4_0, w.get(), 32, 0, q.get(), 1, nullptr, y.get(), nullptr));
    CHECK_NOTHROW(matmul_q8(GgmlType::Q4_0, w.get(), 32, 1, q.get(), 0, nullptr, y.get(), nullptr));
    CHECK_NOTHROW(quantize_activations(x.get(), 0, 32, q.get(), nullptr));
}
