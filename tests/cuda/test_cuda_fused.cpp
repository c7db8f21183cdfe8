// The fused decode kernels against the launches they replace, bit for bit on random data:
//   matmul_outputs / matmul_q8_outputs (up to three matrices of one input in one launch, storing or adding
//     into y) against one matmul / matmul_q8 per matrix, followed by add_residual (no norm) when adding;
//   matmul_glu / matmul_q8_glu against matmul / matmul_q8 of the gate and of the up matrix followed by
//     swiglu / geglu_tanh;
//   matmul_q8_glu_q8 (the GLU writing its output's q8 units too) against matmul_q8_glu followed by
//     quantize_activations: y and every byte of the units, twice on the same group counters;
//   qk_norm_rope_kv_write against qk_norm_rope followed by kv_write: q and k as left in place, and every
//     byte of the K and V caches (the rows written and the ones that must stay untouched).
// Every weight format each matmul reads (the plain float formats also at row lengths that are not
// multiples of 8: the element-wise kernel), ragged n_out, 1 to 8 columns and more than one pass of 8, with
// and without biases; every KV format, head dims of both kinds, GQA, several tokens, pos0 given by value
// and read from device memory (a replayed CUDA graph).
//
// Exactness is the contract (the fused kernels share the unfused ones' accumulation and activation code),
// so any difference, one bit of one output, fails.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_q8.h"
#include "kernels/cuda/rope.h"
#include "quant/half.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/cuda_device_array.h"
#include "tests/cuda_matmul_test_data.h"
#include "tests/kernel_test_data.h"

using tern::GgmlType;
using tern::KvType;
using tern::cuda::GluActivation;
using tern::cuda::MatmulOutput;
using tern::test::DeviceArray;
using tern::test::is_plain;
using tern::test::kMatmulFormats;
using tern::test::kMatmulQ8Formats;

namespace {

constexpr KvType kKvFormats[] = {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3};

// 1 .. 8 columns (one pass of each width), and 9 and 15: a full pass of 8 then a narrower one.
constexpr int64_t kColumns[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 15};
constexpr float kEps = 1e-6f;

// Row lengths per format: one or two blocks and several (lanes left without a last slice); the plain formats
// also a length that is not a multiple of 8.
std::vector<int64_t> row_lengths(GgmlType type, bool q8) {
    if (tern::block_elems(type) == 256) return {256, 768};
    if (is_plain(type)) return {37, 264};
    return q8 ? std::vector<int64_t>{32, 544} : std::vector<int64_t>{32, 288};
}

// Mismatching floats, compared as bits (NaN sentinels left in place count too).
size_t bit_mismatches(const std::vector<float>& got, const std::vector<float>& want) {
    REQUIRE(got.size() == want.size());
    size_t m = 0;
    for (size_t i = 0; i < got.size(); ++i) m += tern::f32_bits(got[i]) != tern::f32_bits(want[i]);
    return m;
}

// The input of one matmul family: f32 columns, or their int8 form (quantize_activations).
struct Input {
    bool q8 = false;
    const float* x = nullptr;
    const void* x_q = nullptr;
};

void plain_matmul(const Input& in, GgmlType type, int64_t n_in, const MatmulOutput& o, int64_t n_cols) {
    if (in.q8)
        tern::cuda::matmul_q8(type, o.w, n_in, o.n_out, in.x_q, n_cols, o.bias, o.y, nullptr);
    else
        tern::cuda::matmul(type, o.w, n_in, o.n_out, in.x, n_cols, o.bias, o.y, nullptr);
}

// One matrix of a test: its weights, bias and an output buffer (n_cols * n_out floats and a guard past it).
struct Matrix {
    int64_t n_out;
    DeviceArray<uint8_t> w;
    DeviceArray<float> bias;
    bool with_bias;
    Matrix(GgmlType type, int64_t n_in, int64_t rows, bool b, uint32_t seed)
        : n_out(rows), w(tern::test::quantized_normal(type, rows, n_in, seed)),
          bias(tern::test::random_normal(static_cast<size_t>(rows), seed + 1)), with_bias(b) {}
    MatmulOutput output(float* y) const { return {w.get(), n_out, with_bias ? bias.get() : nullptr, y}; }
};

constexpr size_t kGuard = 8;

// y buffers of n_cols * n_out floats plus a guard: NaN (every output must be written) or random values
// (the residual stream an accumulating launch adds to), the guard a fixed value no launch may touch.
std::vector<float> initial_y(size_t n, bool residual, uint32_t seed) {
    std::vector<float> y = residual ? tern::test::random_normal(n + kGuard, seed) : std::vector<float>(n + kGuard, NAN);
    for (size_t i = n; i < n + kGuard; ++i) y[i] = 1234.5f;
    return y;
}

// matmul_outputs / matmul_q8_outputs of the matrices against one plain matmul each (+ add_residual).
void check_outputs(const Input& in, GgmlType type, int64_t n_in, const std::vector<const Matrix*>& ms, int64_t n_cols,
                   bool accumulate, uint32_t seed) {
    std::vector<DeviceArray<float>*> fused, separate;
    std::vector<std::unique_ptr<DeviceArray<float>>> owned;
    std::vector<MatmulOutput> outputs;
    for (size_t i = 0; i < ms.size(); ++i) {
        const size_t n = static_cast<size_t>(n_cols * ms[i]->n_out);
        const std::vector<float> init = initial_y(n, accumulate, seed + static_cast<uint32_t>(i));
        owned.push_back(std::make_unique<DeviceArray<float>>(init));
        fused.push_back(owned.back().get());
        owned.push_back(std::make_unique<DeviceArray<float>>(init));
        separate.push_back(owned.back().get());
        outputs.push_back(ms[i]->output(fused.back()->get()));
    }
    if (in.q8)
        tern::cuda::matmul_q8_outputs(type, n_in, outputs.data(), static_cast<int>(outputs.size()), in.x_q, n_cols,
                                      accumulate, nullptr);
    else
        tern::cuda::matmul_outputs(type, n_in, outputs.data(), static_cast<int>(outputs.size()), in.x, n_cols,
                                   accumulate, nullptr);
    for (size_t i = 0; i < ms.size(); ++i) {
        CAPTURE(i);
        const int64_t n_out = ms[i]->n_out;
        if (accumulate) {
            DeviceArray<float> product(static_cast<size_t>(n_cols * n_out));
            plain_matmul(in, type, n_in, ms[i]->output(product.get()), n_cols);
            tern::cuda::add_residual(separate[i]->get(), product.get(), nullptr, n_cols, n_out, kEps, nullptr);
        } else {
            plain_matmul(in, type, n_in, ms[i]->output(separate[i]->get()), n_cols);
        }
        const std::vector<float> got = fused[i]->read(), want = separate[i]->read();
        CHECK(bit_mismatches(got, want) == 0);
        for (size_t g = got.size() - kGuard; g < got.size(); ++g) REQUIRE(got[g] == 1234.5f);
        if (!accumulate) CHECK(std::none_of(got.begin(), got.end() - kGuard, [](float v) { return std::isnan(v); }));
    }
}

// matmul_glu / matmul_q8_glu against two plain matmuls and the elementwise activation.
void check_glu(const Input& in, GgmlType type, int64_t n_in, const Matrix& gate, const Matrix& up, int64_t n_cols,
               GluActivation act, uint32_t seed) {
    const int64_t n_out = gate.n_out;
    const size_t n = static_cast<size_t>(n_cols * n_out);
    DeviceArray<float> fused(initial_y(n, false, seed));
    const float* b_gate = gate.with_bias ? gate.bias.get() : nullptr;
    const float* b_up = up.with_bias ? up.bias.get() : nullptr;
    if (in.q8)
        tern::cuda::matmul_q8_glu(type, n_in, n_out, gate.w.get(), b_gate, up.w.get(), b_up, act, in.x_q, n_cols,
                                  fused.get(), nullptr);
    else
        tern::cuda::matmul_glu(type, n_in, n_out, gate.w.get(), b_gate, up.w.get(), b_up, act, in.x, n_cols,
                               fused.get(), nullptr);
    DeviceArray<float> g(initial_y(n, false, seed)), u(n);
    plain_matmul(in, type, n_in, gate.output(g.get()), n_cols);
    plain_matmul(in, type, n_in, up.output(u.get()), n_cols);
    if (act == GluActivation::silu)
        tern::cuda::swiglu(g.get(), u.get(), g.get(), static_cast<int64_t>(n), nullptr);
    else if (act == GluActivation::gelu_tanh)
        tern::cuda::geglu_tanh(g.get(), u.get(), g.get(), static_cast<int64_t>(n), nullptr);
    else
        tern::cuda::swiglu_oai(g.get(), u.get(), g.get(), static_cast<int64_t>(n), nullptr);
    const std::vector<float> got = fused.read(), want = g.read();
    CHECK(bit_mismatches(got, want) == 0);
    for (size_t i = n; i < n + kGuard; ++i) REQUIRE(got[i] == 1234.5f);
}

// Every format and row length of one matmul family, each column count with a rotating set of matrices:
// three of ragged sizes (q / k / v-like, biases on some), one, two; storing and adding alternately; and
// the GLU pair with both activations.
void check_family(bool q8) {
    uint32_t seed = q8 ? 7000 : 1000;
    for (GgmlType type : q8 ? std::vector<GgmlType>(std::begin(kMatmulQ8Formats), std::end(kMatmulQ8Formats))
                            : std::vector<GgmlType>(std::begin(kMatmulFormats), std::end(kMatmulFormats))) {
        CAPTURE(tern::type_name(type));
        for (int64_t n_in : row_lengths(type, q8)) {
            CAPTURE(n_in);
            seed += 100;
            const Matrix q(type, n_in, 37, true, seed), k(type, n_in, 9, false, seed + 2), v(type, n_in, 13, true, seed + 4);
            const Matrix one(type, n_in, 1, true, seed + 6), wide(type, n_in, 130, false, seed + 8);
            const Matrix gate(type, n_in, 35, true, seed + 10), up(type, n_in, 35, true, seed + 12);
            const Matrix gate_nb(type, n_in, 35, false, seed + 14), up_nb(type, n_in, 35, false, seed + 16);
            const std::vector<std::vector<const Matrix*>> sets = {{&q, &k, &v}, {&one}, {&wide, &k}, {&v, &one, &wide}};
            const std::vector<float> x = tern::test::random_normal(static_cast<size_t>(15 * n_in), seed + 20);
            const DeviceArray<float> dx(x);
            std::unique_ptr<DeviceArray<uint8_t>> dq;
            Input in{q8, dx.get(), nullptr};
            if (q8) {
                dq = std::make_unique<DeviceArray<uint8_t>>(tern::cuda::quantized_activation_bytes(15, n_in));
                tern::cuda::quantize_activations(dx.get(), 15, n_in, dq->get(), nullptr);
                in.x_q = dq->get();
            }
            for (size_t ic = 0; ic < std::size(kColumns); ++ic) {
                const int64_t n_cols = kColumns[ic];
                CAPTURE(n_cols);
                const bool accumulate = (ic + ic / 4) % 2 == 1;   // every set both ways
                CAPTURE(accumulate);
                check_outputs(in, type, n_in, sets[ic % sets.size()], n_cols, accumulate, seed + 30);
                // The three activations rotate against the bias-less pairs (ic % 3 == 2): each meets both.
                constexpr GluActivation kActs[] = {GluActivation::silu, GluActivation::gelu_tanh,
                                                   GluActivation::swiglu_oai};
                const GluActivation act = kActs[(ic + ic / 3) % 3];
                CAPTURE(static_cast<int>(act));
                if (ic % 3 == 2)
                    check_glu(in, type, n_in, gate_nb, up_nb, n_cols, act, seed + 40);
                else
                    check_glu(in, type, n_in, gate, up, n_cols, act, seed + 40);
            }
        }
    }
}

// ---- rope + KV write -----------------------------------------------------------------------------------

struct RopeCase {
    const char* what;
    int32_t head_dim, head_dim_v, n_rot, n_heads, n_kv_heads;
    int64_t n;
    int32_t pos0;
    bool neox, norm, factors;
};

// Caches of n_ctx positions, every byte 0xA5 first (rows the launch must not touch keep it).
struct Cache {
    tern::cuda::KvLayer layer;
    size_t k_bytes, v_bytes;
    DeviceArray<uint8_t> k, v;
    Cache(KvType type, const RopeCase& c, int32_t n_ctx)
        : k_bytes(tern::kv_row_bytes(type, c.head_dim) * static_cast<size_t>(c.n_kv_heads * n_ctx)),
          v_bytes(tern::kv_row_bytes(type, c.head_dim_v) * static_cast<size_t>(c.n_kv_heads * n_ctx)),
          k(std::vector<uint8_t>(k_bytes, 0xA5)), v(std::vector<uint8_t>(v_bytes, 0xA5)) {
        layer.type = type;
        layer.k = k.get();
        layer.v = v.get();
        layer.n_kv_heads = c.n_kv_heads;
        layer.head_dim = c.head_dim;
        layer.head_dim_v = c.head_dim_v;
        layer.n_ctx = n_ctx;
    }
};

void check_rope_kv(KvType type, const RopeCase& c, bool device_pos, uint32_t seed) {
    const int32_t n_ctx = c.pos0 + static_cast<int32_t>(c.n) + 3;
    std::vector<float> q0 = tern::test::random_normal(static_cast<size_t>(c.n * c.n_heads * c.head_dim), seed, 3.0f);
    std::vector<float> k0 = tern::test::random_normal(static_cast<size_t>(c.n * c.n_kv_heads * c.head_dim), seed + 1);
    std::vector<float> v0 =
        tern::test::random_normal(static_cast<size_t>(c.n * c.n_kv_heads * c.head_dim_v), seed + 2, 0.5f);
    v0[0] = 0.0f;   // a zero and a large value among the v elements, for the block encoders
    if (v0.size() > 3) v0[3] = 300.0f;
    std::vector<float> norm_q = tern::test::random_normal(static_cast<size_t>(c.head_dim), seed + 3, 0.3f);
    std::vector<float> norm_k = tern::test::random_normal(static_cast<size_t>(c.head_dim), seed + 4, 0.3f);
    for (float& w : norm_q) w += 1.0f;
    for (float& w : norm_k) w += 1.0f;
    std::vector<float> factors(static_cast<size_t>(std::max(c.n_rot / 2, 1)));
    for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + 0.5f * static_cast<float>(i % 7);
    const DeviceArray<float> dnq(norm_q), dnk(norm_k), dfactors(factors), dv(v0);
    const DeviceArray<int32_t> dpos(std::vector<int32_t>{c.pos0});
    tern::cuda::RopeParams rope;
    rope.neox = c.neox;
    rope.n_rot = c.n_rot;
    rope.base = 10000.0f;
    rope.freq_scale = 0.5f;
    rope.freq_factors = c.factors ? dfactors.get() : nullptr;
    const float* qn = c.norm ? dnq.get() : nullptr;
    const float* kn = c.norm ? dnk.get() : nullptr;
    const int32_t* pos_device = device_pos ? dpos.get() : nullptr;
    // With pos0 read from the device, the value passed is the one a captured graph was recorded with: a
    // different position, to show the kernel reads the device's.
    const int32_t pos_arg = device_pos ? 0 : c.pos0;

    DeviceArray<float> fq(q0), fk(k0), sq(q0), sk(k0);
    Cache fused(type, c, n_ctx), separate(type, c, n_ctx);
    tern::cuda::qk_norm_rope_kv_write(fused.layer, fq.get(), fk.get(), dv.get(), c.n, c.n_heads, qn, kn, kEps, rope,
                                      pos_arg, nullptr, pos_device);
    tern::cuda::qk_norm_rope(sq.get(), sk.get(), c.n, c.n_heads, c.n_kv_heads, c.head_dim, qn, kn, kEps, rope,
                             pos_arg, nullptr, pos_device);
    tern::cuda::kv_write(separate.layer, sk.get(), dv.get(), c.n, pos_arg, nullptr, pos_device);
    CHECK(bit_mismatches(fq.read(), sq.read()) == 0);
    CHECK(bit_mismatches(fk.read(), sk.read()) == 0);
    CHECK(fused.k.read() == separate.k.read());
    CHECK(fused.v.read() == separate.v.read());
    // The rows were written at all: position pos0 of KV head 0 is no longer the fill.
    const std::vector<uint8_t> kc = fused.k.read();
    const size_t row = tern::kv_row_bytes(type, c.head_dim);
    const auto first = kc.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(c.pos0) * row);
    CHECK(std::any_of(first, first + static_cast<ptrdiff_t>(row), [](uint8_t b) { return b != 0xA5; }));
}

// matmul_q8_glu_q8 against matmul_q8_glu then quantize_activations of its output, launched twice on one set of
// counters (the first launch must leave them zero), which are all zero after.
void check_glu_q8(GgmlType type, int64_t n_in, const Matrix& gate, const Matrix& up, const void* x_q, int64_t n_cols,
                  GluActivation act, uint32_t seed) {
    const int64_t n_out = gate.n_out;
    const size_t n = static_cast<size_t>(n_cols * n_out);
    const size_t q_bytes = tern::cuda::quantized_activation_bytes(n_cols, n_out);
    const float* b_gate = gate.with_bias ? gate.bias.get() : nullptr;
    const float* b_up = up.with_bias ? up.bias.get() : nullptr;
    DeviceArray<float> y(initial_y(n, false, seed)), want_y(initial_y(n, false, seed));
    DeviceArray<uint8_t> y_q(std::vector<uint8_t>(q_bytes + kGuard, 0xA5)), want_q(q_bytes);
    DeviceArray<unsigned> done(std::vector<unsigned>(tern::cuda::matmul_q8_glu_q8_counters(n_cols, n_out), 0u));
    tern::cuda::matmul_q8_glu(type, n_in, n_out, gate.w.get(), b_gate, up.w.get(), b_up, act, x_q, n_cols,
                              want_y.get(), nullptr);
    tern::cuda::quantize_activations(want_y.get(), n_cols, n_out, want_q.get(), nullptr);
    const std::vector<uint8_t> want_units = want_q.read();
    for (int round = 0; round < 2; ++round) {
        CAPTURE(round);
        tern::cuda::matmul_q8_glu_q8(type, n_in, n_out, gate.w.get(), b_gate, up.w.get(), b_up, act, x_q, n_cols,
                                     y.get(), y_q.get(), done.get(), nullptr);
        CHECK(bit_mismatches(y.read(), want_y.read()) == 0);
        const std::vector<uint8_t> units = y_q.read();
        CHECK(std::equal(want_units.begin(), want_units.end(), units.begin()));
        CHECK(std::all_of(units.end() - kGuard, units.end(), [](uint8_t b) { return b == 0xA5; }));
        const std::vector<unsigned> counts = done.read();
        CHECK(std::all_of(counts.begin(), counts.end(), [](unsigned c) { return c == 0; }));
    }
}

} // namespace

TEST_CASE("matmul_q8_glu_q8 gives the bits of matmul_q8_glu then quantize_activations of its output") {
    uint32_t seed = 9000;
    for (GgmlType type : kMatmulQ8Formats) {
        CAPTURE(tern::type_name(type));
        const int64_t n_in = row_lengths(type, true).front();
        CAPTURE(n_in);
        const std::vector<float> x = tern::test::random_normal(static_cast<size_t>(15 * n_in), seed += 100);
        const DeviceArray<float> dx(x);
        DeviceArray<uint8_t> dq(tern::cuda::quantized_activation_bytes(15, n_in));
        tern::cuda::quantize_activations(dx.get(), 15, n_in, dq.get(), nullptr);
        // One group (8 blocks of 4 rows), three groups; 1 .. 8 columns, and passes of 8 then of 1 and of 7.
        for (int64_t n_out : {32, 96}) {
            CAPTURE(n_out);
            const Matrix gate(type, n_in, n_out, n_out == 32, seed + 10), up(type, n_in, n_out, true, seed + 12);
            for (int64_t n_cols : {1, 2, 5, 8, 9, 15}) {
                CAPTURE(n_cols);
                const GluActivation act = n_cols % 2 == 1 ? GluActivation::silu : GluActivation::gelu_tanh;
                check_glu_q8(type, n_in, gate, up, dq.get(), n_cols, act, seed + 20);
            }
        }
    }
    // Refusals: a ragged n_out (no whole groups), a misaligned q8 output, no counters.
    const DeviceArray<uint8_t> w(8192), q(8192);
    DeviceArray<float> y(1024);
    DeviceArray<unsigned> done(64);
    using tern::cuda::matmul_q8_glu_q8;
    CHECK_THROWS_AS(matmul_q8_glu_q8(GgmlType::Q4_0, 32, 35, w.get(), nullptr, w.get(), nullptr, GluActivation::silu,
                                     q.get(), 1, y.get(), q.get(), done.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8_glu_q8(GgmlType::Q4_0, 32, 32, w.get(), nullptr, w.get(), nullptr, GluActivation::silu,
                                     q.get(), 1, y.get(), q.get() + 4, done.get(), nullptr),
                    std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8_glu_q8(GgmlType::Q4_0, 32, 32, w.get(), nullptr, w.get(), nullptr, GluActivation::silu,
                                     q.get(), 1, y.get(), q.get(), nullptr, nullptr),
                    std::invalid_argument);
    CHECK_FALSE(tern::cuda::matmul_q8_glu_q8_takes(35, y.get(), q.get()));
    CHECK(tern::cuda::matmul_q8_glu_q8_takes(64, y.get(), q.get()));
    CHECK(tern::cuda::matmul_q8_glu_q8_counters(9, 64) == 4);
}

TEST_CASE("matmul_outputs and matmul_glu give the bits of matmul and the separate epilogue kernels") {
    check_family(false);
}

TEST_CASE("matmul_q8_outputs and matmul_q8_glu give the bits of matmul_q8 and the separate epilogue kernels") {
    check_family(true);
}

TEST_CASE("qk_norm_rope_kv_write gives the bits of qk_norm_rope then kv_write, every KV format") {
    const RopeCase block_cases[] = {
        // what                          hd   hd_v rot  heads kv  n  pos0  neox   norm   factors
        {"gemma3 decode: 256, neox, norm", 256, 256, 256, 4, 1, 1, 1234, true, true, false},
        {"llama: 128, normal, factors",    128, 128, 128, 8, 2, 3, 30, false, false, true},
        {"qwen3 verify: 8 tokens, GQA",    64, 64, 64, 6, 2, 8, 5, true, true, false},
        {"partial rotation, v narrower",   96, 32, 32, 3, 3, 2, 0, false, true, true},
        {"no rotation (n_rot 0)",          32, 64, 0, 2, 1, 5, 9, true, true, false},
    };
    const RopeCase float_cases[] = {
        {"small model: head dim 8",        8, 8, 8, 4, 2, 3, 7, false, false, false},
        {"head dims 40 / 16, partial neox", 40, 16, 20, 5, 1, 2, 100, true, true, true},
        {"head dim 4, one head",           4, 4, 4, 1, 1, 1, 0, false, true, false},
    };
    uint32_t seed = 500;
    for (KvType type : kKvFormats) {
        CAPTURE(tern::kv_type_name(type));
        std::vector<RopeCase> cases(std::begin(block_cases), std::end(block_cases));
        if (!tern::kv_format_info(type).quantized) cases.insert(cases.end(), std::begin(float_cases), std::end(float_cases));
        for (const RopeCase& c : cases)
            for (bool device_pos : {false, true}) {
                CAPTURE(std::string(c.what));
                CAPTURE(device_pos);
                check_rope_kv(type, c, device_pos, seed += 10);
            }
    }
}

TEST_CASE("the fused launchers refuse what they cannot run and do nothing for empty work") {
    const DeviceArray<uint8_t> w(8192), q(8192);
    const DeviceArray<float> x(2048), y(1024);
    using tern::cuda::matmul_glu;
    using tern::cuda::matmul_outputs;
    using tern::cuda::matmul_q8_outputs;
    const MatmulOutput o{w.get(), 4, nullptr, y.get()};
    const MatmulOutput four[4] = {o, o, o, o};
    CHECK_THROWS_AS(matmul_outputs(GgmlType::Q4_0, 32, four, 0, x.get(), 1, false, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(matmul_outputs(GgmlType::Q4_0, 32, four, 4, x.get(), 1, false, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8_outputs(GgmlType::Q4_0, 32, four, 4, q.get(), 1, false, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(matmul_outputs(GgmlType::Q8_K, 256, &o, 1, x.get(), 1, false, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(matmul_q8_outputs(GgmlType::F16, 256, &o, 1, q.get(), 1, false, nullptr), std::invalid_argument);
    const MatmulOutput misaligned{w.get() + 2, 4, nullptr, y.get()};
    const MatmulOutput pair[2] = {o, misaligned};
    CHECK_THROWS_AS(matmul_outputs(GgmlType::Q4_0, 32, pair, 2, x.get(), 1, false, nullptr), std::invalid_argument);
    const MatmulOutput no_y{w.get(), 4, nullptr, nullptr};
    CHECK_THROWS_AS(matmul_outputs(GgmlType::Q4_0, 32, &no_y, 1, x.get(), 1, false, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(matmul_glu(GgmlType::Q4_0, 48, 4, w.get(), nullptr, w.get(), nullptr, GluActivation::silu, x.get(),
                               1, y.get(), nullptr),
                    std::invalid_argument);
    CHECK_NOTHROW(matmul_outputs(GgmlType::Q4_0, 32, four, 3, x.get(), 0, true, nullptr));
    CHECK_NOTHROW(matmul_glu(GgmlType::Q4_0, 32, 0, w.get(), nullptr, w.get(), nullptr, GluActivation::silu, x.get(),
                             1, y.get(), nullptr));

    DeviceArray<uint8_t> kc(4096), vc(4096);
    tern::cuda::KvLayer layer;
    layer.type = KvType::q8_0;
    layer.k = kc.get();
    layer.v = vc.get();
    layer.n_kv_heads = 1;
    layer.head_dim = 48;   // not whole q8_0 blocks
    layer.head_dim_v = 64;
    layer.n_ctx = 8;
    tern::cuda::RopeParams rope;
    rope.n_rot = 48;
    using tern::cuda::qk_norm_rope_kv_write;
    CHECK_THROWS_AS(qk_norm_rope_kv_write(layer, y.get(), y.get(), x.get(), 1, 1, nullptr, nullptr, kEps, rope, 0,
                                          nullptr),
                    std::invalid_argument);
    layer.head_dim = 64;
    rope.n_rot = 63;
    CHECK_THROWS_AS(qk_norm_rope_kv_write(layer, y.get(), y.get(), x.get(), 1, 1, nullptr, nullptr, kEps, rope, 0,
                                          nullptr),
                    std::invalid_argument);
    rope.n_rot = 64;
    CHECK_THROWS_AS(qk_norm_rope_kv_write(layer, y.get(), y.get(), x.get(), 2, 1, nullptr, nullptr, kEps, rope, 7,
                                          nullptr),
                    std::invalid_argument);   // positions 7 and 8 of 8
    CHECK_NOTHROW(qk_norm_rope_kv_write(layer, y.get(), y.get(), x.get(), 0, 1, nullptr, nullptr, kEps, rope, 8,
                                        nullptr));
}
