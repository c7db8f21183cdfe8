// kernels/cpu/ops against straightforward double-precision formulations on random data, at several sizes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "engine/cpu/layer_rope.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/silu.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
    return m;
}

} // namespace

TEST_CASE("rmsnorm_f32 matches x / sqrt(mean(x^2) + eps) * w") {
    for (int64_t n : {1, 7, 64, 256, 1000, 4096}) {
        CAPTURE(n);
        const auto x = test::random_normal(static_cast<size_t>(n), 1, 3.0f);
        const auto w = test::random_normal(static_cast<size_t>(n), 2);
        std::vector<float> y(static_cast<size_t>(n)), y_now(static_cast<size_t>(n));
        rmsnorm_f32(x.data(), w.data(), y.data(), n, 1e-5f);
        rmsnorm_f32(x.data(), nullptr, y_now.data(), n, 1e-5f);
        double ss = 0.0;
        for (float v : x)
            ss += double(v) * v;
        const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
        std::vector<double> ref(static_cast<size_t>(n)), ref_now(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
            ref_now[size_t(i)] = x[size_t(i)] * scale;
            ref[size_t(i)] = ref_now[size_t(i)] * w[size_t(i)];
        }
        CHECK(max_abs_diff(y, ref) < 1e-5);
        CHECK(max_abs_diff(y_now, ref_now) < 1e-5);
        // In place gives the same bits.
        std::vector<float> z = x;
        rmsnorm_f32(z.data(), w.data(), z.data(), n, 1e-5f);
        CHECK(z == y);
    }
}

TEST_CASE("rope_normal_f32 and rope_neox_f32 rotate the right pairs by pos * scale * base^(-2i/n_rot) / factor") {
    for (int64_t head_dim : {2, 8, 64, 128, 256}) {
        for (int64_t n_rot : {head_dim, head_dim / 2}) {
            if (n_rot % 2 != 0 || n_rot == 0) continue;
            for (int32_t pos : {0, 1, 17, 1000, 30000}) {
                for (bool factors : {false, true}) {
                    CAPTURE(head_dim);
                    CAPTURE(n_rot);
                    CAPTURE(pos);
                    const auto x = test::random_normal(static_cast<size_t>(head_dim), 3);
                    std::vector<float> ff(static_cast<size_t>(n_rot / 2));
                    for (size_t i = 0; i < ff.size(); ++i)
                        ff[i] = 1.0f + 0.5f * static_cast<float>(i);
                    const float* fptr = factors ? ff.data() : nullptr;
                    const float base = 10000.0f, scale = 0.25f;
                    std::vector<float> a = x, b = x;
                    rope_normal_f32(a.data(), head_dim, n_rot, pos, base, scale, fptr);
                    rope_neox_f32(b.data(), head_dim, n_rot, pos, base, scale, fptr);
                    std::vector<double> ra(x.begin(), x.end()), rb(x.begin(), x.end());
                    for (int64_t i = 0; i < n_rot / 2; ++i) {
                        double theta = pos * double(scale) * std::pow(double(base), -2.0 * double(i) / double(n_rot));
                        if (fptr) theta /= fptr[i];
                        const double c = std::cos(theta), s = std::sin(theta);
                        const size_t p0 = size_t(2 * i), p1 = size_t(2 * i + 1);
                        ra[p0] = x[p0] * c - x[p1] * s;
                        ra[p1] = x[p0] * s + x[p1] * c;
                        const size_t q0 = size_t(i), q1 = size_t(i + n_rot / 2);
                        rb[q0] = x[q0] * c - x[q1] * s;
                        rb[q1] = x[q0] * s + x[q1] * c;
                    }
                    CHECK(max_abs_diff(a, ra) < 1e-5);
                    CHECK(max_abs_diff(b, rb) < 1e-5);
                    // Dims past n_rot pass through untouched.
                    for (int64_t i = n_rot; i < head_dim; ++i) {
                        CHECK(a[size_t(i)] == x[size_t(i)]);
                        CHECK(b[size_t(i)] == x[size_t(i)]);
                    }
                }
            }
        }
    }
}

// YaRN written out from its definition (the YaRN paper's "NTK-by-parts" with its attention factor), in the
// order of the reference implementation: each pair's interpolated and extrapolated angles in float, mixed by
// the ramp, then cos and sin times mscale.
std::vector<float> yarn_reference(const std::vector<float>& x, bool neox, int64_t n_rot, int32_t pos, float base,
                                  float freq_scale, const RopeYarn& y) {
    std::vector<float> out = x;
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float extrap = float(pos) * std::pow(base, -2.0f * float(i) / float(n_rot));
        const float interp = freq_scale * extrap;
        const float t = (float(i) - y.corr_low) / std::max(0.001f, y.corr_high - y.corr_low);
        const float mix = (1.0f - std::clamp(t, 0.0f, 1.0f)) * y.ext_factor;
        const float theta = interp * (1.0f - mix) + extrap * mix;
        const float c = std::cos(theta) * y.mscale, s = std::sin(theta) * y.mscale;
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        out[size_t(a)] = x[size_t(a)] * c - x[size_t(b)] * s;
        out[size_t(b)] = x[size_t(a)] * s + x[size_t(b)] * c;
    }
    return out;
}

TEST_CASE("YaRN rope: fast pairs keep their angle, slow pairs are interpolated, a ramp between, all times mscale") {
    // n_rot 64, base 10000, factor 8 (freq_scale 1/8), original context 4096, betas 32 / 1: corr range [10, 23]
    // (64 ln(4096 / (beta 2 pi)) / (2 ln 10000), floor / ceil). mscale 0.1 ln 8 + 1.
    const RopeYarn y{1.0f, 10.0f, 23.0f, 1.0f + 0.1f * std::log(8.0f)};
    const float base = 10000.0f, scale = 0.125f;
    for (bool neox : {false, true}) {
        for (int32_t pos : {0, 1, 17, 1000, 30000}) {
            for (int64_t n_rot : {int64_t{64}, int64_t{48}}) {
                CAPTURE(neox);
                CAPTURE(pos);
                CAPTURE(n_rot);
                const int64_t head_dim = 64;
                const auto x = test::random_normal(size_t(head_dim), uint32_t(pos + 7));
                std::vector<float> got = x;
                if (neox)
                    rope_neox_f32(got.data(), head_dim, n_rot, pos, base, scale, nullptr, y);
                else
                    rope_normal_f32(got.data(), head_dim, n_rot, pos, base, scale, nullptr, y);
                const std::vector<float> want = yarn_reference(x, neox, n_rot, pos, base, scale, y);
                // The reference's float angle is off by up to ~pos * 6e-8 rad.
                const float tol = 2e-5f + 6e-8f * float(pos) * 4.0f;
                for (int64_t d = 0; d < head_dim; ++d) {
                    CAPTURE(d);
                    CHECK(std::fabs(got[size_t(d)] - want[size_t(d)]) <= tol);
                }
            }
        }
    }
    // The angle multiplier at the edges: 1 below corr_low, freq_scale above corr_high, linear between.
    CHECK(rope_pair_scale(0, scale, y) == 1.0);
    CHECK(rope_pair_scale(10, scale, y) == 1.0);
    CHECK(rope_pair_scale(23, scale, y) == double(scale));
    CHECK(rope_pair_scale(31, scale, y) == double(scale));
    CHECK(rope_pair_scale(16, scale, y) == doctest::Approx(scale + (1.0 - scale) * (1.0 - 6.0 / 13.0)));
    // Off (ext_factor 0): freq_scale for every pair, as before YaRN.
    CHECK(rope_pair_scale(0, scale, RopeYarn{}) == double(scale));
    // mscale scales the rotated pair's length: a norm check independent of the angles.
    const auto x = test::random_normal(64, 3);
    std::vector<float> r = x;
    rope_neox_f32(r.data(), 64, 64, 777, base, scale, nullptr, y);
    double n0 = 0, n1 = 0;
    for (size_t i = 0; i < 64; ++i) {
        n0 += double(x[i]) * x[i];
        n1 += double(r[i]) * r[i];
    }
    CHECK(std::sqrt(n1 / n0) == doctest::Approx(y.mscale).epsilon(1e-5));
}

TEST_CASE("rope tables (rope_cos_sin + rope_rotate_f32, LayerRope::apply) rotate bit-identically to rope_*_f32") {
    std::vector<float> ff(64), ff2(64);
    for (size_t i = 0; i < ff.size(); ++i) {
        ff[i] = 1.0f + 0.5f * static_cast<float>(i);
        ff2[i] = 1.0f + 0.25f * static_cast<float>(i);
    }
    int checked = 0;
    for (int64_t head_dim : {8, 64, 128}) {
        for (int64_t n_rot : {head_dim, head_dim / 2}) {
            for (int32_t pos : {0, 1, 17, -5, 30000}) {
                for (const float* fptr : {static_cast<const float*>(nullptr), static_cast<const float*>(ff.data())}) {
                    for (bool neox : {false, true}) {
                        CAPTURE(head_dim);
                        CAPTURE(n_rot);
                        CAPTURE(pos);
                        CAPTURE(neox);
                        const auto x = test::random_normal(static_cast<size_t>(head_dim), uint32_t(pos + 100));
                        const float base = 10000.0f, scale = 0.25f;
                        std::vector<float> want = x, got = x, layer = x;
                        if (neox)
                            rope_neox_f32(want.data(), head_dim, n_rot, pos, base, scale, fptr);
                        else
                            rope_normal_f32(want.data(), head_dim, n_rot, pos, base, scale, fptr);
                        std::vector<float> c(size_t(n_rot / 2)), s(size_t(n_rot / 2));
                        rope_cos_sin(n_rot, pos, base, scale, fptr, c.data(), s.data());
                        rope_rotate_f32(got.data(), neox, n_rot, c.data(), s.data());
                        CHECK(std::memcmp(got.data(), want.data(), x.size() * sizeof(float)) == 0);
                        // The same with YaRN: the table carries the angles and mscale.
                        const RopeYarn yarn{1.0f, 3.0f, float(n_rot / 4), 1.2f};
                        std::vector<float> ywant = x, ygot = x, ylayer = x;
                        if (neox)
                            rope_neox_f32(ywant.data(), head_dim, n_rot, pos, base, scale, fptr, yarn);
                        else
                            rope_normal_f32(ywant.data(), head_dim, n_rot, pos, base, scale, fptr, yarn);
                        rope_cos_sin(n_rot, pos, base, scale, fptr, c.data(), s.data(), yarn);
                        rope_rotate_f32(ygot.data(), neox, n_rot, c.data(), s.data());
                        CHECK(std::memcmp(ygot.data(), ywant.data(), x.size() * sizeof(float)) == 0);
                        CHECK(std::memcmp(ygot.data(), want.data(), x.size() * sizeof(float)) != 0); // mscale 1.2
                        LayerRope r;
                        r.neox = neox;
                        r.head_dim = head_dim;
                        r.n_rot = n_rot;
                        r.base = base;
                        r.freq_scale = scale;
                        r.freq_factors = fptr;
                        r.apply(layer.data(), pos);
                        CHECK(std::memcmp(layer.data(), want.data(), x.size() * sizeof(float)) == 0);
                        r.yarn = yarn;   // the per-thread table must see the change
                        r.apply(ylayer.data(), pos);
                        CHECK(std::memcmp(ylayer.data(), ywant.data(), x.size() * sizeof(float)) == 0);
                        ++checked;
                    }
                }
            }
        }
    }
    CHECK(checked == 3 * 2 * 5 * 2 * 2);
    // The per-thread table must notice every change of what the angles depend on, including new factor
    // VALUES at the same address (a model loaded where a freed one lived).
    LayerRope r;
    r.neox = true;
    r.head_dim = r.n_rot = 128;
    r.freq_factors = ff.data();
    const auto x = test::random_normal(128, 9);
    auto expect_direct = [&](const LayerRope& rr, int32_t pos) {
        std::vector<float> want = x, got = x;
        rope_neox_f32(want.data(), rr.head_dim, rr.n_rot, pos, rr.base, rr.freq_scale, rr.freq_factors);
        rr.apply(got.data(), pos);
        CHECK(std::memcmp(got.data(), want.data(), x.size() * sizeof(float)) == 0);
    };
    expect_direct(r, 7);
    expect_direct(r, 8);
    std::vector<float> saved = ff;
    ff = ff2;   // same address, other values
    expect_direct(r, 8);
    ff = saved;
    r.base = 1e6f;
    expect_direct(r, 8);
    r.freq_scale = 0.5f;
    expect_direct(r, 8);
    r.freq_factors = nullptr;
    expect_direct(r, 8);
    r.n_rot = 64;
    expect_direct(r, 8);
}

TEST_CASE("swiglu_f32 and geglu_tanh_f32 give the same bits on one thread and on several") {
    for (int64_t n : {int64_t{1000}, int64_t{1} << 17}) {   // below and above threads_for_elems' cut
        const auto g = test::random_normal(size_t(n), 11, 4.0f), u = test::random_normal(size_t(n), 12);
        const auto un = static_cast<size_t>(n);
        std::vector<float> a(un), b(un), c(un), d(un);
        swiglu_f32(g.data(), u.data(), a.data(), n, 1);
        swiglu_f32(g.data(), u.data(), b.data(), n, 2);
        geglu_tanh_f32(g.data(), u.data(), c.data(), n, 1);
        geglu_tanh_f32(g.data(), u.data(), d.data(), n, 3);
        CHECK(a == b);
        CHECK(c == d);
        for (size_t i = 0; i < size_t(n); i += 997) CHECK(a[i] == silu_f32(g[i]) * u[i]);
    }
    CHECK(threads_for_elems(512, 4) == 1);
    CHECK(threads_for_elems(512 * 8192, 4) == 4);
}

TEST_CASE("softmax_f32, silu_f32, gelu_tanh_f32, swiglu/geglu and softcap match their formulas") {
    for (int64_t n : {1, 5, 100, 4097}) {
        CAPTURE(n);
        auto x = test::random_normal(static_cast<size_t>(n), 4, 8.0f);
        std::vector<double> ref(x.size());
        double m = -1e300, sum = 0.0;
        for (float v : x)
            m = std::max(m, double(v));
        for (size_t i = 0; i < x.size(); ++i)
            sum += ref[i] = std::exp(double(x[i]) - m);
        for (double& r : ref)
            r /= sum;
        softmax_f32(x.data(), n);
        CHECK(max_abs_diff(x, ref) < 1e-6);
    }
    const auto g = test::random_normal(1000, 5, 4.0f), u = test::random_normal(1000, 6);
    std::vector<float> sw(1000), ge(1000), cap = g;
    swiglu_f32(g.data(), u.data(), sw.data(), 1000);
    geglu_tanh_f32(g.data(), u.data(), ge.data(), 1000);
    softcap_f32(cap.data(), 1000, 3.0f);
    for (size_t i = 0; i < g.size(); ++i) {
        const double x = g[i];
        const double silu = x / (1.0 + std::exp(-x));
        const double gelu = 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        CHECK(std::abs(silu_f32(g[i]) - silu) < 1e-5 * (1 + std::abs(silu)));
        CHECK(std::abs(gelu_tanh_f32(g[i]) - gelu) < 1e-5 * (1 + std::abs(gelu)));
        CHECK(std::abs(sw[i] - silu * u[i]) < 1e-5 * (1 + std::abs(silu * u[i])));
        CHECK(std::abs(ge[i] - gelu * u[i]) < 1e-5 * (1 + std::abs(gelu * u[i])));
        CHECK(std::abs(cap[i] - 3.0 * std::tanh(x / 3.0)) < 1e-5);
    }
}

TEST_CASE("argmax_f32 is the plain scan's id: lowest of ties, NaN never larger, a NaN first wins, +0 == -0") {
    auto plain = [](const std::vector<float>& x) {
        int64_t best = 0;
        for (int64_t t = 1; t < static_cast<int64_t>(x.size()); ++t)
            if (x[size_t(t)] > x[size_t(best)]) best = t;
        return best;
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    std::mt19937 rng(5);
    std::uniform_int_distribution<int> small(-3, 3);   // few distinct values: many ties
    int checked = 0;
    for (int64_t n : {1, 2, 15, 16, 17, 33, 1000, 262144}) {
        for (int trial = 0; trial < 6; ++trial) {
            CAPTURE(n);
            CAPTURE(trial);
            std::vector<float> x(static_cast<size_t>(n));
            for (float& v : x) v = static_cast<float>(small(rng));
            if (trial >= 1) x[rng() % x.size()] = nan;
            if (trial == 2) x[0] = nan;
            if (trial == 3) { for (float& v : x) v = v == 0.0f ? -0.0f : -inf; x[rng() % x.size()] = 0.0f; }
            if (trial == 4) x[rng() % x.size()] = inf;
            if (trial == 5) for (float& v : x) v = nan;
            CHECK(argmax_f32(x.data(), n) == plain(x));
            ++checked;
        }
    }
    CHECK(checked == 48);
}

TEST_CASE("dot_f32 matches a double-precision sum") {
    for (int64_t n : {1, 3, 15, 16, 17, 64, 255, 1000, 4096}) {
        CAPTURE(n);
        const auto a = test::random_normal(static_cast<size_t>(n), 7), b = test::random_normal(static_cast<size_t>(n), 8);
        double ref = 0.0, abs_sum = 0.0;
        for (int64_t i = 0; i < n; ++i) {
            ref += double(a[size_t(i)]) * b[size_t(i)];
            abs_sum += std::abs(double(a[size_t(i)]) * b[size_t(i)]);
        }
        CHECK(std::abs(dot_f32(a.data(), b.data(), n) - ref) <= 1e-6 * abs_sum + 1e-7);
    }
}

TEST_CASE("matmul_dequant equals dequantize_row + double dot for every format, bit-identical across threads") {
    const GgmlType types[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                              GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
    struct Size {
        int64_t n_in, n_out, n_cols;
    };
    for (GgmlType type : types) {
        const TypeInfo& ti = type_info(type);
        if (!ti.can_quantize && type != GgmlType::F32) continue;
        for (const Size sz : {Size{256, 3, 1}, Size{512, 37, 4}, Size{768, 300, 9}}) {
            CAPTURE(ti.name);
            CAPTURE(sz.n_in);
            CAPTURE(sz.n_out);
            const auto wf = test::random_normal(size_t(sz.n_in * sz.n_out), 9, 0.1f);
            const size_t rb = row_bytes(type, sz.n_in);
            std::vector<uint8_t> w(rb * size_t(sz.n_out));
            for (int64_t r = 0; r < sz.n_out; ++r) {
                if (type == GgmlType::F32)
                    std::memcpy(w.data() + size_t(r) * rb, wf.data() + r * sz.n_in, rb);
                else
                    quantize_row(type, wf.data() + r * sz.n_in, w.data() + size_t(r) * rb, sz.n_in);
            }
            const auto x = test::random_normal(size_t(sz.n_in * sz.n_cols), 10);
            std::vector<float> y1(size_t(sz.n_out * sz.n_cols)), y2(y1.size()), y3(y1.size());
            matmul_dequant(type, w.data(), sz.n_in, sz.n_out, x.data(), sz.n_cols, y1.data(), 1);
            matmul_dequant(type, w.data(), sz.n_in, sz.n_out, x.data(), sz.n_cols, y2.data(), 2);
            matmul_dequant(type, w.data(), sz.n_in, sz.n_out, x.data(), sz.n_cols, y3.data(), 3);
            CHECK(y1 == y2);
            CHECK(y1 == y3);
            std::vector<float> row(size_t(sz.n_in));
            double worst = 0.0;
            for (int64_t r = 0; r < sz.n_out; ++r) {
                dequantize_row(type, w.data() + size_t(r) * rb, row.data(), sz.n_in);
                for (int64_t c = 0; c < sz.n_cols; ++c) {
                    // Any fast row path must reproduce the reference dequantizer bit for bit.
                    CHECK(y1[size_t(c * sz.n_out + r)] == dot_f32(row.data(), x.data() + c * sz.n_in, sz.n_in));
                    double ref = 0.0, abs_sum = 0.0;
                    for (int64_t i = 0; i < sz.n_in; ++i) {
                        ref += double(row[size_t(i)]) * x[size_t(c * sz.n_in + i)];
                        abs_sum += std::abs(double(row[size_t(i)]) * x[size_t(c * sz.n_in + i)]);
                    }
                    worst = std::max(worst, std::abs(y1[size_t(c * sz.n_out + r)] - ref) / (abs_sum + 1e-30));
                }
            }
            CHECK(worst < 1e-6);
        }
    }
}

TEST_CASE("attention_head matches softmax(q.K * scale) V for f32, f16 and bf16 caches") {
    for (KvElem elem : {KvElem::f32, KvElem::f16, KvElem::bf16}) {
        for (int64_t head_dim : {8, 64, 256}) {
            for (int64_t n_keys : {1, 2, 33, 300}) {
                for (float softcap : {0.0f, 20.0f}) {
                    CAPTURE(int(elem));
                    CAPTURE(head_dim);
                    CAPTURE(n_keys);
                    const int64_t head_dim_v = head_dim;
                    const auto q = test::random_normal(size_t(head_dim), 11);
                    const auto kf = test::random_normal(size_t(n_keys * head_dim), 12);
                    const auto vf = test::random_normal(size_t(n_keys * head_dim_v), 13);
                    // Store K/V in the cache format; the reference reads back the stored values.
                    std::vector<uint8_t> k, v;
                    std::vector<double> kd(kf.size()), vd(vf.size());
                    auto store = [&](const std::vector<float>& src, std::vector<uint8_t>& dst,
                                     std::vector<double>& back) {
                        if (elem == KvElem::f32) {
                            dst.resize(src.size() * 4);
                            std::memcpy(dst.data(), src.data(), dst.size());
                            for (size_t i = 0; i < src.size(); ++i)
                                back[i] = src[i];
                            return;
                        }
                        dst.resize(src.size() * 2);
                        auto* h = reinterpret_cast<uint16_t*>(dst.data());
                        for (size_t i = 0; i < src.size(); ++i) {
                            h[i] = elem == KvElem::f16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
                            back[i] = elem == KvElem::f16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
                        }
                    };
                    store(kf, k, kd);
                    store(vf, v, vd);
                    const float scale = 1.0f / std::sqrt(float(head_dim));
                    std::vector<float> scores(static_cast<size_t>(n_keys)), out(static_cast<size_t>(head_dim_v));
                    attention_head(q.data(), k.data(), v.data(), elem, n_keys, head_dim, head_dim_v, scale, softcap,
                                   scores.data(), out.data());
                    std::vector<double> p(static_cast<size_t>(n_keys)), ref(static_cast<size_t>(head_dim_v), 0.0);
                    double m = -1e300, sum = 0.0;
                    for (int64_t j = 0; j < n_keys; ++j) {
                        double s = 0.0;
                        for (int64_t d = 0; d < head_dim; ++d)
                            s += double(q[size_t(d)]) * kd[size_t(j * head_dim + d)];
                        s *= scale;
                        if (softcap > 0) s = softcap * std::tanh(s / softcap);
                        p[size_t(j)] = s;
                        m = std::max(m, s);
                    }
                    for (double& s : p)
                        sum += s = std::exp(s - m);
                    for (int64_t j = 0; j < n_keys; ++j)
                        for (int64_t d = 0; d < head_dim_v; ++d)
                            ref[size_t(d)] += p[size_t(j)] / sum * vd[size_t(j * head_dim_v + d)];
                    CHECK(max_abs_diff(out, ref) < 1e-5);
                }
            }
        }
    }
}

TEST_CASE("threads_for_work keeps small work on one thread") {
    CHECK(threads_for_work(1000, 8) == 1);
    CHECK(threads_for_work(int64_t{1} << 24, 8) == 8);
    CHECK(threads_for_work(int64_t{1} << 24, 0) == 1);
}

TEST_CASE("exp_f32 is within 2 ulp of exp over [-87, 88], and clamps outside") {
    double worst = 0;
    for (int i = 0; i <= 200000; ++i) {
        const float x = -87.0f + 175.0f * static_cast<float>(i) / 200000.0f;
        const double want = std::exp(static_cast<double>(x));
        const double ulp = std::nextafter(static_cast<float>(want), INFINITY) - static_cast<float>(want);
        worst = std::max(worst, std::abs(exp_f32(x) - want) / ulp);
    }
    MESSAGE("exp_f32: worst error " << worst << " ulp");
    CHECK(worst <= 2.0);
    CHECK(exp_f32(0.0f) == 1.0f);
    CHECK(exp_f32(-1000.0f) == exp_f32(-87.0f));
    CHECK(exp_f32(1000.0f) == exp_f32(88.0f));
    CHECK(std::isfinite(exp_f32(std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::isnan(silu_f32(std::numeric_limits<float>::quiet_NaN())));
    CHECK(std::abs(silu_f32(-200.0f)) < 1e-30f);   // -200 / (1 + e^87): the clamp, not an underflow
    CHECK(silu_f32(200.0f) == 200.0f);
}

TEST_CASE("the AVX2 SwiGLU kernel gives its scalar twin's bits at every size") {
    const CpuKernels* k = cpu_kernels_for(CpuIsa::avx2);
    const SwigluFn avx2 = k ? k->swiglu : nullptr;
    if (!avx2) {
        MESSAGE("skipped: no AVX2 on this build or CPU");
        return;
    }
    for (int64_t n : {1, 7, 8, 9, 63, 1000, 8192, 8195}) {
        CAPTURE(n);
        auto g = test::random_normal(size_t(n), 21, 6.0f);
        const auto u = test::random_normal(size_t(n), 22);
        if (n > 8) {   // the ends of the range and beyond, inside the vector part
            g[0] = 95.0f;
            g[1] = -95.0f;
            g[2] = 87.5f;
            g[3] = -88.5f;
            g[4] = 0.0f;
        }
        std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
        swiglu_rows_scalar(g.data(), u.data(), a.data(), n);
        avx2(g.data(), u.data(), b.data(), n);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    }
}

} // namespace tern
