// The Gated DeltaNet kernels (kernels/cpu/causal_conv1d.h, gated_delta.h, rmsnorm_gated.h): the scalar twins
// against double-precision references and small hand-computed cases, every SIMD set against the scalar twins,
// prefill in one call against token-by-token calls, and the chunked delta rule against the recurrent one, on
// random data at several sizes (odd ones included).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/rmsnorm_gated.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

std::vector<const CpuKernels*> simd_sets() {
    std::vector<const CpuKernels*> v;
    for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon})
        if (const CpuKernels* k = cpu_kernels_for(isa)) v.push_back(k);
    return v;
}

// max |a - b| / max(max |b|, 1e-30).
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
        m = std::max(m, std::abs(static_cast<double>(b[i])));
    }
    return d / std::max(m, 1e-30);
}
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
    double d = 0.0, m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
        m = std::max(m, std::abs(b[i]));
    }
    return d / std::max(m, 1e-30);
}

// ---- causal conv1d ----

struct ConvCase {
    int64_t n_tokens, channels;
    int d_conv;
};

TEST_CASE("causal_conv1d: a hand-computed channel") {
    const float w[3] = {1.0f, 2.0f, 3.0f};
    float state[2] = {0.0f, 0.0f};
    const float x[3] = {1.0f, 2.0f, 3.0f};
    float y[3] = {};
    CausalConv1dArgs a;
    a.n_tokens = 3, a.channels = 1, a.d_conv = 3, a.x = x, a.x_stride = 1, a.w = w, a.state = state, a.y = y;
    a.y_stride = 1, a.silu = false;
    causal_conv1d_scalar(a, 0, 1);
    CHECK(y[0] == 3.0f);    // 3*1
    CHECK(y[1] == 8.0f);    // 2*1 + 3*2
    CHECK(y[2] == 14.0f);   // 1*1 + 2*2 + 3*3
    CHECK(state[0] == 2.0f);
    CHECK(state[1] == 3.0f);
    // A decode step continues from the state: 1*2 + 2*3 + 3*4.
    const float x4 = 4.0f;
    a.n_tokens = 1, a.x = &x4;
    causal_conv1d_scalar(a, 0, 1);
    CHECK(y[0] == 20.0f);
    CHECK(state[0] == 3.0f);
    CHECK(state[1] == 4.0f);
}

TEST_CASE("causal_conv1d: scalar against double, SIMD sets bit for bit, prefill against decode steps") {
    const ConvCase cases[] = {{1, 1, 4}, {3, 7, 4}, {17, 8, 4}, {5, 33, 2}, {9, 100, 5}, {64, 72, 4}, {2, 19, 1},
                              {6, 40, 8}, {4, 24, 11}};
    uint32_t seed = 10;
    for (const ConvCase& c : cases) {
        for (bool silu : {false, true}) {
            CAPTURE(c.n_tokens);
            CAPTURE(c.channels);
            CAPTURE(c.d_conv);
            CAPTURE(silu);
            const int64_t ch = c.channels, n = c.n_tokens;
            const int d = c.d_conv;
            const int64_t xs = ch + 3;   // a row stride wider than the row
            const auto x = test::random_normal(static_cast<size_t>(n * xs), seed++);
            const auto w = test::random_normal(static_cast<size_t>(ch * d), seed++, 0.5f);
            const auto s0 = test::random_normal(static_cast<size_t>((d - 1) * ch), seed++);

            // Reference in double over (state, x).
            std::vector<double> want(static_cast<size_t>(n * ch));
            for (int64_t t = 0; t < n; ++t)
                for (int64_t cc = 0; cc < ch; ++cc) {
                    double acc = 0.0;
                    for (int i = 0; i < d; ++i) {
                        const int64_t r = t + i;   // row of (state, x)
                        const double in = r < d - 1 ? s0[static_cast<size_t>(r * ch + cc)]
                                                    : x[static_cast<size_t>((r - (d - 1)) * xs + cc)];
                        acc += static_cast<double>(w[static_cast<size_t>(cc * d + i)]) * in;
                    }
                    want[static_cast<size_t>(t * ch + cc)] = silu ? acc / (1.0 + std::exp(-acc)) : acc;
                }

            auto run = [&](CausalConv1dFn fn, bool stepwise, std::vector<float>& state) {
                state = s0;
                std::vector<float> y(static_cast<size_t>(n * ch));
                CausalConv1dArgs a;
                a.channels = ch, a.d_conv = d, a.x_stride = xs, a.w = w.data(), a.state = state.data();
                a.y_stride = ch, a.silu = silu;
                if (stepwise) {
                    for (int64_t t = 0; t < n; ++t) {
                        a.n_tokens = 1, a.x = x.data() + t * xs, a.y = y.data() + t * ch;
                        fn(a, 0, ch);
                    }
                } else {
                    a.n_tokens = n, a.x = x.data(), a.y = y.data();
                    fn(a, 0, ch);
                }
                return y;
            };
            std::vector<float> st_ref, st;
            const auto y_ref = run(causal_conv1d_scalar, false, st_ref);
            CHECK(rel_err(y_ref, want) < 2e-6);
            // The state is the last d - 1 rows of (state, x).
            for (int r = 0; r < d - 1; ++r)
                for (int64_t cc = 0; cc < ch; ++cc) {
                    const int64_t row = n + r;   // row of (state, x), counted from the state's first
                    const float e = row < d - 1 ? s0[static_cast<size_t>(row * ch + cc)]
                                                : x[static_cast<size_t>((row - (d - 1)) * xs + cc)];
                    REQUIRE(st_ref[static_cast<size_t>(r * ch + cc)] == e);
                }
            const auto y_step = run(causal_conv1d_scalar, true, st);
            CHECK(y_step == y_ref);
            CHECK(st == st_ref);
            for (const CpuKernels* k : simd_sets()) {
                CAPTURE(cpu_isa_name(k->isa));
                CHECK(run(k->causal_conv1d, false, st) == y_ref);
                CHECK(st == st_ref);
                CHECK(run(k->causal_conv1d, true, st) == y_ref);
                CHECK(st == st_ref);
            }
        }
    }
}

// ---- gated delta rule ----

struct DeltaCase {
    int64_t n_tokens;
    int n_k_heads, n_v_heads, d_k, d_v;
    bool grouped = false;
};

struct DeltaData {
    DeltaCase c;
    std::vector<float> q, k, v, g, beta, state0;
    int64_t qs, ks, vs, gbs;
};

// q, k L2-normalised per head as the layer gives them, g in [-2.5, 0), beta in (0, 1), a random start state.
DeltaData make_delta(const DeltaCase& c, uint32_t seed) {
    DeltaData d;
    d.c = c;
    d.qs = c.n_k_heads * c.d_k + 1;
    d.ks = c.n_k_heads * c.d_k + 2;
    d.vs = c.n_v_heads * c.d_v + 3;
    d.gbs = c.n_v_heads + 1;
    d.q = test::random_normal(static_cast<size_t>(c.n_tokens * d.qs), seed);
    d.k = test::random_normal(static_cast<size_t>(c.n_tokens * d.ks), seed + 1);
    d.v = test::random_normal(static_cast<size_t>(c.n_tokens * d.vs), seed + 2);
    for (int64_t t = 0; t < c.n_tokens; ++t) {
        l2_normalize_heads(d.q.data() + t * d.qs, c.n_k_heads, c.d_k, 1e-6f);
        l2_normalize_heads(d.k.data() + t * d.ks, c.n_k_heads, c.d_k, 1e-6f);
    }
    std::mt19937 rng(seed + 3);
    std::uniform_real_distribution<float> gd(-2.5f, -0.001f), bd(0.02f, 0.98f);
    d.g.resize(static_cast<size_t>(c.n_tokens * d.gbs));
    d.beta.resize(d.g.size());
    for (size_t i = 0; i < d.g.size(); ++i) d.g[i] = gd(rng), d.beta[i] = bd(rng);
    d.state0 = test::random_normal(static_cast<size_t>(c.n_v_heads) * c.d_v * c.d_k, seed + 4, 0.3f);
    return d;
}

GatedDeltaArgs args_of(const DeltaData& d, std::vector<float>& state, std::vector<float>& out) {
    const DeltaCase& c = d.c;
    state = d.state0;
    out.assign(static_cast<size_t>(c.n_tokens * c.n_v_heads * c.d_v), 0.0f);
    GatedDeltaArgs a;
    a.n_tokens = c.n_tokens, a.n_k_heads = c.n_k_heads, a.n_v_heads = c.n_v_heads, a.d_k = c.d_k, a.d_v = c.d_v;
    a.grouped_k_heads = c.grouped;
    a.q = d.q.data(), a.q_stride = d.qs, a.k = d.k.data(), a.k_stride = d.ks, a.v = d.v.data(), a.v_stride = d.vs;
    a.g = d.g.data(), a.beta = d.beta.data(), a.gb_stride = d.gbs;
    a.state = state.data(), a.out = out.data(), a.out_stride = c.n_v_heads * c.d_v;
    a.scale = 1.0f / std::sqrt(static_cast<float>(c.d_k));
    return a;
}

// The recurrence in double, in the [d_k][d_v] orientation of the layer's description (S^T of the kernels' rows):
// S = e^g S + beta k (v - e^g S^T k)^T, o = scale S^T q.
void delta_reference(const DeltaData& d, std::vector<double>& state, std::vector<double>& out) {
    const DeltaCase& c = d.c;
    const int dk = c.d_k, dv = c.d_v;
    state.assign(d.state0.begin(), d.state0.end());   // kernels' layout [h][i < dv][j < dk]
    out.assign(static_cast<size_t>(c.n_tokens * c.n_v_heads * dv), 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dk));
    for (int h = 0; h < c.n_v_heads; ++h) {
        const int kh = c.grouped ? h / (c.n_v_heads / c.n_k_heads) : h % c.n_k_heads;
        double* S = state.data() + static_cast<size_t>(h) * dv * dk;
        for (int64_t t = 0; t < c.n_tokens; ++t) {
            const float* k = d.k.data() + t * d.ks + kh * dk;
            const float* q = d.q.data() + t * d.qs + kh * dk;
            const float* v = d.v.data() + t * d.vs + h * dv;
            const double eg = std::exp(static_cast<double>(d.g[static_cast<size_t>(t * d.gbs + h)]));
            const double b = d.beta[static_cast<size_t>(t * d.gbs + h)];
            for (int x = 0; x < dv * dk; ++x) S[x] *= eg;
            std::vector<double> delta(static_cast<size_t>(dv));
            for (int i = 0; i < dv; ++i) {   // (S^T k)[i] in the [d_k][d_v] orientation
                double p = 0.0;
                for (int j = 0; j < dk; ++j) p += S[i * dk + j] * k[j];
                delta[static_cast<size_t>(i)] = b * (v[i] - p);
            }
            for (int i = 0; i < dv; ++i)
                for (int j = 0; j < dk; ++j) S[i * dk + j] += k[j] * delta[static_cast<size_t>(i)];
            for (int i = 0; i < dv; ++i) {
                double o = 0.0;
                for (int j = 0; j < dk; ++j) o += S[i * dk + j] * q[j];
                out[static_cast<size_t>(t * c.n_v_heads * dv + h * dv + i)] = scale * o;
            }
        }
    }
}

TEST_CASE("gated delta rule: a hand-computed step") {
    // One head, d_k = d_v = 2, S = I (rows: outputs), k = (1, 0), q = (0, 1), v = (2, 3), exp(g) = 0.5,
    // beta = 0.5. Decayed S = 0.5 I; deltas 0.5 (2 - 0.5) = 0.75 and 0.5 (3 - 0) = 1.5; rows += delta k:
    // (1.25, 0) and (1.5, 0.5); o = S q = (0, 0.5).
    const float q[2] = {0.0f, 1.0f}, k[2] = {1.0f, 0.0f}, v[2] = {2.0f, 3.0f};
    const float g = std::log(0.5f), beta = 0.5f;
    for (GatedDeltaFn fn : {gated_delta_recurrent_scalar, gated_delta_chunked_scalar}) {
        float state[4] = {1.0f, 0.0f, 0.0f, 1.0f};
        float out[2] = {-1.0f, -1.0f};
        GatedDeltaArgs a;
        a.n_tokens = 1, a.n_k_heads = 1, a.n_v_heads = 1, a.d_k = 2, a.d_v = 2;
        a.q = q, a.k = k, a.v = v, a.g = &g, a.beta = &beta, a.state = state, a.out = out;
        a.q_stride = a.k_stride = a.v_stride = a.out_stride = 2, a.gb_stride = 1, a.scale = 1.0f;
        fn(a, 0, 1);
        CHECK(out[0] == doctest::Approx(0.0).epsilon(1e-6));
        CHECK(out[1] == doctest::Approx(0.5).epsilon(1e-6));
        CHECK(state[0] == doctest::Approx(1.25).epsilon(1e-6));
        CHECK(state[1] == doctest::Approx(0.0).epsilon(1e-6));
        CHECK(state[2] == doctest::Approx(1.5).epsilon(1e-6));
        CHECK(state[3] == doctest::Approx(0.5).epsilon(1e-6));
    }
}

TEST_CASE("gated delta rule: recurrent and chunked, scalar and SIMD, against the double recurrence") {
    const DeltaCase cases[] = {{1, 1, 1, 4, 4},      {5, 1, 2, 7, 5},           {64, 2, 4, 16, 16},
                               {100, 2, 6, 33, 17},  {37, 1, 1, 128, 128},      {130, 2, 4, 32, 24},
                               {3, 3, 3, 9, 1},      {40, 2, 6, 24, 8, true},   {70, 3, 6, 128, 16, true}};
    uint32_t seed = 100;
    for (const DeltaCase& c : cases) {
        CAPTURE(c.n_tokens);
        CAPTURE(c.n_k_heads);
        CAPTURE(c.n_v_heads);
        CAPTURE(c.d_k);
        CAPTURE(c.d_v);
        CAPTURE(c.grouped);
        const DeltaData d = make_delta(c, seed);
        seed += 10;
        std::vector<double> s_want, o_want;
        delta_reference(d, s_want, o_want);

        std::vector<float> s_rec, o_rec;
        GatedDeltaArgs a = args_of(d, s_rec, o_rec);
        gated_delta_recurrent_scalar(a, 0, c.n_v_heads);
        MESSAGE("recurrent scalar vs double: out ", rel_err(o_rec, o_want), " state ", rel_err(s_rec, s_want));
        CHECK(rel_err(o_rec, o_want) < 5e-6);
        CHECK(rel_err(s_rec, s_want) < 5e-6);

        // The same tokens one call at a time give the same bits.
        {
            std::vector<float> s1, o1;
            GatedDeltaArgs b = args_of(d, s1, o1);
            for (int64_t t = 0; t < c.n_tokens; ++t) {
                GatedDeltaArgs bt = b;
                bt.n_tokens = 1, bt.q = b.q + t * b.q_stride, bt.k = b.k + t * b.k_stride, bt.v = b.v + t * b.v_stride;
                bt.g = b.g + t * b.gb_stride, bt.beta = b.beta + t * b.gb_stride, bt.out = b.out + t * b.out_stride;
                gated_delta_recurrent_scalar(bt, 0, c.n_v_heads);
            }
            CHECK(o1 == o_rec);
            CHECK(s1 == s_rec);
        }

        for (int chunk : {1, 7, 16, 64}) {
            CAPTURE(chunk);
            std::vector<float> s_ch, o_ch;
            GatedDeltaArgs b = args_of(d, s_ch, o_ch);
            b.chunk = chunk;
            gated_delta_chunked_scalar(b, 0, c.n_v_heads);
            const double eo = rel_err(o_ch, o_rec), es = rel_err(s_ch, s_rec);
            if (chunk == 64) MESSAGE("chunked(64) scalar vs recurrent scalar: out ", eo, " state ", es);
            CHECK(eo < 1e-5);
            CHECK(es < 1e-5);
            for (const CpuKernels* k : simd_sets()) {
                CAPTURE(cpu_isa_name(k->isa));
                std::vector<float> s2, o2;
                GatedDeltaArgs e = args_of(d, s2, o2);
                e.chunk = chunk;
                k->gated_delta_chunked(e, 0, c.n_v_heads);
                CHECK(rel_err(o2, o_ch) < 5e-6);
                CHECK(rel_err(s2, s_ch) < 5e-6);
            }
        }
        for (const CpuKernels* k : simd_sets()) {
            CAPTURE(cpu_isa_name(k->isa));
            std::vector<float> s2, o2;
            GatedDeltaArgs e = args_of(d, s2, o2);
            k->gated_delta_recurrent(e, 0, c.n_v_heads);
            MESSAGE(std::string(cpu_isa_name(k->isa)), " recurrent vs scalar: out ", rel_err(o2, o_rec), " state ",
                    rel_err(s2, s_rec));
            CHECK(rel_err(o2, o_rec) < 5e-6);
            CHECK(rel_err(s2, s_rec) < 5e-6);
        }
        // Heads split over calls give the same bits as one call.
        if (c.n_v_heads > 1) {
            std::vector<float> s3, o3;
            GatedDeltaArgs e = args_of(d, s3, o3);
            gated_delta_recurrent_scalar(e, 0, 1);
            gated_delta_recurrent_scalar(e, 1, c.n_v_heads);
            CHECK(o3 == o_rec);
            CHECK(s3 == s_rec);
        }
    }
}

TEST_CASE("gated delta rule: a prefill in chunks then decode steps continue the recurrence") {
    const DeltaCase c{90, 2, 4, 64, 64};
    const DeltaData d = make_delta(c, 777);
    std::vector<double> s_want, o_want;
    delta_reference(d, s_want, o_want);
    std::vector<float> s, o;
    GatedDeltaArgs a = args_of(d, s, o);
    GatedDeltaArgs pre = a;
    pre.n_tokens = 80;
    gated_delta_chunked_scalar(pre, 0, c.n_v_heads);
    GatedDeltaArgs rest = a;
    rest.n_tokens = 10, rest.q = a.q + 80 * a.q_stride, rest.k = a.k + 80 * a.k_stride, rest.v = a.v + 80 * a.v_stride;
    rest.g = a.g + 80 * a.gb_stride, rest.beta = a.beta + 80 * a.gb_stride, rest.out = a.out + 80 * a.out_stride;
    gated_delta_recurrent_scalar(rest, 0, c.n_v_heads);
    CHECK(rel_err(o, o_want) < 1e-5);
    CHECK(rel_err(s, s_want) < 1e-5);
}

// ---- the small steps around the rule ----

TEST_CASE("gated delta gates, L2 norm of heads and the gated RMSNorm against double") {
    for (int n : {1, 5, 32, 48}) {
        CAPTURE(n);
        const auto alpha = test::random_normal(static_cast<size_t>(n), 1, 4.0f);
        const auto bin = test::random_normal(static_cast<size_t>(n), 2, 4.0f);
        const auto dt = test::random_normal(static_cast<size_t>(n), 3);
        auto a = test::random_normal(static_cast<size_t>(n), 4);
        for (float& x : a) x = -std::exp(x);
        std::vector<float> g(static_cast<size_t>(n)), beta(static_cast<size_t>(n));
        gated_delta_gates(alpha.data(), bin.data(), dt.data(), a.data(), g.data(), beta.data(), n);
        for (int h = 0; h < n; ++h) {
            const double x = static_cast<double>(alpha[h] + dt[h]);
            const double sp = x > 20.0 ? x : std::log1p(std::exp(x));
            CHECK(g[h] == doctest::Approx(sp * a[h]).epsilon(1e-6));
            CHECK(g[h] <= 0.0f);
            CHECK(beta[h] == doctest::Approx(1.0 / (1.0 + std::exp(-static_cast<double>(bin[h])))).epsilon(1e-6));
        }
    }
    for (int64_t d : {1, 3, 64, 129}) {
        CAPTURE(d);
        const int64_t heads = 3;
        auto x = test::random_normal(static_cast<size_t>(heads * d), 5, 2.0f);
        const auto x0 = x;
        l2_normalize_heads(x.data(), heads, d, 1e-6f);
        for (int64_t h = 0; h < heads; ++h) {
            double ss = 0.0;
            for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x0[h * d + i]) * x0[h * d + i];
            for (int64_t i = 0; i < d; ++i)
                CHECK(x[h * d + i] == doctest::Approx(x0[h * d + i] / std::sqrt(ss + 1e-6)).epsilon(1e-6));
        }
        const auto z = test::random_normal(static_cast<size_t>(heads * d), 6, 2.0f);
        const auto w = test::random_normal(static_cast<size_t>(d), 7);
        std::vector<float> y(static_cast<size_t>(heads * d));
        rmsnorm_gated_f32(x0.data(), z.data(), w.data(), y.data(), heads, d, 1e-6f);
        for (int64_t h = 0; h < heads; ++h) {
            double ss = 0.0;
            for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x0[h * d + i]) * x0[h * d + i];
            const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + 1e-6);
            for (int64_t i = 0; i < d; ++i) {
                const double zz = z[h * d + i];
                const double want = x0[h * d + i] * inv * w[i] * zz / (1.0 + std::exp(-zz));
                CHECK(y[h * d + i] == doctest::Approx(want).epsilon(1e-5).scale(1e-6));
            }
        }
    }
}

} // namespace
} // namespace tern
