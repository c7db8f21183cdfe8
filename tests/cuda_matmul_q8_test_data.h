#pragma once
// What the integer-dot matmul suites (test_cuda_matmul_q8, test_cuda_gemm_q8) share: the quantized activation
// layout (kernels/cuda/matmul_q8.h) read back on the host, activations and weights with the magnitudes the
// kernels' f32 terms have, and the double-precision products the kernels are held to.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cuda/matmul_q8.h"
#include "tests/cuda_device_array.h"
#include "tests/cuda_matmul_test_data.h"
#include "tests/kernel_test_data.h"

namespace tern::test {

inline constexpr double kU = 0x1p-24;   // f32 unit roundoff

// ---- the activation layout, read on the host ----------------------------------------------------------

// Byte of element e (0..31) of a block inside the block's 32 code bytes: unit (e / 8) % 2, first or last
// half of it as e < 16 or not.
inline size_t code_position(int e) { return static_cast<size_t>(16 * ((e / 8) % 2) + 8 * (e / 16) + e % 8); }

// What the quantized activations stand for, d * q, element by element in natural order (n_cols, n_in).
inline std::vector<float> dequantized_activations(const std::vector<uint8_t>& q, int64_t n_cols, int64_t n_in) {
    const auto col_bytes = static_cast<size_t>(cuda::q8_column_bytes(n_in));
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

// Gaussian activations whose 32-element blocks have scales from 10^-3 to 10^2, so that f16 block scales
// of very different exponents meet in one column.
inline std::vector<float> activations(int64_t n_cols, int64_t n_in, uint32_t seed) {
    std::vector<float> x = random_normal(static_cast<size_t>(n_cols * n_in), seed);
    std::mt19937 rng(seed ^ 0xAC7u);
    std::uniform_real_distribution<float> log_scale(-3.0f, 2.0f);
    for (size_t b = 0; b < x.size(); b += 32) {
        const float s = std::pow(10.0f, log_scale(rng));
        for (size_t i = b; i < b + 32; ++i) x[i] *= s;
    }
    return x;
}

// quantize_activations of x (n_cols, n_in), brought back to the host.
inline std::vector<uint8_t> quantize_on_device(const std::vector<float>& x, int64_t n_cols, int64_t n_in) {
    const DeviceArray<float> dx(x);
    DeviceArray<uint8_t> dq(cuda::quantized_activation_bytes(n_cols, n_in));
    cuda::quantize_activations(dx.get(), n_cols, n_in, dq.get(), nullptr);
    return dq.read();
}

// ---- weights ------------------------------------------------------------------------------------------

// The f16 offset field (m or dmin) of the formats whose values are scale * code + offset.
inline std::optional<size_t> offset_field(GgmlType type) {
    const std::vector<size_t> f = scale_fields(type);
    if (f.size() < 2) return std::nullopt;
    return f[1];
}

// |scale * code| + |offset| per element: with the offset's sign flipped the dequantized value is
// scale * code - offset, and max(|a + b|, |a - b|) = |a| + |b|. The magnitude the kernels' f32 terms have
// (they sum d * D and m * S separately), which can exceed |w| where they cancel.
inline std::vector<float> term_magnitudes(GgmlType type, const std::vector<uint8_t>& w_bytes,
                                          const std::vector<float>& w, int64_t n_rows, int64_t n) {
    std::vector<float> mag(w.size());
    for (size_t i = 0; i < w.size(); ++i) mag[i] = std::fabs(w[i]);
    if (const std::optional<size_t> f = offset_field(type)) {
        std::vector<uint8_t> flipped = w_bytes;
        for (size_t b = 0; b < flipped.size(); b += block_bytes(type)) flipped[b + *f + 1] ^= 0x80;
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

inline Weights make_weights(GgmlType type, std::vector<uint8_t> bytes, int64_t n_rows, int64_t n) {
    Weights w;
    w.values = dequantize(type, bytes, n_rows, n);
    w.magnitudes = term_magnitudes(type, bytes, w.values, n_rows, n);
    w.bytes = std::move(bytes);
    return w;
}

// ---- checking products --------------------------------------------------------------------------------

// Nesting levels of f32 rounding in matmul_q8, each costing at most 2^-24 of the terms below it: per unit
// d * D, + m * S and dx * (...) + acc (3, the last also the lane's running sum: n_in / 512 units per lane),
// then 5 shuffle levels and the bias; the reference's own dequantization rounds each weight once more.
inline double matmul_q8_rounding_levels(int64_t n_in) { return static_cast<double>(n_in) / 512.0 + 10.0; }

// Tolerance of matmul_q8 against the exact product of the dequantized weights and activations, relative to
// M = sum_i (|scale_i code_i| + |offset_i|) |x_i| (+ |bias|). Every integer dot product is exact, so only
// the f32 roundings above differ: doubled for margin (2.7e-6 at n_in = 2304). A code, scale or unit read
// wrongly moves an output by a whole term, about 1 / n_in of M or more.
inline double matmul_q8_tolerance(int64_t n_in) { return 2.0 * matmul_q8_rounding_levels(n_in) * kU; }

struct Products {
    std::vector<double> value;       // sum w x (+ bias), exact enough in double
    std::vector<double> magnitude;   // sum |w-terms| |x| (+ |bias|)
};

// y (n_cols, n_out) of the first n_out rows of w (rows of n_in) and x (n_cols, n_in) in double.
inline Products products(const Weights& w, const std::vector<float>& x, const float* bias, int64_t n_in,
                         int64_t n_out, int64_t n_cols) {
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

// The first n_cols columns of `all`, a product over more columns (those of a smaller n_cols are its first
// columns), with the bias of n_out rows added when there is one: one double product serves every n_cols.
inline Products first_columns(const Products& all, int64_t n_cols, int64_t n_out, const float* bias) {
    Products p;
    p.value.assign(all.value.begin(), all.value.begin() + n_cols * n_out);
    p.magnitude.assign(all.magnitude.begin(), all.magnitude.begin() + n_cols * n_out);
    if (bias)
        for (size_t i = 0; i < p.value.size(); ++i) {
            p.value[i] += bias[i % static_cast<size_t>(n_out)];
            p.magnitude[i] += std::fabs(bias[i % static_cast<size_t>(n_out)]);
        }
    return p;
}

// max over outputs of |y - want| / magnitude (infinite for a NaN).
inline double worst_relative_error(const std::vector<float>& y, const Products& want) {
    double worst = 0.0;
    for (size_t i = 0; i < y.size(); ++i) {
        const double err = std::isnan(y[i]) ? INFINITY : std::fabs(y[i] - want.value[i]);
        worst = std::max(worst, err / std::max(want.magnitude[i], 1e-30));
    }
    return worst;
}

// The largest integer dot products there are, for one weight format: 3 columns of activations of magnitude 1,
// which quantize to codes +-127 throughout (signs all +, alternating per element, or per 8 elements: the
// 8-element halves of the 16-element groups of Q2_K / Q3_K / Q6_K), against 7 rows two blocks long of every
// weight byte at an end of its range (filled_codes). run(w, x_q, n_in, n_out, n_cols) gives the outputs of
// the kernel under test, which must lie within tolerance(n_in) of the exact product (worst_relative_error).
template <class Run> void check_extreme_products(GgmlType type, double (*tolerance)(int64_t), Run&& run) {
    constexpr int64_t kOut = 7, kCols = 3;
    const int64_t n_in = 2 * block_elems(type);
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
        const std::vector<float> y = run(dw, dq, n_in, kOut, kCols);
        CHECK(worst_relative_error(y, products(w, xd, nullptr, n_in, kOut, kCols)) <= tolerance(n_in));
    }
}

} // namespace tern::test
