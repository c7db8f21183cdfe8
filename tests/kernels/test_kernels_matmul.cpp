// kernels/cpu/matmul_quant: matmul_q against direct dot calls (bit-exact), every forced ISA against the
// scalar set (normalised error), thread-count invariance (bit-exact), shape errors, and, with TERN_BENCH=1,
// GB/s of 4096x4096 matvecs next to a STREAM-like read of a 512 MB buffer (printed, never asserted).
#include <doctest/doctest.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <time.h>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/matmul_quant.h"
#include "kernels/cpu/quantize_act.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

constexpr auto& kWeightTypes = test::kDotWeightTypes;

double process_cpu_seconds() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Matrix {
    std::vector<unsigned char> bytes;
    WeightMatrixView view;
};

Matrix random_matrix(GgmlType t, int64_t n_out, int64_t n_in, uint32_t seed) {
    Matrix m;
    const auto x = test::random_normal(size_t(n_out * n_in), seed);
    const size_t rb = row_bytes(t, n_in);
    m.bytes.resize(rb * size_t(n_out));
    for (int64_t r = 0; r < n_out; ++r) quantize_row(t, x.data() + r * n_in, m.bytes.data() + size_t(r) * rb, n_in);
    m.view = WeightMatrixView{t, m.bytes.data(), n_in, n_out, 0};
    return m;
}

} // namespace

TEST_CASE("matmul_q computes y[c][r] = dot(row r, column c) with the chosen set, for 1..13 columns") {
    const int64_t n_in = 512, n_out = 37;   // 37 rows: chunks of 16 leave a ragged last chunk
    for (GgmlType t : kWeightTypes) {
        const Matrix m = random_matrix(t, n_out, n_in, 11 + uint32_t(t));
        for (int64_t n_cols : {1, 3, 8, 13}) {
            CAPTURE(type_name(t));
            CAPTURE(n_cols);
            const auto x = test::random_normal(size_t(n_in * n_cols), 5 + uint32_t(n_cols));
            ActBuffer buf;
            const QuantizedActs qa = buf.quantize(t, x.data(), n_in, n_cols);
            std::vector<float> y(size_t(n_out * n_cols), -1.0f);
            matmul_q(m.view, qa, y.data(), 2);
            const VecDotFn dot = cpu_kernels().dot(t);
            bool same = true;
            for (int64_t c = 0; c < n_cols; ++c)
                for (int64_t r = 0; r < n_out; ++r)
                    same &= y[size_t(c * n_out + r)] ==
                            dot(n_in, m.bytes.data() + size_t(r) * row_bytes(t, n_in),
                                static_cast<const unsigned char*>(qa.data) + size_t(c) * qa.col_stride);
            CHECK(same);
        }
    }
}

TEST_CASE("every forced ISA gives the scalar set's matmul results (normalised error)") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    const int64_t n_in = 1024, n_out = 64, n_cols = 9;
    for (GgmlType t : kWeightTypes) {
        const Matrix m = random_matrix(t, n_out, n_in, 21 + uint32_t(t));
        const auto x = test::random_normal(size_t(n_in * n_cols), 22);
        // The activations are quantized once with the scalar set: every set's quantizer gives the same bytes
        // (test_kernels_dot.cpp), so this isolates the dot kernels.
        std::vector<unsigned char> a(act_row_bytes(act_format_for(t), n_in) * n_cols);
        for (int64_t c = 0; c < n_cols; ++c)
            scalar->quantizer(act_format_for(t))(x.data() + c * n_in, a.data() + c * (a.size() / n_cols), n_in);
        const QuantizedActs qa{act_format_for(t), a.data(), n_in, n_cols, 0};
        std::vector<float> want(size_t(n_out * n_cols));
        matmul_q(m.view, qa, want.data(), 1, scalar);
        double scale = 0.0;
        for (float v : want) scale = std::max(scale, double(std::abs(v)));
        for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon}) {
            const CpuKernels* k = cpu_kernels_for(isa);
            if (!k) continue;
            CAPTURE(type_name(t));
            CAPTURE(std::string(cpu_isa_name(isa)));
            std::vector<float> got(want.size());
            matmul_q(m.view, qa, got.data(), 2, k);
            double err = 0.0;
            for (size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(double(got[i]) - want[i]));
            CHECK(err / scale < 1e-5);
        }
    }
}

TEST_CASE("matmul_q is bit-identical for any thread count, decode and prefill shapes") {
    const int64_t n_in = 1024, n_out = 300;   // 300 rows x 1024: above the single-thread threshold
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::F16}) {
        const Matrix m = random_matrix(t, n_out, n_in, 31);
        for (int64_t n_cols : {1, 4, 24}) {
            CAPTURE(type_name(t));
            CAPTURE(n_cols);
            const auto x = test::random_normal(size_t(n_in * n_cols), 32);
            ActBuffer buf;
            const QuantizedActs qa = buf.quantize(t, x.data(), n_in, n_cols);
            std::vector<float> y1(size_t(n_out * n_cols)), y2(y1.size()), y3(y1.size());
            matmul_q(m.view, qa, y1.data(), 1);
            matmul_q(m.view, qa, y2.data(), 2);
            matmul_q(m.view, qa, y3.data(), 3);
            CHECK(std::memcmp(y1.data(), y2.data(), y1.size() * 4) == 0);
            CHECK(std::memcmp(y1.data(), y3.data(), y1.size() * 4) == 0);
        }
    }
}

TEST_CASE("matmul_q rejects mismatched formats and shapes") {
    const Matrix m = random_matrix(GgmlType::Q4_0, 4, 64, 1);
    const auto x = test::random_normal(64, 2);
    ActBuffer buf;
    const QuantizedActs qk = buf.quantize(GgmlType::Q4_K, test::random_normal(256, 3).data(), 256, 1);
    std::vector<float> y(4);
    CHECK_THROWS_AS(matmul_q(m.view, qk, y.data(), 1), std::invalid_argument);   // q8_K activations for Q4_0
    ActBuffer buf2;
    QuantizedActs q0 = buf2.quantize(GgmlType::Q4_0, x.data(), 64, 1);
    q0.n_in = 32;
    CHECK_THROWS_AS(matmul_q(m.view, q0, y.data(), 1), std::invalid_argument);   // 32 vs 64 elements
    CHECK_THROWS_AS(buf2.quantize(GgmlType::Q4_K, x.data(), 64, 1), std::invalid_argument);   // 64 % 256
}

// TERN_BENCH=1: GB/s of y = W x for 4096 x 4096 matrices, 1 column, 1 and 2 threads. "hot" repeats one matrix
// (it fits the last-level cache on big-L3 parts); "cold" cycles through copies totalling > 2x the 260 MiB L3
// of the development machine, so the weights come from DRAM like a real model's. Printed, never asserted.
TEST_CASE("bench: matvec GB/s vs a STREAM-like read" * doctest::skip(std::getenv("TERN_BENCH") == nullptr)) {
    using clock = std::chrono::steady_clock;
    const int64_t n = 4096;
    const int max_threads = std::max(1, omp_get_max_threads());

    // STREAM-like read: sum 512 MB of u64 (integer adds vectorise in the baseline build), 4 partial sums.
    const size_t words = (512ull << 20) / 8;
    std::vector<uint64_t> big(words);
    for (size_t i = 0; i < words; ++i) big[i] = i;
    for (int nt : {1, 2}) {
        if (nt > max_threads && nt > 1) continue;
        double best = 0.0, best_cpu = 0.0;
        uint64_t sink = 0;
        for (int rep = 0; rep < 3; ++rep) {
            const auto t0 = clock::now();
            const double c0 = process_cpu_seconds();
            uint64_t total = 0;
#pragma omp parallel for schedule(static) num_threads(nt) reduction(+ : total)
            for (int64_t blk = 0; blk < int64_t(words / 4096); ++blk) {
                uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                const uint64_t* p = big.data() + blk * 4096;
                for (int i = 0; i < 4096; i += 4) {
                    s0 += p[i];
                    s1 += p[i + 1];
                    s2 += p[i + 2];
                    s3 += p[i + 3];
                }
                total += s0 + s1 + s2 + s3;
            }
            const double s = std::chrono::duration<double>(clock::now() - t0).count();
            best = std::max(best, double(words * 8) / s / 1e9);
            best_cpu = std::max(best_cpu, double(words * 8) / (process_cpu_seconds() - c0) / 1e9);
            sink += total;
        }
        std::printf("bench: STREAM-like sum of 512 MB, %d thread(s): %.1f GB/s (%.1f per CPU-s) (sink %llu)\n", nt, best,
                    best_cpu, static_cast<unsigned long long>(sink % 10));
    }
    big = {};

    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16}) {
        const Matrix m = random_matrix(t, n, n, 41);
        const size_t bytes = m.bytes.size();
        const int copies = int(std::max<size_t>(1, (640ull << 20) / bytes));
        std::vector<std::vector<unsigned char>> cold(size_t(copies), m.bytes);
        const auto x = test::random_normal(size_t(n), 42);
        ActBuffer buf;
        const QuantizedActs qa = buf.quantize(t, x.data(), n, 1);
        std::vector<float> y(static_cast<size_t>(n), 0.0f);
        for (int nt : {1, 2}) {
            // hot: the same matrix again and again. Also per CPU-second of the process: on a shared machine the
            // wall clock includes time the scheduler gave to others; bytes / CPU-seconds (1 thread) is the kernel's
            // own rate.
            double hot = 0.0, hot_cpu = 0.0;
            for (int rep = 0; rep < 5; ++rep) {
                const auto t0 = clock::now();
                const double c0 = process_cpu_seconds();
                for (int i = 0; i < 10; ++i) matmul_q(m.view, qa, y.data(), nt);
                hot = std::max(hot, 10.0 * double(bytes) / std::chrono::duration<double>(clock::now() - t0).count() / 1e9);
                hot_cpu = std::max(hot_cpu, 10.0 * double(bytes) / (process_cpu_seconds() - c0) / 1e9);
            }
            double cold_gbs = 0.0;
            for (int rep = 0; rep < 2; ++rep) {
                const auto t0 = clock::now();
                for (auto& c : cold) {
                    WeightMatrixView v = m.view;
                    v.data = c.data();
                    matmul_q(v, qa, y.data(), nt);
                }
                cold_gbs = std::max(cold_gbs, double(copies) * double(bytes) /
                                                  std::chrono::duration<double>(clock::now() - t0).count() / 1e9);
            }
            std::printf("bench: matvec %-5s 4096x4096 (%5.1f MB), %s, %d thread(s): hot %.1f GB/s (%.1f per CPU-s), "
                        "cold (%d copies) %.1f GB/s\n",
                        std::string(type_name(t)).c_str(), double(bytes) / 1e6, cpu_isa_name(cpu_kernels().isa), nt, hot,
                        hot_cpu, copies, cold_gbs);
        }
    }
}

} // namespace tern
