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
#include <stdexcept>
#include <vector>

#include "kernels/cuda/gemm_q8.h"
#include "kernels/cuda/matmul_q8.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/cuda_device_array.h"
#include "tests/cuda_matmul_q8_test_data.h"
#include "tests/cuda_matmul_test_data.h"
#include "tests/kernel_test_data.h"
#include "tests/quick_mode.h"

using tern::GgmlType;
using namespace tern::test;

namespace {

// Whether the device runs gemm_q8 (compute capability 8.0+; the emulator reports 8.9). On an older GPU the
// product tests have nothing to run and the launcher must refuse.
bool device_runs_gemm_q8() {
    int device = 0;
    REQUIRE(cudaGetDevice(&device) == cudaSuccess);
    return tern::cuda::gemm_q8_device_supported(device);
}

// ---- tolerances ------------------------------------------------------------------------------------
// Both relative to M = sum_i (|scale_i code_i| + |offset_i|) |x_i| (+ |bias|), the magnitude of the f32
// terms the kernels add (term_magnitudes). Integer dot products are exact in both kernels, so only f32
// roundings differ. gemm_q8 per 32-element block: d * D, + m * S and dx * (...) + acc, the last one also
// the block's place in one running sum of n_in / 32 terms; then the bias: (n_in / 32 + 3) * 2^-24 * M.
// matmul_q8: (n_in / 512 + 10) * 2^-24 * M (matmul_q8_rounding_levels). The reference's dequantization
// rounds each weight once more. Doubled for margin: 2.6e-6 against matmul_q8 at n_in = 256, 5.5e-6 at 768. A
// code, scale or block read wrongly moves an output by a whole term, about 1 / n_in of M or more (4e-3 at
// n_in = 256).
double tolerance_vs_matmul_q8(int64_t n_in) {
    return 2.0 * (static_cast<double>(n_in) / 32.0 + 3.0 + matmul_q8_rounding_levels(n_in)) * kU;
}
double tolerance_vs_reference(int64_t n_in) { return 2.0 * (static_cast<double>(n_in) / 32.0 + 4.0) * kU; }

enum class Kernel { gemm_q8, matmul_q8 };

// y of one kernel into a guarded output: every output written (and none NaN), nothing past them.
std::vector<float> run(Kernel kernel, GgmlType type, const DeviceArray<uint8_t>& w, int64_t n_in, int64_t n_out,
                       const DeviceArray<uint8_t>& xq, int64_t n_cols, const float* bias) {
    const std::vector<float> y = guarded_output(n_cols * n_out, [&](float* dy) {
        if (kernel == Kernel::gemm_q8)
            tern::cuda::gemm_q8(type, w.get(), n_in, n_out, xq.get(), n_cols, bias, dy, nullptr);
        else
            tern::cuda::matmul_q8(type, w.get(), n_in, n_out, xq.get(), n_cols, bias, dy, nullptr);
    });
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
            const float* b = with_bias ? dbias.get() : nullptr;
            const Products want = first_columns(all, n_cols, n_out, with_bias ? bias.data() : nullptr);
            const std::vector<float> y = run(Kernel::gemm_q8, type, dw, n_in, n_out, dq, n_cols, b);
            const std::vector<float> y8 = run(Kernel::matmul_q8, type, dw, n_in, n_out, dq, n_cols, b);
            const Products by_matmul_q8{std::vector<double>(y8.begin(), y8.end()), want.magnitude};
            const double vs_q8 = worst_relative_error(y, by_matmul_q8);
            CHECK(vs_q8 <= tolerance_vs_matmul_q8(n_in));
            CHECK(worst_relative_error(y, want) <= tolerance_vs_reference(n_in));
            worst = std::max(worst, vs_q8);
        }
    }
    return worst;
}

// Row lengths per format: a ragged last k step (the kernel takes 4 blocks of 32 a step) and several steps;
// in quick mode (tests/quick_mode.h) fewer shapes, as the emulator's mma costs 16 shuffles a warp.
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
    for (GgmlType type : kMatmulQ8Formats) {
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
    for (GgmlType type : kMatmulQ8Formats) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = 2 * tern::block_elems(type);
        const Weights w = make_weights(type, random_codes(type, 33, n_in, ++seed), 33, n_in);
        check_gemm_q8(type, n_in, w, activations(17, n_in, seed + 1), {33}, {17}, seed);
    }
}

TEST_CASE("gemm_q8 keeps the largest integer dot products exact") {
    if (!device_runs_gemm_q8()) return;
    // A block's integer sum reaches its bound (check_extreme_products): 2 * q8_dot.cuh's kMaxDot, 2^19 for Q8_0
    // on the converting accumulator, near 2^24 for Q6_K through I2F.
    for (GgmlType type : kMatmulQ8Formats) {
        CAPTURE(tern::type_name(type));
        check_extreme_products(type, tolerance_vs_reference,
                               [&](const auto& w, const auto& xq, int64_t n_in, int64_t n_out, int64_t n_cols) {
                                   return run(Kernel::gemm_q8, type, w, n_in, n_out, xq, n_cols, nullptr);
                               });
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
