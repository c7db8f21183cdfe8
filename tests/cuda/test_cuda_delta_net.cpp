// kernels/cuda/delta_net.h (and the gated RMSNorm as rmsnorm_rows + swiglu) against the CPU scalar twins
// (kernels/cpu/causal_conv1d.h, gated_delta.h, rmsnorm_gated.h) on random data at several sizes, odd ones
// included.
//
// Tolerances, which must hold on a GPU as well as in the emulator:
//   causal_conv1d: bit for bit (the same fma chain and tern's exp_f32 in silu on both sides).
//   l2_normalize_heads: 2 ulp (the double sum of squares added in another order).
//   gated_delta_gates: 1e-6 relative (the device's double exp / log1p within a few ulp of double).
//   gated_delta: normalised error 5e-6 on the outputs and the state (float dots summed in another order; the
//     CPU's own SIMD and chunked kernels agree with the twin to under 1e-6 on the same kind of data).
//   gated RMSNorm: 4 ulp and a normalised error of 1e-6 (rmsnorm_rows's tolerance, test_cuda_elementwise.cpp).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/rmsnorm_gated.h"
#include "kernels/cuda/delta_net.h"
#include "kernels/cuda/elementwise.h"
#include "tests/cuda_device_array.h"
#include "tests/kernel_test_data.h"

using tern::test::DeviceArray;
using tern::test::normalised_error;
using tern::test::ulp_distance;

namespace {

TEST_CASE("cuda causal_conv1d equals the CPU twin bit for bit, in one call and step by step") {
    struct Case {
        int64_t n_tokens, channels;
        int d_conv;
    };
    const Case cases[] = {{1, 1, 4},  {5, 33, 4}, {17, 130, 4}, {64, 257, 4}, {3, 19, 2},
                          {9, 40, 8}, {4, 7, 1},  {40, 50, 3},  {100, 9, 8},  {33, 129, 1}};
    uint32_t seed = 1;
    for (const Case& c : cases) {
        for (bool silu : {false, true}) {
            CAPTURE(c.n_tokens);
            CAPTURE(c.channels);
            CAPTURE(c.d_conv);
            CAPTURE(silu);
            const int64_t ch = c.channels, n = c.n_tokens, xs = ch + 5;
            const int d = c.d_conv;
            const auto x = tern::test::random_normal(static_cast<size_t>(n * xs), seed++);
            const auto w = tern::test::random_normal(static_cast<size_t>(ch * d), seed++, 0.5f);
            const auto s0 = tern::test::random_normal(static_cast<size_t>(std::max(d - 1, 1) * ch), seed++);

            std::vector<float> st = s0, y(static_cast<size_t>(n * ch));
            tern::CausalConv1dArgs a;
            a.n_tokens = n, a.channels = ch, a.d_conv = d, a.x = x.data(), a.x_stride = xs, a.w = w.data();
            a.state = st.data(), a.y = y.data(), a.y_stride = ch, a.silu = silu;
            tern::causal_conv1d_scalar(a, 0, ch);

            DeviceArray<float> dx(x), dw(w), ds(s0), dy(y.size());
            tern::cuda::causal_conv1d(dx.get(), xs, dw.get(), ds.get(), dy.get(), ch, n, ch, d, silu, nullptr);
            CHECK(dy.read() == y);
            CHECK(ds.read() == st);

            DeviceArray<float> ds2(s0), dy2(y.size());
            for (int64_t t = 0; t < n; ++t)
                tern::cuda::causal_conv1d(dx.get() + t * xs, xs, dw.get(), ds2.get(), dy2.get() + t * ch, ch, 1, ch, d,
                                          silu, nullptr);
            CHECK(dy2.read() == y);
            CHECK(ds2.read() == st);
        }
    }
}

TEST_CASE("cuda l2_normalize_heads and gated_delta_gates against the CPU") {
    for (int d : {1, 31, 64, 128, 129}) {
        CAPTURE(d);
        const int64_t n = 3, heads = 5, stride = heads * d + 2;
        auto x = tern::test::random_normal(static_cast<size_t>(n * stride), 20 + d, 3.0f);
        DeviceArray<float> dx(x);
        tern::cuda::l2_normalize_heads(dx.get(), n, stride, static_cast<int>(heads), d, 1e-6f, nullptr);
        for (int64_t t = 0; t < n; ++t) tern::l2_normalize_heads(x.data() + t * stride, heads, d, 1e-6f);
        const auto got = dx.read();
        int64_t worst = 0;
        for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, ulp_distance(got[i], x[i]));
        CHECK(worst <= 2);
    }
    for (int nh : {1, 7, 32, 48}) {
        CAPTURE(nh);
        const int64_t n = 4, in_stride = nh + 3, out_stride = nh + 1;
        const auto alpha = tern::test::random_normal(static_cast<size_t>(n * in_stride), 40, 6.0f);
        const auto bin = tern::test::random_normal(static_cast<size_t>(n * in_stride), 41, 4.0f);
        const auto dt = tern::test::random_normal(static_cast<size_t>(nh), 42);
        auto an = tern::test::random_normal(static_cast<size_t>(nh), 43);
        for (float& v : an) v = -std::exp(v);
        std::vector<float> g(static_cast<size_t>(n * out_stride)), b(g.size());
        for (int64_t t = 0; t < n; ++t)
            tern::gated_delta_gates(alpha.data() + t * in_stride, bin.data() + t * in_stride, dt.data(), an.data(),
                                    g.data() + t * out_stride, b.data() + t * out_stride, nh);
        DeviceArray<float> da(alpha), db(bin), ddt(dt), dan(an), dg(g.size()), dbeta(g.size());
        tern::cuda::gated_delta_gates(da.get(), db.get(), in_stride, ddt.get(), dan.get(), dg.get(), dbeta.get(),
                                      out_stride, n, nh, nullptr);
        const auto gg = dg.read(), bb = dbeta.read();
        for (int64_t t = 0; t < n; ++t)
            for (int h = 0; h < nh; ++h) {
                const size_t i = static_cast<size_t>(t * out_stride + h);
                CHECK(gg[i] == doctest::Approx(g[i]).epsilon(1e-6));
                CHECK(bb[i] == doctest::Approx(b[i]).epsilon(1e-6));
            }
    }
}

TEST_CASE("cuda gated_delta against the CPU recurrent twin, prefill then decode steps") {
    struct Case {
        int64_t n_tokens;
        int n_k_heads, n_v_heads, d_k, d_v;
        bool grouped = false;
    };
    const Case cases[] = {{1, 1, 1, 4, 4},     {6, 1, 2, 7, 5},    {33, 2, 4, 16, 16},      {20, 2, 6, 33, 17},
                          {9, 1, 2, 128, 128}, {5, 2, 4, 256, 40}, {3, 3, 3, 100, 1},       {7, 2, 6, 64, 20, true},
                          {4, 1, 3, 128, 128, true}};
    uint32_t seed = 300;
    for (const Case& c : cases) {
        CAPTURE(c.n_tokens);
        CAPTURE(c.n_k_heads);
        CAPTURE(c.n_v_heads);
        CAPTURE(c.d_k);
        CAPTURE(c.d_v);
        CAPTURE(c.grouped);
        const int64_t qs = c.n_k_heads * c.d_k + 1, vs = c.n_v_heads * c.d_v + 3, gbs = c.n_v_heads + 1;
        const int64_t os = c.n_v_heads * c.d_v;
        auto q = tern::test::random_normal(static_cast<size_t>(c.n_tokens * qs), seed++);
        auto k = tern::test::random_normal(static_cast<size_t>(c.n_tokens * qs), seed++);
        const auto v = tern::test::random_normal(static_cast<size_t>(c.n_tokens * vs), seed++);
        for (int64_t t = 0; t < c.n_tokens; ++t) {
            tern::l2_normalize_heads(q.data() + t * qs, c.n_k_heads, c.d_k, 1e-6f);
            tern::l2_normalize_heads(k.data() + t * qs, c.n_k_heads, c.d_k, 1e-6f);
        }
        std::mt19937 rng(seed++);
        std::uniform_real_distribution<float> gd(-2.5f, -0.001f), bd(0.02f, 0.98f);
        std::vector<float> g(static_cast<size_t>(c.n_tokens * gbs)), b(g.size());
        for (size_t i = 0; i < g.size(); ++i) g[i] = gd(rng), b[i] = bd(rng);
        const auto s0 = tern::test::random_normal(static_cast<size_t>(c.n_v_heads) * c.d_v * c.d_k, seed++, 0.3f);

        std::vector<float> st = s0, out(static_cast<size_t>(c.n_tokens * os));
        tern::GatedDeltaArgs a;
        a.n_tokens = c.n_tokens, a.n_k_heads = c.n_k_heads, a.n_v_heads = c.n_v_heads, a.d_k = c.d_k, a.d_v = c.d_v;
        a.grouped_k_heads = c.grouped;
        a.q = q.data(), a.q_stride = qs, a.k = k.data(), a.k_stride = qs, a.v = v.data(), a.v_stride = vs;
        a.g = g.data(), a.beta = b.data(), a.gb_stride = gbs, a.state = st.data(), a.out = out.data();
        a.out_stride = os, a.scale = 1.0f / std::sqrt(static_cast<float>(c.d_k));
        tern::gated_delta_recurrent_scalar(a, 0, c.n_v_heads);

        DeviceArray<float> dq(q), dk(k), dv(v), dg(g), db(b), ds(s0), dout(out.size());
        tern::cuda::GatedDeltaParams p;
        p.n_k_heads = c.n_k_heads, p.n_v_heads = c.n_v_heads, p.d_k = c.d_k, p.d_v = c.d_v;
        p.grouped_k_heads = c.grouped;
        p.q_stride = qs, p.k_stride = qs, p.v_stride = vs, p.gb_stride = gbs, p.out_stride = os, p.scale = a.scale;
        p.state = ds.get();
        // A prefill of all tokens but the last, then the last one as a decode step.
        const int64_t split = c.n_tokens > 1 ? c.n_tokens - 1 : 1;
        for (auto [t0, nt] : {std::pair<int64_t, int64_t>{0, split}, {split, c.n_tokens - split}}) {
            if (nt <= 0) continue;
            p.n_tokens = nt;
            p.q = dq.get() + t0 * qs, p.k = dk.get() + t0 * qs, p.v = dv.get() + t0 * vs;
            p.g = dg.get() + t0 * gbs, p.beta = db.get() + t0 * gbs, p.out = dout.get() + t0 * os;
            tern::cuda::gated_delta(p, nullptr);
        }
        const double eo = normalised_error(dout.read(), out), es = normalised_error(ds.read(), st);
        MESSAGE("gated_delta vs CPU twin: out ", eo, " state ", es);
        CHECK(eo < 5e-6);
        CHECK(es < 5e-6);
    }
}

TEST_CASE("cuda gated RMSNorm as rmsnorm_rows then swiglu equals rmsnorm_gated_f32") {
    for (int d : {1, 17, 64, 128}) {
        CAPTURE(d);
        const int64_t heads = 6;
        const auto o = tern::test::random_normal(static_cast<size_t>(heads * d), 60, 2.0f);
        const auto z = tern::test::random_normal(static_cast<size_t>(heads * d), 61, 2.0f);
        const auto w = tern::test::random_normal(static_cast<size_t>(d), 62);
        std::vector<float> y(o.size());
        tern::rmsnorm_gated_f32(o.data(), z.data(), w.data(), y.data(), heads, d, 1e-6f);
        DeviceArray<float> dO(o), dz(z), dw(w), dy(o.size());
        tern::cuda::rmsnorm_rows(dO.get(), dw.get(), dy.get(), heads, d, 1e-6f, nullptr);
        tern::cuda::swiglu(dz.get(), dy.get(), dy.get(), heads * d, nullptr);
        const auto got = dy.read();
        int64_t worst = 0;
        for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, ulp_distance(got[i], y[i]));
        CHECK(worst <= 4);
        CHECK(normalised_error(got, y) < 1e-6);
    }
}

} // namespace
