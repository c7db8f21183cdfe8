// The mixture-of-experts kernels through the CUDA emulator (kernels/cuda/moe.h, the expert launches of
// kernels/cuda/matmul.h and matmul_q8.h):
//   - route_experts: the ids equal engine/moe_router.h's (the CPU's) on random logits and on logits full of
//     ties, NaNs and infinities, for the three gatings (gpt-oss's softmax_weight included), with and without
//     normalisation and scale; the weights within a few ulp (the device's expf);
//   - add_expert_bias: each slot's row plus its expert's bias row, bit for bit the host's addition;
//   - matmul_experts(_glu) and matmul_q8_experts(_glu): per slot bit for bit the plain launch of the slot's
//     expert and column (matmul / matmul_glu / matmul_q8 / matmul_q8_glu, themselves tested against the CPU's
//     reference dequantization), and within f32 rounding of a double product of the reference dequantization;
//   - moe_combine bit for bit the CPU backend's rank-order sum; copy_rows' gathers and scatters exactly.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine/model_config.h"
#include "engine/moe_router.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_q8.h"
#include "kernels/cuda/moe.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "tests/cuda_device_array.h"
#include "tests/cuda_matmul_test_data.h"
#include "tests/kernel_test_data.h"

using tern::GgmlType;
using tern::cuda::ExpertSlots;
using tern::cuda::GluActivation;
using tern::test::DeviceArray;

namespace {

// ---- route_experts ----------------------------------------------------------------------------------

struct RouterCase {
    int n_expert, n_used;
    tern::ExpertGating gating;
    bool norm;
    float scale;
};

// The device's ids for n rows of logits against route_experts on the host; the weights within kWeightUlps.
// The host's weights come from std::exp and the device's from expf: on a GPU those differ by up to 2 ulp, each
// rounding once more through the product with 1 / sum, the normalising division and the scale.
constexpr int64_t kWeightUlps = 8;

void check_router(const RouterCase& rc, const std::vector<float>& logits, const std::vector<float>& bias = {}) {
    const auto n = static_cast<int64_t>(logits.size()) / rc.n_expert;
    tern::ModelConfig c;
    c.n_expert = rc.n_expert;
    c.n_expert_used = rc.n_used;
    c.expert_gating = rc.gating;
    c.expert_weights_norm = rc.norm;
    c.expert_weights_scale = rc.scale;
    tern::cuda::RouterParams p;
    p.n_expert = rc.n_expert;
    p.n_used = rc.n_used;
    p.sigmoid = rc.gating == tern::ExpertGating::sigmoid;
    p.softmax_weight = rc.gating == tern::ExpertGating::softmax_weight;
    p.normalize = rc.norm;
    p.scale = rc.scale;
    const DeviceArray<float> dbias(bias.empty() ? std::vector<float>(1) : bias);
    if (!bias.empty()) p.selection_bias = dbias.get();
    const DeviceArray<float> dl(logits);
    DeviceArray<int32_t> dids(static_cast<size_t>(n * rc.n_used));
    DeviceArray<float> dw(static_cast<size_t>(n * rc.n_used));
    tern::cuda::route_experts(dl.get(), n, p, dids.get(), dw.get(), nullptr);
    const std::vector<int32_t> ids = dids.read();
    const std::vector<float> w = dw.read();
    std::vector<float> probs(static_cast<size_t>(2 * rc.n_expert)), want_w(static_cast<size_t>(rc.n_used));
    std::vector<int32_t> want_ids(static_cast<size_t>(rc.n_used));
    for (int64_t t = 0; t < n; ++t) {
        CAPTURE(t);
        tern::route_experts(logits.data() + t * rc.n_expert, c, probs.data(), want_ids.data(), want_w.data(),
                            bias.empty() ? nullptr : bias.data());
        for (int r = 0; r < rc.n_used; ++r) {
            const size_t i = static_cast<size_t>(t * rc.n_used + r);
            CAPTURE(r);
            REQUIRE(ids[i] == want_ids[static_cast<size_t>(r)]);
            const float want = want_w[static_cast<size_t>(r)];
            if (std::isnan(want)) {
                CHECK(std::isnan(w[i]));
            } else {
                CHECK(tern::test::ulp_distance(w[i], want) <= kWeightUlps);
            }
        }
    }
}

const RouterCase kRouterCases[] = {
    {8, 2, tern::ExpertGating::softmax, true, 1.0f},    {1, 1, tern::ExpertGating::softmax, false, 1.0f},
    {33, 3, tern::ExpertGating::softmax, false, 2.5f},  {128, 8, tern::ExpertGating::softmax, true, 1.0f},
    {256, 8, tern::ExpertGating::sigmoid, true, 2.5f},  {60, 4, tern::ExpertGating::sigmoid, false, 1.0f},
    {1024, 64, tern::ExpertGating::softmax, true, 1.0f}, {40, 40, tern::ExpertGating::sigmoid, false, 1.0f},
    {32, 4, tern::ExpertGating::softmax_weight, false, 1.0f}, {128, 4, tern::ExpertGating::softmax_weight, false, 1.0f},
    {8, 8, tern::ExpertGating::softmax_weight, true, 2.5f},   {1, 1, tern::ExpertGating::softmax_weight, false, 1.0f},
};

TEST_CASE("route_experts picks the CPU router's experts and weights on random logits") {
    uint32_t seed = 10;
    for (const RouterCase& rc : kRouterCases) {
        CAPTURE(rc.n_expert);
        CAPTURE(rc.n_used);
        CAPTURE(static_cast<int>(rc.gating));
        for (const int64_t n : {1, 5, 37}) {
            CAPTURE(n);
            check_router(rc, tern::test::random_normal(static_cast<size_t>(n * rc.n_expert), ++seed, 3.0f));
        }
    }
}

TEST_CASE("route_experts with a selection bias (glm4moe's exp_probs_b) ranks by probability + bias, weighs by the "
          "probability") {
    uint32_t seed = 300;
    for (const RouterCase& rc : kRouterCases) {
        CAPTURE(rc.n_expert);
        CAPTURE(rc.n_used);
        CAPTURE(static_cast<int>(rc.gating));
        // A bias of the probabilities' scale: it moves experts in and out of the top k.
        const std::vector<float> bias = tern::test::random_normal(static_cast<size_t>(rc.n_expert), ++seed, 0.3f);
        for (const int64_t n : {1, 5, 37}) {
            CAPTURE(n);
            check_router(rc, tern::test::random_normal(static_cast<size_t>(n * rc.n_expert), ++seed, 3.0f), bias);
        }
    }
}

TEST_CASE("route_experts breaks ties to the lower id and ranks NaN and infinite logits as the CPU router does") {
    std::mt19937 rng(77);
    std::uniform_int_distribution<int> level(0, 3);
    for (const RouterCase& rc : kRouterCases) {
        CAPTURE(rc.n_expert);
        CAPTURE(rc.n_used);
        CAPTURE(static_cast<int>(rc.gating));
        // Few distinct values: every row is full of ties.
        std::vector<float> logits(static_cast<size_t>(12 * rc.n_expert));
        for (float& v : logits) v = static_cast<float>(level(rng)) * 0.5f;
        // Row 1: a NaN; row 2: +inf; row 3: every logit -inf; row 4: a NaN and an -inf; row 5: all NaN.
        auto row = [&](int t) { return logits.data() + t * rc.n_expert; };
        row(1)[rc.n_expert / 2] = NAN;
        row(2)[rc.n_expert - 1] = INFINITY;
        for (int e = 0; e < rc.n_expert; ++e) row(3)[e] = -INFINITY;
        row(4)[0] = -INFINITY;
        row(4)[rc.n_expert - 1] = NAN;
        for (int e = 0; e < rc.n_expert; ++e) row(5)[e] = NAN;
        check_router(rc, logits);
    }
}

TEST_CASE("route_experts refuses expert counts it does not take") {
    DeviceArray<float> l(8), w(8);
    DeviceArray<int32_t> ids(8);
    tern::cuda::RouterParams p;
    p.n_expert = 4;
    p.n_used = 5;
    CHECK_THROWS_AS(tern::cuda::route_experts(l.get(), 1, p, ids.get(), w.get(), nullptr), std::invalid_argument);
    p.n_expert = tern::cuda::kMaxRouterExperts + 1;
    p.n_used = 1;
    CHECK_THROWS_AS(tern::cuda::route_experts(l.get(), 1, p, ids.get(), w.get(), nullptr), std::invalid_argument);
}

// ---- the expert matmuls -----------------------------------------------------------------------------

size_t bit_mismatches(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    size_t m = 0;
    for (size_t i = 0; i < got.size(); ++i) m += tern::f32_bits(got[i]) != tern::f32_bits(want[i]);
    return m;
}

// The double product of the reference dequantization: column col of x times matrix `expert` of the stack w
// (n_expert * n_out rows of n_in, dequantized), for every row; the worst |y - ref| / sum |w x| of the slot.
double slot_error(const float* y, const std::vector<float>& w, const float* x, int64_t expert, int64_t n_in,
                  int64_t n_out) {
    double worst = 0.0;
    for (int64_t r = 0; r < n_out; ++r) {
        double ref = 0.0, mag = 0.0;
        const float* wr = w.data() + (expert * n_out + r) * n_in;
        for (int64_t i = 0; i < n_in; ++i) {
            const double p = static_cast<double>(wr[i]) * static_cast<double>(x[i]);
            ref += p;
            mag += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(y[r] - ref) / (mag > 0.0 ? mag : 1.0));
    }
    return worst;
}

// As test_cuda_matmul.cpp's tolerance: the dequantized weights are exact, only the f32 sums differ.
constexpr double kF32Tolerance = 1e-5;

struct ExpertShape {
    int64_t n_in, n_out, n_expert, n_cols, slots_per_column;
};

// matmul_experts (and _glu) against matmul (and matmul_glu) of each slot's expert and column, bit for bit, and
// against the double product; with q8, matmul_q8_experts against matmul_q8 the same way.
void check_experts(GgmlType type, const ExpertShape& s, bool q8, uint32_t seed) {
    const int64_t n_slots = s.n_cols * s.slots_per_column;
    const std::vector<uint8_t> gate_bytes = tern::test::quantized_normal(type, s.n_expert * s.n_out, s.n_in, seed);
    const std::vector<uint8_t> up_bytes = tern::test::quantized_normal(type, s.n_expert * s.n_out, s.n_in, seed + 1);
    const std::vector<float> gate = tern::test::dequantize(type, gate_bytes, s.n_expert * s.n_out, s.n_in);
    const std::vector<float> x = tern::test::random_normal(static_cast<size_t>(s.n_cols * s.n_in), seed + 2);
    std::mt19937 rng(seed + 3);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(s.n_expert - 1));
    std::vector<int32_t> ids(static_cast<size_t>(n_slots));
    for (int32_t& e : ids) e = pick(rng);
    ids.back() = static_cast<int32_t>(s.n_expert - 1);   // the stack's last matrix always runs
    const DeviceArray<uint8_t> dgate(gate_bytes), dup(up_bytes);
    const DeviceArray<float> dx(x);
    const DeviceArray<int32_t> dids(ids);
    DeviceArray<uint8_t> xq(std::max<size_t>(tern::cuda::quantized_activation_bytes(s.n_cols, s.n_in), 1));
    if (q8) tern::cuda::quantize_activations(dx.get(), s.n_cols, s.n_in, xq.get(), nullptr);
    const ExpertSlots slots{dids.get(), n_slots, s.slots_per_column};
    const size_t rb = tern::row_bytes(type, s.n_in);
    for (const bool glu : {false, true}) {
        CAPTURE(glu);
        const std::vector<float> y = tern::test::guarded_output(n_slots * s.n_out, [&](float* dy) {
            if (q8 && glu)
                tern::cuda::matmul_q8_experts_glu(type, s.n_in, s.n_out, dgate.get(), dup.get(), GluActivation::silu,
                                                  slots, xq.get(), dy, nullptr);
            else if (q8)
                tern::cuda::matmul_q8_experts(type, dgate.get(), s.n_in, s.n_out, slots, xq.get(), dy, nullptr);
            else if (glu)
                tern::cuda::matmul_experts_glu(type, s.n_in, s.n_out, dgate.get(), dup.get(), GluActivation::silu,
                                               slots, dx.get(), dy, nullptr);
            else
                tern::cuda::matmul_experts(type, dgate.get(), s.n_in, s.n_out, slots, dx.get(), dy, nullptr);
        });
        // Each slot alone through the plain launchers.
        std::vector<float> want;
        for (int64_t slot = 0; slot < n_slots; ++slot) {
            const int64_t col = slot / s.slots_per_column;
            const size_t off = static_cast<size_t>(ids[static_cast<size_t>(slot)]) * static_cast<size_t>(s.n_out) * rb;
            const uint8_t* wg = dgate.get() + off;
            const uint8_t* wu = dup.get() + off;
            // The column alone in a buffer of its own: a ragged row's columns are not 16-byte aligned in x.
            const DeviceArray<float> x_col(std::vector<float>(x.begin() + col * s.n_in, x.begin() + (col + 1) * s.n_in));
            const std::vector<float> one = tern::test::guarded_output(s.n_out, [&](float* dy) {
                const uint8_t* xqc = xq.get() + col * tern::cuda::q8_column_bytes(s.n_in);
                const float* xc = x_col.get();
                if (q8 && glu)
                    tern::cuda::matmul_q8_glu(type, s.n_in, s.n_out, wg, nullptr, wu, nullptr, GluActivation::silu,
                                              xqc, 1, dy, nullptr);
                else if (q8)
                    tern::cuda::matmul_q8(type, wg, s.n_in, s.n_out, xqc, 1, nullptr, dy, nullptr);
                else if (glu)
                    tern::cuda::matmul_glu(type, s.n_in, s.n_out, wg, nullptr, wu, nullptr, GluActivation::silu, xc, 1,
                                           dy, nullptr);
                else
                    tern::cuda::matmul(type, wg, s.n_in, s.n_out, xc, 1, nullptr, dy, nullptr);
            });
            want.insert(want.end(), one.begin(), one.end());
            if (!q8 && !glu) {
                CAPTURE(slot);
                CHECK(slot_error(y.data() + slot * s.n_out, gate, x.data() + col * s.n_in,
                                 ids[static_cast<size_t>(slot)], s.n_in, s.n_out) <= kF32Tolerance);
            }
        }
        CHECK(bit_mismatches(y, want) == 0);
    }
}

TEST_CASE("matmul_experts and matmul_experts_glu run each slot's expert, bit for bit its own matmul") {
    uint32_t seed = 500;
    for (const GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K,
                                GgmlType::Q6_K, GgmlType::IQ4_XS}) {
        CAPTURE(tern::type_name(type));
        const int64_t block = tern::block_elems(type);
        // n_out multiples of 8 keep every expert's bytes a multiple of 16 (the launchers' alignment rule).
        std::vector<ExpertShape> shapes = {{block, 8, 3, 1, 1}, {4 * block, 40, 5, 2, 3}, {2 * block, 16, 8, 3, 1}};
        if (tern::test::is_plain(type)) shapes.push_back({37, 8, 4, 2, 2});   // a ragged row: the element path
        for (const ExpertShape& s : shapes) {
            CAPTURE(s.n_in);
            CAPTURE(s.n_out);
            CAPTURE(s.slots_per_column);
            check_experts(type, s, false, seed += 10);
        }
    }
}

TEST_CASE("matmul_q8_experts and matmul_q8_experts_glu run each slot's expert, bit for bit its own matmul_q8") {
    uint32_t seed = 700;
    for (const GgmlType type : {GgmlType::Q4_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q3_K, GgmlType::Q4_K,
                                GgmlType::Q6_K}) {
        CAPTURE(tern::type_name(type));
        const int64_t block = std::max<int64_t>(tern::block_elems(type), 32);
        for (const ExpertShape& s : {ExpertShape{block, 8, 3, 1, 1}, ExpertShape{4 * block, 40, 5, 2, 3},
                                     ExpertShape{2 * block, 16, 8, 3, 1}}) {
            CAPTURE(s.n_in);
            CAPTURE(s.n_out);
            CAPTURE(s.slots_per_column);
            check_experts(type, s, true, seed += 10);
        }
    }
}

TEST_CASE("the expert matmuls refuse bad slot counts and missing ids") {
    const DeviceArray<uint8_t> w(std::vector<uint8_t>(4096, 0));
    DeviceArray<float> x(64), y(64);
    const DeviceArray<int32_t> ids(std::vector<int32_t>{0, 0});
    CHECK_THROWS_AS(tern::cuda::matmul_experts(GgmlType::F32, w.get(), 32, 2, ExpertSlots{nullptr, 1, 1}, x.get(),
                                               y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(tern::cuda::matmul_experts(GgmlType::F32, w.get(), 32, 2, ExpertSlots{ids.get(), 70000, 1},
                                               x.get(), y.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(tern::cuda::matmul_experts(GgmlType::F32, w.get(), 32, 2, ExpertSlots{ids.get(), 2, 0}, x.get(),
                                               y.get(), nullptr),
                    std::invalid_argument);
    // An expert of 3 rows of 3 f32 is 36 bytes: the second would not start 16-byte aligned.
    CHECK_THROWS_AS(tern::cuda::matmul_experts(GgmlType::F32, w.get(), 3, 3, ExpertSlots{ids.get(), 2, 1}, x.get(),
                                               y.get(), nullptr),
                    std::invalid_argument);
}

// ---- moe_combine and copy_rows ----------------------------------------------------------------------

TEST_CASE("moe_combine sums a token's expert rows in rank order, bit for bit the CPU backend's loop") {
    uint32_t seed = 900;
    for (const int64_t n : {1, 3, 17})
        for (const int64_t k : {1, 2, 8})
            for (const int64_t dim : {1, 255, 256, 300}) {
                CAPTURE(n);
                CAPTURE(k);
                CAPTURE(dim);
                const std::vector<float> y = tern::test::random_normal(static_cast<size_t>(n * k * dim), ++seed);
                const std::vector<float> w = tern::test::random_normal(static_cast<size_t>(n * k), ++seed);
                std::vector<float> want(static_cast<size_t>(n * dim));
                for (int64_t t = 0; t < n; ++t)   // engine/cpu/backend_cpu_moe.cpp's sum
                    for (int64_t d = 0; d < dim; ++d) {
                        float o = w[static_cast<size_t>(t * k)] * y[static_cast<size_t>(t * k * dim + d)];
                        for (int64_t r = 1; r < k; ++r)
                            o += w[static_cast<size_t>(t * k + r)] * y[static_cast<size_t>((t * k + r) * dim + d)];
                        want[static_cast<size_t>(t * dim + d)] = o;
                    }
                const DeviceArray<float> dy(y), dw(w);
                const std::vector<float> got = tern::test::guarded_output(n * dim, [&](float* out) {
                    tern::cuda::moe_combine(dy.get(), dw.get(), n, k, dim, out, nullptr);
                });
                CHECK(bit_mismatches(got, want) == 0);
            }
}

TEST_CASE("add_expert_bias adds each slot's expert's bias row, bit for bit the host's addition") {
    uint32_t seed = 950;
    for (const int64_t n_slots : {1, 5, 24})
        for (const int64_t width : {1, 255, 256, 300}) {
            CAPTURE(n_slots);
            CAPTURE(width);
            const int64_t n_expert = 6;
            const std::vector<float> y = tern::test::random_normal(static_cast<size_t>(n_slots * width), ++seed);
            const std::vector<float> bias = tern::test::random_normal(static_cast<size_t>(n_expert * width), ++seed);
            std::vector<int32_t> ids(static_cast<size_t>(n_slots));
            for (size_t s = 0; s < ids.size(); ++s) ids[s] = static_cast<int32_t>((s * 7 + 3) % n_expert);
            std::vector<float> want = y;
            for (int64_t s = 0; s < n_slots; ++s)
                for (int64_t d = 0; d < width; ++d)
                    want[static_cast<size_t>(s * width + d)] +=
                        bias[static_cast<size_t>(ids[static_cast<size_t>(s)] * width + d)];
            DeviceArray<float> dy(y);
            const DeviceArray<float> db(bias);
            const DeviceArray<int32_t> dids(ids);
            tern::cuda::add_expert_bias(dy.get(), dids.get(), db.get(), n_slots, width, nullptr);
            CHECK(bit_mismatches(dy.read(), want) == 0);
        }
}

TEST_CASE("copy_rows gathers and scatters rows by index") {
    for (const int64_t width : {1, 7, 256, 300}) {
        CAPTURE(width);
        const int64_t n_src = 9;
        const std::vector<float> src = tern::test::random_normal(static_cast<size_t>(n_src * width), 31);
        const std::vector<int32_t> gather = {4, 0, 4, 8, 2};
        const std::vector<int32_t> scatter = {3, 0, 1, 4, 2};
        const DeviceArray<float> dsrc(src);
        const DeviceArray<int32_t> dgather(gather), dscatter(scatter);
        // dst[i] = src[gather[i]]
        const std::vector<float> gathered = tern::test::guarded_output(5 * width, [&](float* dst) {
            tern::cuda::copy_rows(dsrc.get(), dgather.get(), dst, nullptr, 5, width, nullptr);
        });
        // dst[scatter[i]] = src[i]; and both: dst[scatter[i]] = src[gather[i]]
        const std::vector<float> scattered = tern::test::guarded_output(5 * width, [&](float* dst) {
            tern::cuda::copy_rows(dsrc.get(), nullptr, dst, dscatter.get(), 5, width, nullptr);
        });
        const std::vector<float> both = tern::test::guarded_output(5 * width, [&](float* dst) {
            tern::cuda::copy_rows(dsrc.get(), dgather.get(), dst, dscatter.get(), 5, width, nullptr);
        });
        for (size_t i = 0; i < 5; ++i)
            for (int64_t d = 0; d < width; ++d) {
                const auto at = [&](size_t row) { return static_cast<size_t>(static_cast<int64_t>(row) * width + d); };
                CHECK(gathered[at(i)] == src[at(static_cast<size_t>(gather[i]))]);
                CHECK(scattered[at(static_cast<size_t>(scatter[i]))] == src[at(i)]);
                CHECK(both[at(static_cast<size_t>(scatter[i]))] == src[at(static_cast<size_t>(gather[i]))]);
            }
    }
}

} // namespace
