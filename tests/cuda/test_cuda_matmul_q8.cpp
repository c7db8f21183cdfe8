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
#include <stdexcept>
#include <vector>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cuda/matmul_q8.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/cuda_device_array.h"
#include "tests/cuda_matmul_q8_test_data.h"
#include "tests/cuda_matmul_test_data.h"
#include "tests/kernel_test_data.h"

using tern::GgmlType;
using namespace tern::test;

namespace {

// ---- the activation layout, written out on the host ----------------------------------------------

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

// matmul_q8 of the device's quantized x into a guarded output (every output written, nothing past them).
std::vector<float> run_matmul_q8(GgmlType type, const DeviceArray<uint8_t>& w, int64_t n_in, int64_t n_out,
                                 const DeviceArray<uint8_t>& xq, int64_t n_cols, const float* bias) {
    return guarded_output(n_cols * n_out, [&](float* y) {
        tern::cuda::matmul_q8(type, w.get(), n_in, n_out, xq.get(), n_cols, bias, y, nullptr);
    });
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
            const float* b = with_bias ? dbias.get() : nullptr;
            const Products want = first_columns(all, n_cols, n_out, with_bias ? bias.data() : nullptr);
            const std::vector<float> y = run_matmul_q8(type, dw, n_in, n_out, dq, n_cols, b);
            CHECK(worst_relative_error(y, want) <= matmul_q8_tolerance(n_in));
        }
    }
}

// Row lengths per format: one block, three, and a long row that leaves some lanes without a last unit.
std::vector<int64_t> row_lengths(GgmlType type) {
    if (tern::block_elems(type) == 256) return {256, 768, 2304};
    return {32, 96, 2080};
}

} // namespace

TEST_CASE("matmul_q8_supports lists exactly the integer formats") {
    for (const tern::TypeInfo& ti : tern::all_types()) {
        CAPTURE(ti.name);
        const bool listed = std::ranges::find(kMatmulQ8Formats, ti.type) != std::end(kMatmulQ8Formats);
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
    for (GgmlType type : kMatmulQ8Formats) {
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
    for (GgmlType type : kMatmulQ8Formats) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = 2 * tern::block_elems(type);
        const Weights w = make_weights(type, random_codes(type, 130, n_in, ++seed), 130, n_in);
        check_matmul_q8(type, n_in, w, activations(17, n_in, seed + 1), seed);
    }
}

TEST_CASE("matmul_q8 keeps the largest integer dot products exact") {
    // The integer sums reach their bounds (q8_dot.cuh kMaxDot); check_extreme_products says how.
    for (GgmlType type : kMatmulQ8Formats) {
        CAPTURE(tern::type_name(type));
        check_extreme_products(type, matmul_q8_tolerance,
                               [&](const auto& w, const auto& xq, int64_t n_in, int64_t n_out, int64_t n_cols) {
                                   return run_matmul_q8(type, w, n_in, n_out, xq, n_cols, nullptr);
                               });
    }
}

TEST_CASE("matmul_q8 agrees with the CPU's dot kernels where both quantize the activations alike") {
    // Q4_0, Q5_0, Q8_0, IQ4_NL and MXFP4 meet Q8_0 activations on the CPU: the same codes and f16 scales as here, so
    // both are the same exact sum rounded differently. The CPU's scalar kernel adds n_in / 32 block terms
    // in order (each a product of exact integers and scales: 3 roundings), so together with the device's
    // bound: (n_in / 32 + 4) * 2^-24 * M more.
    constexpr GgmlType kPaired[] = {GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::IQ4_NL, GgmlType::MXFP4};
    constexpr tern::VecDotFn kCpuDot[] = {tern::vec_dot_q4_0_q8_0_scalar, tern::vec_dot_q5_0_q8_0_scalar,
                                          tern::vec_dot_q8_0_q8_0_scalar, tern::vec_dot_iq4_nl_q8_0_scalar,
                                          tern::vec_dot_mxfp4_q8_0_scalar};
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
        CHECK(worst_relative_error(y, cpu) <= matmul_q8_tolerance(n_in) + (n_in / 32.0 + 4.0) * kU);
    }
}

TEST_CASE("matmul_q8 end to end: within the int8 rounding of the activations of the f32 product") {
    // |x_i - d q_i| <= amax_b (1/254 + 1/2048 + 2^-20) for the block b of element i (the quantize test checks
    // it element by element): half a step of the grid amax / 127, the f16 rounding of the step over 127 codes,
    // and the f32 roundings of id and x * id. So |y - sum w x| <= sum_i |w_i| amax_b(i) (1/254 + 1/2048 + 2^-20),
    // plus the kernel's own f32 rounding (matmul_q8_tolerance of the magnitudes). This bound is what int8
    // activations cost at worst; random signs make the typical error some sqrt(n_in) times smaller.
    constexpr int64_t kOut = 33, kCols = 9;
    uint32_t seed = 5000;
    for (GgmlType type : kMatmulQ8Formats) {
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
                bound += matmul_q8_tolerance(n_in) * exact.magnitude[o] * 2.0;   // x's magnitudes, rounded up
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
