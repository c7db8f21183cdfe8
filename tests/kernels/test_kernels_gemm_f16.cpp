// kernels/cpu/gemm_f16 and quant/repack_f16: the panel copy of F16 / BF16 matrices round-trips; the SIMD
// tile equals its scalar twin bit for bit (ragged panels and tiles, k tails around the converted block, 1..9
// and more columns, 1 and 2 threads); the panel matmul agrees with matmul_q on the plain rows and with a
// double-precision reference; batch invariance (each of N = 1..40 columns equals its 1-column result bit for
// bit, across column chunks, 1 and 2 threads); shape errors. With TERN_BENCH=1: decode GB/s and prefill
// GFLOP/s on llama-1b shapes against matmul_q (printed, never asserted).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_f16.h"
#include "kernels/cpu/matmul_quant.h"
#include "kernels/cpu/quantize_act.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/repack_f16.h"
#include "quant/types.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

constexpr GgmlType kTypes[] = {GgmlType::F16, GgmlType::BF16};

struct Weights {
    std::vector<uint8_t> plain, panels;
    WeightMatrixView view;
    Panel16MatrixView pview;
};

Weights random_weights(GgmlType t, int64_t n_out, int64_t n_in, uint32_t seed) {
    Weights w;
    const auto x = test::random_normal(size_t(n_out * n_in), seed);
    const size_t rb = row_bytes(t, n_in);
    w.plain.resize(rb * size_t(n_out));
    for (int64_t r = 0; r < n_out; ++r) quantize_row(t, x.data() + r * n_in, w.plain.data() + size_t(r) * rb, n_in);
    w.view = WeightMatrixView{t, w.plain.data(), n_in, n_out, 0};
    w.panels.resize(panel16_bytes(n_out, n_in));
    repack_panel16(w.plain.data(), n_out, n_in, w.panels.data());
    w.pview = Panel16MatrixView{t, w.panels.data(), n_in, n_out};
    return w;
}

// Activations rounded to the weight's 16-bit type by the scalar set (every set gives the same bytes).
std::vector<uint8_t> acts(GgmlType t, int64_t n_in, int64_t n_cols, uint32_t seed) {
    const auto x = test::random_normal(size_t(n_in * n_cols), seed);
    const ActFormat f = act_format_for(t);
    std::vector<uint8_t> a(act_row_bytes(f, n_in) * size_t(n_cols));
    quantize_acts(f, x.data(), n_in, n_cols, a.data());
    return a;
}

float widen(GgmlType t, uint16_t h) { return t == GgmlType::BF16 ? bf16_to_f32(h) : f16_to_f32(h); }

double cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// The SIMD sets that have a 16-bit tile on this CPU.
std::vector<const CpuKernels*> simd_sets() {
    std::vector<const CpuKernels*> v;
    for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon})
        if (const CpuKernels* k = cpu_kernels_for(isa); k && k->panel_tile(GgmlType::F16)) v.push_back(k);
    return v;
}

} // namespace

TEST_CASE("repack_panel16: round trip, zero padding, panel placement, range errors") {
    for (int64_t n_out : {1, 15, 16, 17, 50}) {
        for (int64_t n_in : {1, 7, 64, 100}) {
            std::vector<uint16_t> src(size_t(n_out * n_in));
            for (size_t i = 0; i < src.size(); ++i) src[i] = uint16_t(0x3C00 + 7 * i + 1);   // distinct, nonzero
            std::vector<uint16_t> panels(panel16_bytes(n_out, n_in) / 2, 0xFFFF), back(src.size(), 0);
            repack_panel16(src.data(), n_out, n_in, panels.data());
            unpack_panel16(panels.data(), n_out, n_in, back.data());
            CAPTURE(n_out);
            CAPTURE(n_in);
            CHECK(back == src);
            // Word (k, r) of panel p, and padding rows are zero.
            const int64_t rr = n_out - 1, kk = n_in - 1;
            CHECK(panels[size_t((rr / 16) * 16 * n_in + 16 * kk + rr % 16)] == src[size_t(rr * n_in + kk)]);
            const int64_t padded = (n_out + 15) / 16 * 16;
            for (int64_t r = n_out; r < padded; ++r)
                for (int64_t k = 0; k < n_in; ++k) CHECK(panels[size_t((r / 16) * 16 * n_in + 16 * k + r % 16)] == 0);
        }
    }
    // Split over ranges of whole panels gives the same bytes.
    std::vector<uint16_t> src(size_t(40 * 9));
    for (size_t i = 0; i < src.size(); ++i) src[i] = uint16_t(i * 31 + 5);
    std::vector<uint16_t> whole(panel16_bytes(40, 9) / 2), split(whole.size(), 0xAAAA);
    repack_panel16(src.data(), 40, 9, whole.data());
    repack_panel16(src.data(), 40, 9, split.data(), 16, 40);
    repack_panel16(src.data(), 40, 9, split.data(), 0, 16);
    CHECK(whole == split);
    CHECK_THROWS_AS(repack_panel16(src.data(), 40, 9, split.data(), 8, 40), std::invalid_argument);
    CHECK_THROWS_AS(repack_panel16(src.data(), 40, 9, split.data(), 0, 20), std::invalid_argument);
    CHECK(panel16_packable(GgmlType::F16, 3));
    CHECK(panel16_packable(GgmlType::BF16, 4096));
    CHECK_FALSE(panel16_packable(GgmlType::F32, 64));
    CHECK_FALSE(panel16_packable(GgmlType::Q8_0, 64));
}

TEST_CASE("16-bit tile kernels equal their scalar twin bit for bit (ragged panels, k tails, 1..9+ columns, 1 and 2 threads)") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    const bool scalar_has_tile = scalar->panel_tile(GgmlType::F16) != nullptr;
    CHECK_FALSE(scalar_has_tile);   // the scalar set runs the twin
    const auto sets = simd_sets();
    for (const CpuKernels* k : sets) {
        for (GgmlType t : kTypes) {
            for (int64_t n_in : {1, 17, 128, 300}) {          // below, at and across the 128-k converted block
                for (int64_t n_out : {16, 37, 64, 130}) {      // 1, 3, 4 panels; a ragged last tile of 2 and 1 panels
                    const Weights w = random_weights(t, n_out, n_in, uint32_t(n_in * 7 + n_out));
                    for (int64_t n_cols : {1, 2, 3, 4, 5, 6, 7, 8, 9, 17}) {
                        CAPTURE(type_name(t));
                        CAPTURE(n_in);
                        CAPTURE(n_out);
                        CAPTURE(n_cols);
                        const auto a = acts(t, n_in, n_cols, uint32_t(n_cols + 100));
                        const QuantizedActs qa{act_format_for(t), a.data(), n_in, n_cols, 0};
                        std::vector<float> want(size_t(n_out * n_cols), -1.0f), got(want.size(), -2.0f);
                        matmul_f16_panels(w.pview, qa, want.data(), 1, scalar);
                        matmul_f16_panels(w.pview, qa, got.data(), 2, k);
                        CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
                    }
                }
            }
        }
    }
    MESSAGE("SIMD sets with 16-bit tiles on this CPU: " << sets.size());
}

TEST_CASE("the scalar twin is the documented chain: acc = fma(w, x, acc) over k from +0") {
    for (GgmlType t : kTypes) {
        const int64_t n_in = 77, n_out = 21, n_cols = 3;
        const Weights w = random_weights(t, n_out, n_in, 3);
        const auto a = acts(t, n_in, n_cols, 4);
        const auto* x16 = reinterpret_cast<const uint16_t*>(a.data());
        const auto* w16 = reinterpret_cast<const uint16_t*>(w.plain.data());
        const QuantizedActs qa{act_format_for(t), a.data(), n_in, n_cols, 0};
        std::vector<float> got(size_t(n_out * n_cols));
        matmul_f16_panels(w.pview, qa, got.data(), 1, cpu_kernels_for(CpuIsa::scalar));
        bool same = true;
        for (int64_t c = 0; c < n_cols; ++c)
            for (int64_t r = 0; r < n_out; ++r) {
                float acc = 0.0f;
                for (int64_t k = 0; k < n_in; ++k)
                    acc = std::fma(widen(t, w16[r * n_in + k]), widen(t, x16[c * n_in + k]), acc);
                same &= std::memcmp(&acc, &got[size_t(c * n_out + r)], 4) == 0;
            }
        CAPTURE(type_name(t));
        CHECK(same);
    }
}

TEST_CASE("the panel matmul agrees with matmul_q on the plain rows and with a double-precision reference") {
    for (GgmlType t : kTypes) {
        const int64_t n_in = 2048, n_out = 70, n_cols = 6;
        const Weights w = random_weights(t, n_out, n_in, 9);
        const auto a = acts(t, n_in, n_cols, 10);
        const auto* x16 = reinterpret_cast<const uint16_t*>(a.data());
        const auto* w16 = reinterpret_cast<const uint16_t*>(w.plain.data());
        const QuantizedActs qa{act_format_for(t), a.data(), n_in, n_cols, 0};
        std::vector<float> plain(size_t(n_out * n_cols)), got(plain.size());
        matmul_q(w.view, qa, plain.data(), 1);
        matmul_f16_panels(w.pview, qa, got.data(), 2);
        double worst_plain = 0.0, worst_exact = 0.0;
        for (int64_t c = 0; c < n_cols; ++c)
            for (int64_t r = 0; r < n_out; ++r) {
                double exact = 0.0, mag = 0.0;
                for (int64_t k = 0; k < n_in; ++k) {
                    const double p = double(widen(t, w16[r * n_in + k])) * widen(t, x16[c * n_in + k]);
                    exact += p;
                    mag += std::abs(p);
                }
                const size_t i = size_t(c * n_out + r);
                worst_exact = std::max(worst_exact, std::abs(got[i] - exact) / mag);
                worst_plain = std::max(worst_plain, std::abs(double(got[i]) - plain[i]) / mag);
            }
        CAPTURE(type_name(t));
        // One f32 chain of 2048 exact products: the error bound is n * 2^-24 of the magnitude; in practice
        // it is a random walk, well under a tenth of it.
        CHECK(worst_exact < 2048 * 0x1p-24 / 10);
        CHECK(worst_plain < 2048 * 0x1p-24 / 10);
        CHECK(worst_exact > 0.0);   // the sums are not trivially exact: the test could see a wrong order
    }
}

TEST_CASE("16-bit batch invariance: each of N = 1..40 columns equals its 1-column result bit for bit, 1 and 2 threads") {
    // n_in = 8192 puts 32 columns in a chunk, so N > 32 crosses a column chunk; 300 rows end in a ragged tile.
    for (int64_t n_in : {512, 8192}) {
        const int64_t n_out = n_in == 512 ? 300 : 80, max_cols = 40;
        for (GgmlType t : kTypes) {
            const Weights w = random_weights(t, n_out, n_in, 50 + uint32_t(t));
            const auto a = acts(t, n_in, max_cols, 51);
            const size_t cb = act_row_bytes(act_format_for(t), n_in);
            auto run = [&](int64_t col0, int64_t n_cols, int threads, float* y) {
                const QuantizedActs qa{act_format_for(t), a.data() + size_t(col0) * cb, n_in, n_cols, 0};
                matmul_f16_panels(w.pview, qa, y, threads);
            };
            std::vector<float> single(size_t(n_out * max_cols));
            for (int64_t c = 0; c < max_cols; ++c) run(c, 1, 1, single.data() + c * n_out);
            bool same = true;
            for (int threads : {1, 2})
                for (int64_t n = 1; n <= max_cols; ++n) {
                    std::vector<float> y(size_t(n_out * n));
                    run(0, n, threads, y.data());
                    same &= std::memcmp(y.data(), single.data(), y.size() * 4) == 0;
                }
            CAPTURE(type_name(t));
            CAPTURE(n_in);
            CHECK(same);
        }
    }
}

TEST_CASE("matmul_f16_panels refuses wrong activation formats and shapes") {
    const Weights w = random_weights(GgmlType::F16, 16, 32, 1);
    const auto a = acts(GgmlType::BF16, 32, 1, 2);
    std::vector<float> y(16);
    CHECK_THROWS_AS(matmul_f16_panels(w.pview, QuantizedActs{ActFormat::bf16, a.data(), 32, 1, 0}, y.data(), 1),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_f16_panels(w.pview, QuantizedActs{ActFormat::f16, a.data(), 16, 1, 0}, y.data(), 1),
                    std::invalid_argument);
    Panel16MatrixView q = w.pview;
    q.type = GgmlType::Q8_0;
    CHECK_THROWS_AS(matmul_f16_panels(q, QuantizedActs{ActFormat::q8_0, a.data(), 32, 1, 0}, y.data(), 1),
                    std::invalid_argument);
}

// TERN_BENCH=1: llama-1b shapes (rows x n_in), decode (1 column, GB/s of weights) and prefill (64 and 512
// columns, GFLOP/s), plain matmul_q vs the panel kernel, 1 thread (by CPU time) and 2 (by wall time).
// TERN_BENCH_COLS=N keeps one column count. Printed, never asserted.
TEST_CASE("bench: 16-bit panels vs plain on llama-1b shapes" * doctest::skip(std::getenv("TERN_BENCH") == nullptr)) {
    using clock = std::chrono::steady_clock;
    struct Shape { int64_t n_out, n_in; };
    const Shape shapes[] = {{2048, 2048}, {8192, 2048}, {2048, 8192}};
    const int reps = std::getenv("TERN_BENCH_REPS") ? std::atoi(std::getenv("TERN_BENCH_REPS")) : 5;
    const char* only = std::getenv("TERN_BENCH_TYPE");
    for (GgmlType t : kTypes) {
        if (only && std::string(only) != type_name(t)) continue;
        for (const Shape& s : shapes) {
            const Weights w = random_weights(t, s.n_out, s.n_in, 77);
            for (int64_t n_cols : {int64_t(1), int64_t(64), int64_t(512)}) {
                if (const char* cols = std::getenv("TERN_BENCH_COLS"); cols && std::atoll(cols) != n_cols) continue;
                const auto a = acts(t, s.n_in, n_cols, 78);
                const QuantizedActs qa{act_format_for(t), a.data(), s.n_in, n_cols, 0};
                std::vector<float> y(size_t(s.n_out * n_cols));
                for (int threads : {1, 2}) {
                    double best[2] = {1e30, 1e30};
                    for (int rep = 0; rep < reps; ++rep)
                        for (int which = 0; which < 2; ++which) {   // interleaved A/B
                            // 1 thread: process CPU time, which a shared machine's preemption does not inflate.
                            const auto t0 = clock::now();
                            const double c0 = cpu_seconds();
                            if (which == 0)
                                matmul_q(w.view, qa, y.data(), threads);
                            else
                                matmul_f16_panels(w.pview, qa, y.data(), threads);
                            const double dt = threads == 1 ? cpu_seconds() - c0
                                                           : std::chrono::duration<double>(clock::now() - t0).count();
                            best[which] = std::min(best[which], dt);
                        }
                    const double bytes = double(s.n_out * s.n_in * 2), flops = 2.0 * double(s.n_out * s.n_in * n_cols);
                    if (n_cols == 1)
                        std::printf("%-4s %5lldx%-5lld decode  %dT  plain %6.1f GB/s  panels %6.1f GB/s\n", std::string(type_name(t)).c_str(),
                                    (long long)s.n_out, (long long)s.n_in, threads, bytes / best[0] / 1e9, bytes / best[1] / 1e9);
                    else
                        std::printf("%-4s %5lldx%-5lld N=%-4lld %dT  plain %6.1f GFLOP/s  panels %6.1f GFLOP/s\n", std::string(type_name(t)).c_str(),
                                    (long long)s.n_out, (long long)s.n_in, (long long)n_cols, threads, flops / best[0] / 1e9,
                                    flops / best[1] / 1e9);
                }
            }
        }
    }
}

} // namespace tern
