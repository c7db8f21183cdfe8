// kernels/cpu dot products and activation quantizers:
//   * every ISA's activation quantizer gives the scalar one's bytes, and Q8_0/Q8_1 round like ggml's AVX path;
//   * every scalar twin equals the exact dot of the dequantized weights and activations (tight);
//   * every SIMD kernel matches its scalar twin by normalised error,
// on random data (never zeros) at one block, a few blocks, 4096 and 11008 elements.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/gemm_input.h"
#include "kernels/cpu/quantize_act.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/reference_blocks.h"
#include "quant/types.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

constexpr auto& kWeightTypes = test::kDotWeightTypes;
constexpr ActFormat kActFormats[] = {ActFormat::f32,  ActFormat::f16,  ActFormat::bf16,
                                     ActFormat::q8_0, ActFormat::q8_1, ActFormat::q8_k};
constexpr CpuIsa kIsas[] = {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon};

// Normal values whose scale changes every 32 elements (0.01x .. 10x), so blocks see different ranges and
// the k-quants' sub-block scales are exercised; a few outliers as in real activations.
std::vector<float> random_row(int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<float> mag(-2.0f, 1.0f);
    std::vector<float> v(static_cast<size_t>(n));
    float scale = 1.0f;
    for (int64_t i = 0; i < n; ++i) {
        if (i % 32 == 0) scale = std::pow(10.0f, mag(rng));
        v[size_t(i)] = dist(rng) * scale;
        if (rng() % 512 == 0) v[size_t(i)] *= 20.0f;
    }
    return v;
}

std::vector<unsigned char> to_weights(GgmlType t, const std::vector<float>& x) {
    std::vector<unsigned char> w(row_bytes(t, static_cast<int64_t>(x.size())));
    quantize_row(t, x.data(), w.data(), static_cast<int64_t>(x.size()));
    return w;
}

std::vector<float> dequant_weights(GgmlType t, const std::vector<unsigned char>& w, int64_t n) {
    std::vector<float> y(static_cast<size_t>(n));
    dequantize_row(t, w.data(), y.data(), n);
    return y;
}

std::vector<float> dequant_acts(ActFormat f, const std::vector<unsigned char>& a, int64_t n) {
    std::vector<float> y(static_cast<size_t>(n));
    switch (f) {
    case ActFormat::f32: std::memcpy(y.data(), a.data(), size_t(n) * 4); break;
    case ActFormat::f16:
    case ActFormat::bf16:
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, a.data() + 2 * i, 2);
            y[size_t(i)] = f == ActFormat::f16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
        break;
    case ActFormat::q8_0: dequantize_row(GgmlType::Q8_0, a.data(), y.data(), n); break;
    case ActFormat::q8_1: dequantize_row(GgmlType::Q8_1, a.data(), y.data(), n); break;
    case ActFormat::q8_k: dequantize_row(GgmlType::Q8_K, a.data(), y.data(), n); break;
    }
    return y;
}

std::vector<unsigned char> quantize_act(const CpuKernels& k, ActFormat f, const std::vector<float>& x) {
    std::vector<unsigned char> a(act_row_bytes(f, static_cast<int64_t>(x.size())));
    k.quantizer(f)(x.data(), a.data(), static_cast<int64_t>(x.size()));
    return a;
}

std::vector<int64_t> sizes_for(GgmlType t) {
    const int64_t be = std::max<int64_t>(block_elems(t), act_block_elems(act_format_for(t)));
    return {be, 3 * be, 4096, 11008};   // 11008 = 43 * 256 (a Llama FFN width)
}

} // namespace

TEST_CASE("act_format_for pairs each weight format with ggml's activation type") {
    CHECK(act_format_for(GgmlType::Q4_0) == ActFormat::q8_0);
    CHECK(act_format_for(GgmlType::Q5_1) == ActFormat::q8_1);
    CHECK(act_format_for(GgmlType::Q4_K) == ActFormat::q8_k);
    CHECK(act_format_for(GgmlType::IQ4_XS) == ActFormat::q8_k);
    CHECK(act_format_for(GgmlType::F8_E4M3) == ActFormat::q8_0);
    CHECK(act_format_for(GgmlType::MXFP4) == ActFormat::q8_0);   // ggml-cpu's vec_dot_type for MXFP4
    CHECK(act_format_for(GgmlType::F16) == ActFormat::f16);
    CHECK_THROWS_AS(act_format_for(GgmlType::IQ2_XXS), std::invalid_argument);
    for (ActFormat f : kActFormats) CHECK(act_row_bytes(f, 256) > 0);
    CHECK(act_row_bytes(ActFormat::q8_k, 512) == 2 * sizeof(BlockQ8_K));
}

TEST_CASE("Q8_0 activation codes use id = 127/amax and round half to even, like ggml's AVX path") {
    // amax = 127 makes id exactly 1, so x * id is x: 2.5 -> 2, -3.5 -> -4, 0.5 -> 0, 1.5 -> 2 (the reference
    // quantizer's roundf would give 3, -4, 1, 2).
    std::vector<float> x(32, 1.0f);
    x[0] = 127.0f;
    x[1] = 2.5f;
    x[2] = -3.5f;
    x[3] = 0.5f;
    x[4] = 1.5f;
    BlockQ8_0 b{};
    quantize_act_q8_0_scalar(x.data(), &b, 32);
    CHECK(b.qs[0] == 127);
    CHECK(b.qs[1] == 2);
    CHECK(b.qs[2] == -4);
    CHECK(b.qs[3] == 0);
    CHECK(b.qs[4] == 2);
    CHECK(b.d == f32_to_f16(1.0f));
    BlockQ8_0 ref{};
    quantize_block(x.data(), ref);
    CHECK(ref.qs[1] == 3);   // the documented difference
    BlockQ8_1 b1{};
    quantize_act_q8_1_scalar(x.data(), &b1, 32);
    int sum = 0;
    for (int8_t q : b1.qs) sum += q;
    CHECK(sum == 127 + 2 - 4 + 0 + 2 + 27);
    CHECK(b1.s == f32_to_f16(1.0f * float(sum)));
    // Q8_K matches the reference quantizer (which is what ggml's x86 build runs) byte for byte.
    const auto xr = random_row(1024, 7);
    std::vector<BlockQ8_K> mine(4), theirs(4);
    quantize_act_q8_k_scalar(xr.data(), mine.data(), 1024);
    quantize_row(GgmlType::Q8_K, xr.data(), theirs.data(), 1024);
    CHECK(std::memcmp(mine.data(), theirs.data(), sizeof(BlockQ8_K) * 4) == 0);
}

TEST_CASE("every ISA's activation quantizer gives the scalar quantizer's bytes") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    for (CpuIsa isa : kIsas) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k) continue;
        for (ActFormat f : kActFormats)
            for (int64_t n : {256, 4096, 11008}) {
                CAPTURE(cpu_isa_name(isa));
                CAPTURE(act_format_name(f));
                CAPTURE(n);
                auto x = random_row(n, static_cast<uint32_t>(n + int(f)));
                x[5] = 0.0f;   // plus an all-zero block (amax = 0 gives id = 0, not a division by zero)
                for (int i = 32; i < 64; ++i) x[size_t(i)] = 0.0f;
                CHECK(quantize_act(*k, f, x) == quantize_act(*scalar, f, x));
            }
    }
}

// Rows whose Q8_K blocks hit every branch of the quantizer: exact .5 products (a block maximum of -127 or 127
// makes iscale -1 or 1, so halves stay halves and round to even), a negative maximum, +m and -m in either order
// (the first one sets the sign), an all-equal block, a zero block; the remaining blocks stay random.
std::vector<float> q8_k_edge_row(int64_t n, uint32_t seed) {
    std::vector<float> x = random_row(n, seed);
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> half_steps(-253, 253);   // k / 2 for |k / 2| <= 126.5
    const int64_t blocks = n / QK_K;
    for (int64_t b = 0; b < blocks; ++b) {
        float* blk = x.data() + b * QK_K;
        switch (b % 6) {
        case 0:   // halves, maximum -127 somewhere in the middle: iscale = 1
        case 1:   // halves, maximum +127: iscale = -1
            for (int j = 0; j < QK_K; ++j) blk[j] = 0.5f * static_cast<float>(half_steps(rng));
            blk[rng() % QK_K] = b % 6 == 0 ? -127.0f : 127.0f;
            break;
        case 2:   // +m before -m, and -m before +m in the next half (the first decides)
            blk[40] = 5000.0f;   // far above the random values
            blk[41] = -5000.0f;
            if (b + 1 < blocks) {
                blk[QK_K + 7] = -5000.5f;
                blk[QK_K + 200] = 5000.5f;
            }
            break;
        case 4:
            for (int j = 0; j < QK_K; ++j) blk[j] = -3.7f;   // all equal, negative
            break;
        case 5:
            for (int j = 0; j < QK_K; ++j) blk[j] = 0.0f;
            break;
        default: break;
        }
    }
    return x;
}

TEST_CASE("every ISA's Q8_K quantizer gives the scalar bytes on ties, sign-of-max, all-equal and zero blocks") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    int tested = 0;
    for (int64_t n : {256, 512, 1536, 4096, 11008})
        for (uint32_t seed = 1; seed <= 3; ++seed) {
            CAPTURE(n);
            CAPTURE(seed);
            const auto x = q8_k_edge_row(n, seed * 31 + uint32_t(n));
            const auto want = quantize_act(*scalar, ActFormat::q8_k, x);
            // The scalar quantizer is ggml's reference Q8_K quantizer (quant/), ties and all.
            std::vector<unsigned char> ref(want.size());
            quantize_row(GgmlType::Q8_K, x.data(), ref.data(), n);
            CHECK(want == ref);
            for (CpuIsa isa : kIsas) {
                const CpuKernels* k = cpu_kernels_for(isa);
                if (!k) continue;
                CAPTURE(cpu_isa_name(isa));
                CHECK(quantize_act(*k, ActFormat::q8_k, x) == want);
                ++tested;
            }
        }
    // The edge rows really contain what they claim: a tie rounded to even, and the sign of the first maximum.
    const auto x = q8_k_edge_row(QK_K * 6, 5);
    const auto q = quantize_act(*scalar, ActFormat::q8_k, x);
    const auto* blk = reinterpret_cast<const BlockQ8_K*>(q.data());
    CHECK(blk[0].d == 1.0f);    // max -127: iscale = 1, d = 1
    CHECK(blk[1].d == -1.0f);   // max 127: iscale = -1
    for (int j = 0; j < QK_K; ++j)
        if (x[size_t(j)] == 2.5f) CHECK(blk[0].qs[j] == 2);
    CHECK(blk[2].d * -127.0f == doctest::Approx(5000.0f));   // d = max / -127: +5000 came first in block 2
    CHECK(blk[3].d * -127.0f == doctest::Approx(-5000.5f));  // and -5000.5 in block 3
    for (int8_t c : blk[4].qs) CHECK(c == -127);           // all equal: every code is the maximum's, -127
    for (int8_t c : blk[5].qs) CHECK(c == 0);
    MESSAGE("Q8_K edge-row comparisons: " << tested);
}

TEST_CASE("quantize_acts and rmsnorm_quantize_rows give the same bytes on one thread and on several") {
    // 64 columns of 2048 cross threads_for_elems' cut, 3 columns of 256 stay on one thread.
    for (auto [n_in, n_cols] : {std::pair<int64_t, int64_t>{256, 3}, {2048, 64}})
        for (ActFormat f : kActFormats) {
            CAPTURE(act_format_name(f));
            CAPTURE(n_cols);
            const auto x = random_row(n_in * n_cols, uint32_t(n_cols) + 17 * uint32_t(f));
            const auto w = random_row(n_in, 99);
            const size_t bytes = act_row_bytes(f, n_in) * size_t(n_cols);
            std::vector<unsigned char> one(bytes), two(bytes), serial(bytes), qn1(bytes), qn2(bytes);
            quantize_acts(f, x.data(), n_in, n_cols, one.data(), 1);
            quantize_acts(f, x.data(), n_in, n_cols, two.data(), 2);
            for (int64_t c = 0; c < n_cols; ++c)
                cpu_kernels().quantizer(f)(x.data() + c * n_in, serial.data() + size_t(c) * act_row_bytes(f, n_in), n_in);
            CHECK(one == serial);
            CHECK(two == serial);
            std::vector<float> xn1(x.size()), xn2(x.size());
            rmsnorm_quantize_rows(x.data(), w.data(), 1e-6f, n_cols, n_in, f, xn1.data(), qn1.data(), 1);
            rmsnorm_quantize_rows(x.data(), w.data(), 1e-6f, n_cols, n_in, f, xn2.data(), qn2.data(), 2);
            CHECK(xn1 == xn2);
            CHECK(qn1 == qn2);
        }
}

TEST_CASE("scalar dot twins equal the exact dot of the dequantized rows") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    for (GgmlType t : kWeightTypes) {
        const ActFormat af = act_format_for(t);
        for (int64_t n : sizes_for(t)) {
            CAPTURE(type_name(t));
            CAPTURE(n);
            const auto w = to_weights(t, random_row(n, 100 + uint32_t(t)));
            const auto a = quantize_act(*scalar, af, random_row(n, 200 + uint32_t(n)));
            const auto wf = dequant_weights(t, w, n);
            const auto af32 = dequant_acts(af, a, n);
            double exact = 0.0, mag = 0.0;
            for (int64_t i = 0; i < n; ++i) {
                exact += double(wf[size_t(i)]) * af32[size_t(i)];
                mag += std::abs(double(wf[size_t(i)]) * af32[size_t(i)]);
            }
            REQUIRE(mag > 0.0);
            const float got = scalar->dot(t)(n, w.data(), a.data());
            // The integer sums are exact; what is left is f32 rounding of per-block scales and the running sum
            // (and for Q4_1/Q5_1 the f16-rounded activation sum s).
            const double tol = (t == GgmlType::Q4_1 || t == GgmlType::Q5_1) ? 2e-3 : 2e-6;
            CHECK(std::abs(got - exact) / mag < tol);
        }
    }
}

TEST_CASE("every SIMD dot kernel matches its scalar twin by normalised error") {
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(scalar);
    int tested = 0;
    for (CpuIsa isa : kIsas) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k) continue;
        for (GgmlType t : kWeightTypes) {
            const ActFormat af = act_format_for(t);
            for (int64_t n : sizes_for(t)) {
                CAPTURE(cpu_isa_name(isa));
                CAPTURE(type_name(t));
                CAPTURE(n);
                for (uint32_t trial = 0; trial < 3; ++trial) {
                    const auto w = to_weights(t, random_row(n, 1000 * trial + uint32_t(t)));
                    const auto a = quantize_act(*scalar, af, random_row(n, 7 + 1000 * trial + uint32_t(n)));
                    const auto wf = dequant_weights(t, w, n);
                    const auto af32 = dequant_acts(af, a, n);
                    double mag = 0.0;
                    for (int64_t i = 0; i < n; ++i) mag += std::abs(double(wf[size_t(i)]) * af32[size_t(i)]);
                    const float want = scalar->dot(t)(n, w.data(), a.data());
                    const float got = k->dot(t)(n, w.data(), a.data());
                    CHECK(std::abs(double(got) - want) / mag < 1e-5);
                    ++tested;
                }
            }
        }
    }
    MESSAGE("SIMD dot comparisons: " << tested << " (default set: " << std::string(cpu_isa_name(cpu_kernels().isa)) << ")");
}

TEST_CASE("several-column dot kernels give each column the single-column kernel's bits") {
    // Batch invariance (dot.h): a column's result may not depend on the columns beside it. Columns sit at a
    // stride with a gap (as activation rows of a wider buffer might), outputs at a stride, 1..kDotCols columns.
    int tested = 0;
    for (CpuIsa isa : kIsas) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k) continue;
        for (GgmlType t : kWeightTypes) {
            const VecDotColsFn cols = k->find_dot_cols(t);
            if (!cols) continue;
            const ActFormat af = act_format_for(t);
            for (int64_t n : sizes_for(t)) {
                CAPTURE(cpu_isa_name(isa));
                CAPTURE(type_name(t));
                CAPTURE(n);
                const auto w = to_weights(t, random_row(n, 11 + uint32_t(n)));
                const size_t stride = act_row_bytes(af, n) + 64;
                std::vector<unsigned char> acts(stride * kDotCols);
                for (int c = 0; c < kDotCols; ++c) {
                    const auto a = quantize_act(*k, af, random_row(n, 100 + uint32_t(c) + uint32_t(n)));
                    std::memcpy(acts.data() + stride * size_t(c), a.data(), a.size());
                }
                for (int n_cols = 1; n_cols <= kDotCols; ++n_cols) {
                    std::vector<float> out(size_t(3 * kDotCols), -1.0f);
                    cols(n, w.data(), acts.data(), stride, n_cols, out.data(), 3);
                    for (int c = 0; c < kDotCols; ++c) {
                        const float want = c < n_cols ? k->dot(t)(n, w.data(), acts.data() + stride * size_t(c)) : -1.0f;
                        CHECK(std::memcmp(&out[size_t(3 * c)], &want, sizeof want) == 0);
                    }
                    ++tested;
                }
            }
        }
    }
    MESSAGE("several-column dot comparisons: " << tested);
#if defined(__x86_64__)
    if (cpu_kernels_for(CpuIsa::avx2)) CHECK(tested > 0);   // x86 sets have the Q5_0 one
#endif
}

TEST_CASE("SIMD dot kernels read unaligned rows") {
    // Rows of 18-, 22- or 110-byte blocks are only 2-byte aligned inside a tensor (4 for f32 and Q8_K, whose
    // structs hold floats); never 16- or 32-byte aligned. Offset 4 keeps the structs' alignment (anything less
    // is undefined behaviour for the block structs, and no GGUF row is) while breaking every vector alignment.
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    for (CpuIsa isa : kIsas) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k) continue;
        for (GgmlType t :
             {GgmlType::Q4_0, GgmlType::Q3_K, GgmlType::Q6_K, GgmlType::MXFP4, GgmlType::F16, GgmlType::F32}) {
            CAPTURE(type_name(t));
            const int64_t n = 512;
            const auto w = to_weights(t, random_row(n, 3));
            const auto a = quantize_act(*scalar, act_format_for(t), random_row(n, 4));
            std::vector<unsigned char> wu(w.size() + 4), au(a.size() + 4);
            std::memcpy(wu.data() + 4, w.data(), w.size());
            std::memcpy(au.data() + 4, a.data(), a.size());
            CHECK(k->dot(t)(n, wu.data() + 4, au.data() + 4) == k->dot(t)(n, w.data(), a.data()));
        }
    }
}

TEST_CASE("MXFP4 dot kernels read weight rows at odd addresses") {
    // A 17-byte block has alignment 1, so an MXFP4 row of an odd number of blocks leaves the next row at an
    // odd address. Every set must give the same bits there as on an even address.
    const int64_t n = 3 * QK_MXFP4;
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    const auto w = to_weights(GgmlType::MXFP4, random_row(n, 5));
    const auto a = quantize_act(*scalar, ActFormat::q8_0, random_row(n, 6));
    std::vector<unsigned char> wu(w.size() + 1);
    std::memcpy(wu.data() + 1, w.data(), w.size());
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon}) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k) continue;
        CAPTURE(cpu_isa_name(isa));
        const float even = k->dot(GgmlType::MXFP4)(n, w.data(), a.data());
        const float odd = k->dot(GgmlType::MXFP4)(n, wu.data() + 1, a.data());
        CHECK(std::memcmp(&even, &odd, sizeof even) == 0);
    }
}

TEST_CASE("dispatch: TERN_CPU_ISA picks the set, and the best supported set is the default") {
    const char* env = std::getenv("TERN_CPU_ISA");
    if (env && *env) {
        CHECK(std::string(cpu_isa_name(cpu_kernels().isa)) == env);
    } else {
        for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::neon, CpuIsa::avx2})
            if (cpu_kernels_for(isa)) {
                CHECK(cpu_kernels().isa == isa);
                break;
            }
    }
    for (GgmlType t : kWeightTypes) CHECK((cpu_kernels().dot(t) != nullptr));
    CHECK_THROWS_AS(cpu_kernels().dot(GgmlType::IQ2_XS), std::invalid_argument);
}

} // namespace tern
