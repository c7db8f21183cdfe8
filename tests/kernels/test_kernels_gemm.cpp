// kernels/cpu/gemm_packed: the packed (row-interleaved) Q4_0 / Q8_0 / Q4_K / Q6_K matmul against its scalar
// twin (bit-exact), the decode kernels (several groups side by side) against it too, the decode prefetches'
// stream mapping, the matmul against matmul_q on the plain layout (normalised error); batch invariance (each of
// N = 1..40 columns equals the 1-column result bit for bit, 1 and 2 threads, every format, on the path the
// backend takes); the fused rmsnorm + quantization (bit-exact vs unfused); with TERN_BENCH=1 decode GB/s and
// prefill GMAC/s on llama-1b shapes and decode over 256 MiB of weights from memory (printed, never asserted).
#include <doctest/doctest.h>

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

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_input.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/matmul_quant.h"
#include "kernels/cpu/membw.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/stream_prefetch.h"
#include "quant/reference.h"
#include "quant/repack.h"
#include "quant/types.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

constexpr auto& kAllTypes = test::kDotWeightTypes;

std::vector<float> random_vec(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-1.0f, 1.0f);
    std::vector<float> v(n);
    float scale = 1.0f;
    for (size_t i = 0; i < n; ++i) {
        if (i % 32 == 0) scale = std::pow(10.0f, mag(rng));   // blocks of different ranges
        v[i] = dist(rng) * scale;
    }
    return v;
}

struct Weights {
    std::vector<uint8_t> plain, packed;
    WeightMatrixView view;
    PackedMatrixView pview;
};

Weights random_weights(GgmlType t, int64_t n_out, int64_t n_in, uint32_t seed) {
    Weights w;
    const auto x = random_vec(size_t(n_out * n_in), seed);
    const size_t rb = row_bytes(t, n_in);
    w.plain.resize(rb * size_t(n_out));
    for (int64_t r = 0; r < n_out; ++r) quantize_row(t, x.data() + r * n_in, w.plain.data() + size_t(r) * rb, n_in);
    w.view = WeightMatrixView{t, w.plain.data(), n_in, n_out, 0};
    if (packable(t, n_in)) {
        w.packed.resize(packed_bytes(t, n_out, n_in));
        repack_rows(t, w.plain.data(), n_out, n_in, w.packed.data());
        w.pview = PackedMatrixView{t, w.packed.data(), n_in, n_out};
    }
    return w;
}

// Q8_0-family activations quantized by the scalar set (every set gives the same bytes).
std::vector<uint8_t> acts(GgmlType t, const std::vector<float>& x, int64_t n_in, int64_t n_cols) {
    const ActFormat f = act_format_for(t);
    std::vector<uint8_t> a(act_row_bytes(f, n_in) * size_t(n_cols));
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    for (int64_t c = 0; c < n_cols; ++c)
        scalar->quantizer(f)(x.data() + c * n_in, a.data() + size_t(c) * act_row_bytes(f, n_in), n_in);
    return a;
}

} // namespace

TEST_CASE("packed tile kernels equal their scalar twin bit for bit (ragged groups, 1..9 columns, 1 and 2 threads)") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    int simd_sets = 0;
    for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon}) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k || !k->packed(GgmlType::Q4_0).tile) continue;
        ++simd_sets;
        for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
            for (int64_t n_in : {256, 768, 2048}) {
                for (int64_t n_out : {16, 37, 200}) {   // 1, 3 and 13 groups (decode takes up to 4 side by side)
                    const Weights w = random_weights(t, n_out, n_in, uint32_t(n_in + n_out));
                    for (int64_t n_cols : {1, 2, 3, 4, 5, 9}) {
                        CAPTURE(type_name(t));
                        CAPTURE(n_in);
                        CAPTURE(n_out);
                        CAPTURE(n_cols);
                        const auto x = random_vec(size_t(n_in * n_cols), uint32_t(n_cols));
                        const auto a = acts(t, x, n_in, n_cols);
                        const QuantizedActs qa{act_format_for(t), a.data(), n_in, n_cols, 0};
                        std::vector<float> want(size_t(n_out * n_cols), -1.0f), got(want.size(), -2.0f);
                        matmul_packed(w.pview, qa, want.data(), 1, scalar);
                        matmul_packed(w.pview, qa, got.data(), 2, k);
                        CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
                    }
                }
            }
        }
    }
    MESSAGE("SIMD sets with packed kernels on this CPU: " << simd_sets);
}

TEST_CASE("decode kernels: 1..4 groups side by side equal the scalar tile one group at a time, bit for bit") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    REQUIRE(!scalar->packed(GgmlType::Q4_0).decode);   // the scalar set takes the tile
    int kernels = 0;
    for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon}) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k) continue;
        for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
            const PackedDecodeFn decode = k->packed(t).decode;
            if (!decode) continue;
            ++kernels;
            const bool k_quant = t == GgmlType::Q4_K || t == GgmlType::Q6_K;
            for (int64_t n_in : {256, 768, 4096}) {
                const int64_t n_out = kDecodeGroups * kPackRows, nb = n_in / (k_quant ? 256 : 32);
                const Weights w = random_weights(t, n_out, n_in, uint32_t(3 * n_in + int(t)));
                const auto x = random_vec(size_t(n_in), uint32_t(n_in));
                const auto a = acts(t, x, n_in, 1);
                std::vector<int32_t> corr;
                packed_act_words(t, QuantizedActs{act_format_for(t), a.data(), n_in, 1, 0}, corr);
                const size_t gbytes = packed_group_bytes(t, n_in);
                for (int ng = 1; ng <= kDecodeGroups; ++ng) {
                    CAPTURE(type_name(t));
                    CAPTURE(n_in);
                    CAPTURE(ng);
                    std::vector<float> want(size_t(ng * kPackRows), -1.0f), got(want.size() + 16, -2.0f);
                    for (int g = 0; g < ng; ++g)
                        packed_tile_scalar(t, nb, w.packed.data() + size_t(g) * gbytes, a.data(), 0, corr.data(), 0, 1,
                                           want.data() + g * kPackRows);
                    decode(nb, w.packed.data(), gbytes, ng, a.data(), corr.data(), got.data());
                    CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
                    CHECK(got[want.size()] == -2.0f);   // nothing written past the last group
                }
            }
        }
    }
    MESSAGE("decode kernels on this CPU: " << kernels);
}

// The decode kernels' far prefetches (stream_prefetch.h) follow a stream past its end into its successor in the next
// run of streams: a wrong mapping costs only speed, so it is checked here, against the byte offsets it must cover.
TEST_CASE("for_each_successor_piece: a stream's bytes past its end are its successor's, in order, across runs") {
    const std::vector<uint8_t> memory(size_t(8) * 4 * 18432);   // the pointers only: no byte is read
    const uint8_t* base = memory.data();
    for (size_t stream_bytes : {size_t(100), size_t(2304), size_t(18432)})
        for (int n_streams : {1, 3, 4})
            for (int stream = 0; stream < n_streams; ++stream)
                for (size_t ahead : {size_t(0), size_t(37), stream_bytes - 1, stream_bytes, 3 * stream_bytes + 5})
                    for (size_t bytes : {size_t(1), size_t(64), size_t(576), 2 * stream_bytes + 7}) {
                        CAPTURE(stream_bytes);
                        CAPTURE(n_streams);
                        CAPTURE(stream);
                        CAPTURE(ahead);
                        CAPTURE(bytes);
                        // Virtual offset v of stream s lies in run v / stream_bytes, at byte v % stream_bytes of that
                        // run's stream s; runs are n_streams * stream_bytes apart.
                        auto where = [&](size_t v) {
                            return (v / stream_bytes) * size_t(n_streams) * stream_bytes + size_t(stream) * stream_bytes + v % stream_bytes;
                        };
                        size_t v = ahead, covered = 0;
                        bool in_order = true;
                        for_each_successor_piece(base + size_t(stream) * stream_bytes, stream_bytes, n_streams, ahead, bytes,
                                                 [&](const uint8_t* p, size_t n) {
                                                     in_order = in_order && n > 0 && size_t(p - base) == where(v) &&
                                                                where(v + n - 1) == where(v) + n - 1;
                                                     v += n;
                                                     covered += n;
                                                 });
                        CHECK(in_order);
                        CHECK(covered == bytes);
                    }
}

TEST_CASE("the packed matmul agrees with matmul_q on the plain rows (normalised error)") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        const int64_t n_in = 1024, n_out = 70, n_cols = 6;
        const Weights w = random_weights(t, n_out, n_in, 9);
        const auto x = random_vec(size_t(n_in * n_cols), 10);
        const auto a = acts(t, x, n_in, n_cols);
        const QuantizedActs qa{act_format_for(t), a.data(), n_in, n_cols, 0};
        std::vector<float> want(size_t(n_out * n_cols)), got(want.size());
        matmul_q(w.view, qa, want.data(), 1, scalar);
        matmul_packed(w.pview, qa, got.data(), 2);
        double scale = 0.0, err = 0.0;
        for (size_t i = 0; i < want.size(); ++i) {
            scale = std::max(scale, double(std::abs(want[i])));
            err = std::max(err, std::abs(double(got[i]) - want[i]));
        }
        CAPTURE(type_name(t));
        CHECK(scale > 1.0);
        CHECK(err / scale < 1e-5);
    }
}

TEST_CASE("batch invariance: each of N = 1..40 columns equals its 1-column result bit for bit, 1 and 2 threads") {
    const int64_t n_in = 512, n_out = 300;   // above the single-thread threshold, ragged last group/chunk
    const int64_t max_cols = 40;
    for (GgmlType t : kAllTypes) {
        const Weights w = random_weights(t, n_out, n_in, 50 + uint32_t(t));
        const auto x = random_vec(size_t(n_in * max_cols), 51);
        const auto a = acts(t, x, n_in, max_cols);
        const size_t cb = act_row_bytes(act_format_for(t), n_in);
        // Runs whichever path the backend would take: packed when the CPU has a kernel, else matmul_q.
        const bool packed = packing_pays(t, n_in, cpu_kernels());
        auto run = [&](int64_t col0, int64_t n_cols, int threads, float* y) {
            const QuantizedActs qa{act_format_for(t), a.data() + size_t(col0) * cb, n_in, n_cols, 0};
            if (packed)
                matmul_packed(w.pview, qa, y, threads);
            else
                matmul_q(w.view, qa, y, threads);
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
        CAPTURE(packed);
        CHECK(same);
    }
}

TEST_CASE("fused rmsnorm + activation quantization equals rmsnorm_f32 then quantize_acts, bit for bit") {
    const int64_t width = 768, n_rows = 5;
    const auto x = random_vec(size_t(width * n_rows), 61);
    const auto w = random_vec(size_t(width), 62);
    for (ActFormat f : {ActFormat::q8_0, ActFormat::q8_1, ActFormat::q8_k, ActFormat::f16, ActFormat::bf16, ActFormat::f32}) {
        for (const float* wp : {w.data(), static_cast<const float*>(nullptr)}) {
            CAPTURE(act_format_name(f));
            std::vector<float> xn_want(x.size()), xn_got(x.size(), -1.0f);
            for (int64_t i = 0; i < n_rows; ++i) rmsnorm_f32(x.data() + i * width, wp, xn_want.data() + i * width, width, 1e-6f);
            std::vector<uint8_t> q_want(act_row_bytes(f, width) * n_rows), q_got(q_want.size(), 0xEE);
            quantize_acts(f, xn_want.data(), width, n_rows, q_want.data());
            rmsnorm_quantize_rows(x.data(), wp, 1e-6f, n_rows, width, f, xn_got.data(), q_got.data());
            CHECK(std::memcmp(xn_want.data(), xn_got.data(), x.size() * 4) == 0);
            CHECK(q_want == q_got);
        }
    }
    std::vector<float> xn(100);
    std::vector<uint8_t> q(1000);
    CHECK_THROWS_AS(rmsnorm_quantize_rows(x.data(), nullptr, 1e-6f, 1, 100, ActFormat::q8_0, xn.data(), q.data()),
                    std::invalid_argument);
}

// TERN_BENCH=1: llama-1b shapes (rows x n_in), decode (1 column, GB/s of weights) and prefill (512 columns,
// GMAC/s), plain matmul_q vs the packed kernel, 1 and 2 threads. Printed, never asserted.
TEST_CASE("bench: packed vs plain on llama-1b shapes" * doctest::skip(std::getenv("TERN_BENCH") == nullptr)) {
    using clock = std::chrono::steady_clock;
    struct Shape { int64_t n_out, n_in; };
    const Shape shapes[] = {{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}};
    const int reps = std::getenv("TERN_BENCH_REPS") ? std::atoi(std::getenv("TERN_BENCH_REPS")) : 5;
    const char* only = std::getenv("TERN_BENCH_TYPE");
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        if (only && std::string(only) != type_name(t)) continue;
        for (const Shape& s : shapes) {
            const Weights w = random_weights(t, s.n_out, s.n_in, 77);
            for (int64_t n_cols : {int64_t(1), int64_t(512)}) {
                const auto x = random_vec(size_t(s.n_in * n_cols), 78);
                const auto a = acts(t, x, s.n_in, n_cols);
                const QuantizedActs qa{act_format_for(t), a.data(), s.n_in, n_cols, 0};
                std::vector<float> y(size_t(s.n_out * n_cols));
                for (int nt : {1, 2}) {
                    double best_plain = 1e30, best_packed = 1e30;
                    const int inner = n_cols == 1 ? 50 : 1;
                    for (int r = 0; r < reps; ++r) {
                        auto t0 = clock::now();
                        for (int i = 0; i < inner; ++i) matmul_q(w.view, qa, y.data(), nt);
                        best_plain = std::min(best_plain, std::chrono::duration<double>(clock::now() - t0).count() / inner);
                        t0 = clock::now();
                        for (int i = 0; i < inner; ++i) matmul_packed(w.pview, qa, y.data(), nt);
                        best_packed = std::min(best_packed, std::chrono::duration<double>(clock::now() - t0).count() / inner);
                    }
                    const double bytes = double(w.plain.size()), macs = double(s.n_out * s.n_in * n_cols);
                    if (n_cols == 1)
                        std::printf("bench: %-4s %5lldx%-5lld decode  %d thr: plain %6.1f GB/s  packed %6.1f GB/s\n",
                                    std::string(type_name(t)).c_str(), (long long)s.n_out, (long long)s.n_in, nt,
                                    bytes / best_plain / 1e9, bytes / best_packed / 1e9);
                    else
                        std::printf("bench: %-4s %5lldx%-5lld prefill %d thr: plain %6.1f GMAC/s packed %6.1f GMAC/s\n",
                                    std::string(type_name(t)).c_str(), (long long)s.n_out, (long long)s.n_in, nt,
                                    macs / best_plain / 1e9, macs / best_packed / 1e9);
                }
            }
        }
    }
}

// TERN_BENCH=1: decode as a model does it, the weights streaming from memory: copies of one packed 2048x8192
// matrix filling 256 MiB, each multiplied once per pass, against the read-bandwidth probe of the same run.
// Set against the hot numbers above, it shows how much of the tile's arithmetic hides behind the memory reads.
TEST_CASE("bench: packed decode from memory vs the read probe" * doctest::skip(std::getenv("TERN_BENCH") == nullptr)) {
    using clock = std::chrono::steady_clock;
    const int64_t n_out = 2048, n_in = 8192;
    const char* only = std::getenv("TERN_BENCH_TYPE");
    for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
        if (only && std::string(only) != type_name(t)) continue;
        const Weights w = random_weights(t, n_out, n_in, 77);
        const size_t bytes = w.packed.size(), copies = (size_t(256) << 20) / bytes;
        std::vector<uint8_t> big(bytes * copies);
        for (size_t i = 0; i < copies; ++i) std::memcpy(big.data() + i * bytes, w.packed.data(), bytes);
        const auto x = random_vec(size_t(n_in), 78);
        const auto a = acts(t, x, n_in, 1);
        const QuantizedActs qa{act_format_for(t), a.data(), n_in, 1, 0};
        std::vector<float> y(static_cast<size_t>(n_out));
        for (int nt : {1, 2}) {
            double cold = 1e30, hot = 1e30;
            for (int r = 0; r < 4; ++r) {
                auto t0 = clock::now();
                for (size_t i = 0; i < copies; ++i)
                    matmul_packed(PackedMatrixView{t, big.data() + i * bytes, n_in, n_out}, qa, y.data(), nt);
                cold = std::min(cold, std::chrono::duration<double>(clock::now() - t0).count() / double(copies));
                t0 = clock::now();
                for (size_t i = 0; i < copies; ++i) matmul_packed(w.pview, qa, y.data(), nt);
                hot = std::min(hot, std::chrono::duration<double>(clock::now() - t0).count() / double(copies));
            }
            const ReadBandwidth probe = measure_read_bandwidth(nt, size_t(512) << 20, 3);
            std::printf("bench: %-4s decode from memory %d thr: %6.1f GB/s (hot %6.1f GB/s, read probe %6.1f GB/s): %3.0f%% of the probe\n",
                        std::string(type_name(t)).c_str(), nt, double(bytes) / cold / 1e9, double(bytes) / hot / 1e9,
                        probe.best_gbps, 100.0 * double(bytes) / cold / 1e9 / probe.best_gbps);
        }
    }
}

} // namespace tern
