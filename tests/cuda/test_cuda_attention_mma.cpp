// The tensor-core prefill attention (kernels/cuda/attention_mma.h) on the CUDA emulator: attention() with
// PrefillAttention::mma against a double-precision reference over the same f16 cache with q rounded to f16
// (the kernel's inputs to its first product), and attention() with PrefillAttention::f32 (the f32 kernel)
// against the reference with q as given, for prefill chunks of 16 .. 300 tokens after 0 .. 200 cached
// positions, contiguous and paged caches (pages out of order; the rows no position reaches are f16 NaNs, so
// a kernel that lets one into a product fails), GQA groups 1 / 4 / 8 (and 3, 6: blocks with rows to spare),
// head dims 64 / 128 / 256, sliding windows and softcap; and which shapes attention_mma_fits hands to the
// tensor cores, and that a launch with attention sinks keeps the f32 kernel; launched as a programmatic
// dependent (as the backend's forward does), the same bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_mma.h"
#include "kernels/cuda/dependent_launch.h"
#include "quant/half.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

// Device memory freed on scope exit, filled from a host vector.
struct DeviceBytes {
    void* p = nullptr;
    explicit DeviceBytes(const void* data, size_t bytes) {
        REQUIRE(cudaMalloc(&p, std::max<size_t>(bytes, 1)) == cudaSuccess);
        if (bytes) REQUIRE(cudaMemcpy(p, data, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    }
    ~DeviceBytes() {
        if (p) cudaFree(p);
    }
    DeviceBytes(const DeviceBytes&) = delete;
    DeviceBytes& operator=(const DeviceBytes&) = delete;
};

struct MmaCase {
    int32_t head_dim, n_kv_heads, group, pos0, n, window;
    float softcap;
    bool paged;
};

std::string describe(const MmaCase& c) {
    return "D=" + std::to_string(c.head_dim) + " kv_heads=" + std::to_string(c.n_kv_heads) +
           " group=" + std::to_string(c.group) + " pos0=" + std::to_string(c.pos0) + " n=" + std::to_string(c.n) +
           " window=" + std::to_string(c.window) + " softcap=" + std::to_string(c.softcap) +
           (c.paged ? " paged" : " contiguous");
}

// Tolerances of the normalised error max |gpu - ref| / max |ref|.
// The tensor-core kernel against the reference with q rounded to f16: the one rounding left is each
// probability's to f16 before P V (relative 2^-11 at most, 2^-12 on average, independent between keys),
// so an output moves by up to about 2^-11 of the weighted |v| it averages; the emulator measures at most
// 1.2e-4 over the cases here. 1e-3 leaves room for the device's accumulation order and exp2f,
// while a key masked wrongly, a window off by one or a dropped tile moves outputs by a fraction of one
// weight of these peaked softmaxes (>= 1e-2 typically).
constexpr double kMmaTolerance = 1e-3;
// The f32 kernel against the reference with q as given (tests/cuda/test_cuda_attention.cpp's tolerance).
constexpr double kF32Tolerance = 2e-5;

struct MmaResult {
    double err_mma = 0.0, err_f32 = 0.0;
    std::vector<float> mma; // the tensor-core kernel's output
};

// `programmatic`: the tensor-core kernel launched as a programmatic dependent (kernels/cuda/dependent_launch.h),
// as the CUDA backend's forward launches it.
MmaResult run_case(const MmaCase& c, uint32_t seed, bool programmatic = false) {
    const int32_t D = c.head_dim, n_heads = c.n_kv_heads * c.group, total = c.pos0 + c.n;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    // Peaked softmaxes (scores with a std of about 2.5) so every key's weight matters.
    const std::vector<float> k = test::random_normal(static_cast<size_t>(total) * c.n_kv_heads * D, seed, 1.6f);
    const std::vector<float> v = test::random_normal(static_cast<size_t>(total) * c.n_kv_heads * D, seed + 1, 1.0f);
    const std::vector<float> q = test::random_normal(static_cast<size_t>(c.n) * n_heads * D, seed + 2, 1.6f);

    // The cache image: contiguous (n_ctx a few positions past the last token) or a pool of page slots with
    // the sequence's pages in reverse order after a spare slot. Every byte no position writes is 0xFF: an
    // f16 NaN.
    const int32_t n_ctx = c.paged ? total + 3 : total + 5;
    const int32_t n_pages = (n_ctx + kKvPagePositions - 1) / kKvPagePositions;
    const int32_t head_rows = c.paged ? kKvPagePositions : n_ctx;
    const size_t row_bytes = 2 * static_cast<size_t>(D);
    const size_t slot_bytes = static_cast<size_t>(c.n_kv_heads) * head_rows * row_bytes;
    const size_t slots = c.paged ? static_cast<size_t>(n_pages) + 1 : 1;
    std::vector<int32_t> table(static_cast<size_t>(n_pages));
    for (int32_t i = 0; i < n_pages; ++i)
        table[static_cast<size_t>(i)] = n_pages - i; // slot 0 unused
    std::vector<uint16_t> k_img(slots * slot_bytes / 2, 0xFFFF), v_img(k_img.size(), 0xFFFF);
    std::vector<float> kd(k.size()), vd(v.size()); // the cached values, decoded
    for (int32_t p = 0; p < total; ++p) {
        for (int32_t h = 0; h < c.n_kv_heads; ++h) {
            const size_t row = c.paged ? static_cast<size_t>(table[static_cast<size_t>(p / kKvPagePositions)]) *
                                                 slot_bytes / row_bytes +
                                             static_cast<size_t>(h) * kKvPagePositions + p % kKvPagePositions
                                       : static_cast<size_t>(h) * n_ctx + p;
            for (int32_t d = 0; d < D; ++d) {
                const size_t src = (static_cast<size_t>(p) * c.n_kv_heads + h) * D + d;
                k_img[row * D + d] = f32_to_f16(k[src]);
                v_img[row * D + d] = f32_to_f16(v[src]);
                kd[src] = f16_to_f32(k_img[row * D + d]);
                vd[src] = f16_to_f32(v_img[row * D + d]);
            }
        }
    }

    DeviceBytes dk(k_img.data(), k_img.size() * 2), dv(v_img.data(), v_img.size() * 2);
    DeviceBytes dpages(table.data(), table.size() * sizeof(int32_t)), dq(q.data(), q.size() * sizeof(float));
    const size_t out_floats = static_cast<size_t>(c.n) * n_heads * D;
    std::vector<float> poison(out_floats, NAN);
    DeviceBytes d_mma(poison.data(), out_floats * sizeof(float)), d_f32(poison.data(), out_floats * sizeof(float));
    cuda::KvLayer layer;
    layer.type = KvType::f16;
    layer.k = dk.p;
    layer.v = dv.p;
    layer.n_kv_heads = c.n_kv_heads;
    layer.head_dim = layer.head_dim_v = D;
    layer.n_ctx = n_ctx;
    layer.pages = c.paged ? static_cast<const int32_t*>(dpages.p) : nullptr;
    REQUIRE(cuda::attention_mma_fits(layer, c.n, n_heads));
    const auto* qp = static_cast<const float*>(dq.p);
#if defined(TERN_CUDA_EMULATOR)   // the emulator counts launches, and which of them are programmatic
    const size_t launches = cuda_emu::kernel_launches(), dependents = cuda_emu::programmatic_launches();
#endif
    {
        const cuda::ProgrammaticLaunches scope(programmatic);
        cuda::attention(layer, qp, c.n, n_heads, c.pos0, c.window, scale, c.softcap, static_cast<float*>(d_mma.p),
                        nullptr, nullptr, nullptr, cuda::PrefillAttention::mma);
    }
#if defined(TERN_CUDA_EMULATOR)
    CHECK(cuda_emu::kernel_launches() - launches == 1);
    CHECK(cuda_emu::programmatic_launches() - dependents == (programmatic ? 1u : 0u));
#endif
    cuda::attention(layer, qp, c.n, n_heads, c.pos0, c.window, scale, c.softcap, static_cast<float*>(d_f32.p), nullptr,
                    nullptr, nullptr, cuda::PrefillAttention::f32);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> mma(out_floats), f32(out_floats);
    REQUIRE(cudaMemcpy(mma.data(), d_mma.p, out_floats * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    REQUIRE(cudaMemcpy(f32.data(), d_f32.p, out_floats * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);

    // Double-precision references: with q rounded to f16 (rounded_q) and as given.
    MmaResult res;
    for (const bool rounded_q : {true, false}) {
        const std::vector<float>& got = rounded_q ? mma : f32;
        double ref_max = 0.0, diff = 0.0;
        std::vector<double> w, out(static_cast<size_t>(D));
        for (int32_t i = 0; i < c.n; ++i) {
            const int32_t pos = c.pos0 + i, lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
            for (int32_t h = 0; h < n_heads; ++h) {
                const int32_t g = h / c.group;
                const float* qh = q.data() + (static_cast<size_t>(i) * n_heads + h) * D;
                w.assign(static_cast<size_t>(pos - lo + 1), 0.0);
                double mx = -INFINITY;
                for (int32_t p = lo; p <= pos; ++p) {
                    const float* kr = kd.data() + (static_cast<size_t>(p) * c.n_kv_heads + g) * D;
                    double s = 0.0;
                    for (int32_t d = 0; d < D; ++d)
                        s += static_cast<double>(rounded_q ? f16_to_f32(f32_to_f16(qh[d])) : qh[d]) * kr[d];
                    s *= scale;
                    if (c.softcap > 0.0f) s = c.softcap * std::tanh(s / c.softcap);
                    w[static_cast<size_t>(p - lo)] = s;
                    mx = std::max(mx, s);
                }
                double sum = 0.0;
                for (double& x : w)
                    sum += (x = std::exp(x - mx));
                std::fill(out.begin(), out.end(), 0.0);
                for (int32_t p = lo; p <= pos; ++p) {
                    const float* vr = vd.data() + (static_cast<size_t>(p) * c.n_kv_heads + g) * D;
                    const double wp = w[static_cast<size_t>(p - lo)] / sum;
                    for (int32_t d = 0; d < D; ++d)
                        out[static_cast<size_t>(d)] += wp * vr[d];
                }
                const float* o = got.data() + (static_cast<size_t>(i) * n_heads + h) * D;
                for (int32_t d = 0; d < D; ++d) {
                    REQUIRE(std::isfinite(o[d]));
                    ref_max = std::max(ref_max, std::fabs(out[static_cast<size_t>(d)]));
                    diff = std::max(diff, std::fabs(o[d] - out[static_cast<size_t>(d)]));
                }
            }
        }
        (rounded_q ? res.err_mma : res.err_f32) = diff / ref_max;
    }
    res.mma = std::move(mma);
    return res;
}

void check_cases(const std::vector<MmaCase>& cases, uint32_t seed) {
    double worst = 0.0;
    for (const MmaCase& c : cases) {
        CAPTURE(describe(c));
        const MmaResult r = run_case(c, seed += 11);
        CAPTURE(r.err_f32);
        CHECK(r.err_mma < kMmaTolerance);
        CHECK(r.err_f32 < kF32Tolerance);
        // The knob reached two kernels: the tensor cores' f16 probabilities leave a larger error than the
        // f32 kernel's (a test whose two runs took the same path would see equal errors). Not at window 1,
        // where each token's one probability is 1 and both kernels return its V row exactly.
        if (c.window != 1) CHECK(r.err_mma > 2 * r.err_f32);
        worst = std::max(worst, r.err_mma);
    }
    MESSAGE("worst normalised error of the tensor-core kernel: " << worst);
}

TEST_CASE("attention_mma: prefill chunks of every size class, after cached positions, contiguous and paged") {
    std::vector<MmaCase> cases = {
        {64, 2, 1, 0, 16, 0, 0.0f, false},    // the threshold, one partial query tile
        {64, 1, 4, 37, 17, 0, 0.0f, true},    // 17: a second query tile of one token
        {128, 2, 4, 0, 64, 0, 0.0f, false},   // whole tiles from an empty cache
        {128, 1, 8, 150, 100, 0, 0.0f, true}, // a chunk after 150 positions, pages crossed
        {256, 1, 1, 0, 100, 0, 0.0f, false},  // 32-key tiles at head dim 256
        {256, 1, 8, 61, 40, 0, 30.0f, true},  // group 8 at 256 (8 tokens a block), softcap
        {64, 1, 4, 200, 300, 0, 0.0f, false}, // 300 tokens after 200
        {128, 1, 1, 0, 300, 0, 0.0f, true},   // 300 from empty, three pages
    };
    check_cases(cases, 1);
}

TEST_CASE("attention_mma: sliding windows, softcap and GQA groups") {
    std::vector<MmaCase> cases = {
        {64, 2, 1, 0, 100, 16, 0.0f, false},    // window inside a key tile
        {128, 1, 4, 130, 70, 64, 0.0f, true},   // window of one tile, chunk after cached positions
        {64, 1, 8, 90, 33, 1, 0.0f, false},     // window 1: each token sees itself
        {256, 1, 4, 20, 50, 40, 50.0f, false},  // window and softcap at 256
        {128, 1, 1, 300, 64, 100, 20.0f, true}, // window below every cached position
        {64, 1, 4, 10, 20, 1000, 0.0f, true},   // window above every position
        {128, 2, 6, 5, 40, 0, 0.0f, true},      // group 6: 10 tokens, 60 of a block's 64 rows
        {64, 1, 3, 0, 50, 24, 0.0f, false},     // group 3: 21 tokens, 63 rows, and a window
    };
    check_cases(cases, 100);
}

TEST_CASE("attention_mma: launched as a programmatic dependent, the same bits as a plain launch") {
    // The kernel waits for the kernels before it first thing (the emulator faults a thread that exits without
    // the wait); what it computes does not change.
    const MmaCase cases[] = {{64, 1, 4, 37, 17, 0, 0.0f, true}, {128, 2, 4, 0, 64, 0, 0.0f, false},
                             {256, 1, 8, 61, 40, 0, 30.0f, true}};
    uint32_t seed = 500;
    for (const MmaCase& c : cases) {
        CAPTURE(describe(c));
        const MmaResult plain = run_case(c, seed += 11), dependent = run_case(c, seed, true);
        CHECK(dependent.err_mma < kMmaTolerance);
        CHECK(std::memcmp(plain.mma.data(), dependent.mma.data(), plain.mma.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("attention with sinks keeps the f32 kernel whatever the prefill choice") {
    // gpt-oss's sinks are the f32 kernel's alone: PrefillAttention::mma with sinks gives its bits exactly.
    const int32_t D = 64, n_kv_heads = 2, group = 4, n_heads = n_kv_heads * group, n = 40, n_ctx = 64;
    const std::vector<float> k = test::random_normal(static_cast<size_t>(n) * n_kv_heads * D, 7, 1.6f);
    const std::vector<float> v = test::random_normal(k.size(), 8, 1.0f);
    const std::vector<float> q = test::random_normal(static_cast<size_t>(n) * n_heads * D, 9, 1.6f);
    const std::vector<float> sinks = test::random_normal(static_cast<size_t>(n_heads), 10, 2.0f);
    std::vector<uint16_t> k_img(static_cast<size_t>(n_kv_heads) * n_ctx * D), v_img(k_img.size());
    for (int32_t p = 0; p < n; ++p)
        for (int32_t h = 0; h < n_kv_heads; ++h)
            for (int32_t d = 0; d < D; ++d) {
                const size_t src = (static_cast<size_t>(p) * n_kv_heads + h) * D + d;
                k_img[(static_cast<size_t>(h) * n_ctx + p) * D + d] = f32_to_f16(k[src]);
                v_img[(static_cast<size_t>(h) * n_ctx + p) * D + d] = f32_to_f16(v[src]);
            }
    DeviceBytes dk(k_img.data(), k_img.size() * 2), dv(v_img.data(), v_img.size() * 2);
    DeviceBytes dq(q.data(), q.size() * sizeof(float)), dsinks(sinks.data(), sinks.size() * sizeof(float));
    const size_t out_floats = static_cast<size_t>(n) * n_heads * D;
    std::vector<float> poison(out_floats, NAN);
    DeviceBytes d_mma(poison.data(), out_floats * sizeof(float)), d_f32(poison.data(), out_floats * sizeof(float));
    cuda::KvLayer layer;
    layer.type = KvType::f16;
    layer.k = dk.p;
    layer.v = dv.p;
    layer.n_kv_heads = n_kv_heads;
    layer.head_dim = layer.head_dim_v = D;
    layer.n_ctx = n_ctx;
    REQUIRE(cuda::attention_mma_fits(layer, n, n_heads));
    const auto* qp = static_cast<const float*>(dq.p);
    const auto* sp = static_cast<const float*>(dsinks.p);
    for (const auto choice : {cuda::PrefillAttention::mma, cuda::PrefillAttention::f32})
        cuda::attention(layer, qp, n, n_heads, 0, 0, 0.125f, 0.0f,
                        static_cast<float*>(choice == cuda::PrefillAttention::mma ? d_mma.p : d_f32.p), nullptr,
                        nullptr, sp, choice);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    std::vector<float> mma(out_floats), f32(out_floats);
    REQUIRE(cudaMemcpy(mma.data(), d_mma.p, out_floats * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    REQUIRE(cudaMemcpy(f32.data(), d_f32.p, out_floats * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::all_of(f32.begin(), f32.end(), [](float x) { return std::isfinite(x); }));
    CHECK(std::memcmp(mma.data(), f32.data(), out_floats * sizeof(float)) == 0);
}

TEST_CASE("attention_mma_fits: only prefill-sized f16 launches of the supported shapes") {
    cuda::KvLayer layer;
    layer.type = KvType::f16;
    layer.n_kv_heads = 2;
    layer.head_dim = layer.head_dim_v = 128;
    layer.n_ctx = 512;
    CHECK(cuda::attention_mma_fits(layer, cuda::kMmaPrefillMinTokens, 8));
    CHECK_FALSE(cuda::attention_mma_fits(layer, cuda::kMmaPrefillMinTokens - 1, 8)); // decode, drafts
    CHECK_FALSE(cuda::attention_mma_fits(layer, 100, 2 * 65));                       // a group past 64 rows
    for (KvType t : {KvType::f32, KvType::bf16, KvType::q8_0, KvType::f8_e4m3}) {
        layer.type = t;
        CHECK_FALSE(cuda::attention_mma_fits(layer, 100, 8));
    }
    layer.type = KvType::f16;
    for (int32_t d : {32, 96, 160}) {
        layer.head_dim = layer.head_dim_v = d;
        CHECK_FALSE(cuda::attention_mma_fits(layer, 100, 8));
    }
    for (int32_t d : {64, 256}) {
        layer.head_dim = layer.head_dim_v = d;
        CHECK(cuda::attention_mma_fits(layer, 100, 8));
    }
    layer.head_dim = 128;
    layer.head_dim_v = 64;
    CHECK_FALSE(cuda::attention_mma_fits(layer, 100, 8));
}

} // namespace
} // namespace tern
