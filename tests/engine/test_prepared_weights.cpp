// engine/cpu/prepared_weights: each projection's matmul path for a kernel set, its repacked copy (the bytes
// quant/repack gives for the source), the q/k/v and gate/up groups fused into one packed matrix whose slices are
// the parts' copies, exact_matmul and formats without a dot kernel on the dequant path, and has_dot_kernel from
// the set's table.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/cpu/prepared_weights.h"
#include "kernels/cpu/dispatch.h"
#include "quant/reference.h"
#include "quant/repack.h"
#include "quant/repack_f16.h"
#include "quant/types.h"

namespace tern {
namespace {

// A tensor's bytes (aligned like a mapping's, so whole pages lie inside) and a copy of them kept aside:
// preparing releases the pages of what it copies, which zeroes heap pages.
struct Tensor {
    std::vector<uint8_t> storage, original;
    WeightRef ref;
};

Tensor make_tensor(GgmlType t, int64_t n_out, int64_t n_in, uint32_t seed) {
    Tensor x;
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> f(static_cast<size_t>(n_out * n_in));
    for (float& v : f) v = dist(rng);
    const size_t bytes = row_bytes(t, n_in) * static_cast<size_t>(n_out);
    x.storage.assign(bytes + 4096, 0);
    const auto base = reinterpret_cast<uintptr_t>(x.storage.data());
    uint8_t* data = x.storage.data() + ((4096 - base % 4096) % 4096);
    if (type_info(t).can_quantize)
        for (int64_t r = 0; r < n_out; ++r)
            quantize_row(t, f.data() + r * n_in, data + static_cast<size_t>(r) * row_bytes(t, n_in), n_in);
    x.original.assign(data, data + bytes);
    x.ref.name = "t";
    x.ref.type = t;
    x.ref.ne[0] = n_in;
    x.ref.ne[1] = n_out;
    x.ref.data = data;
    return x;
}

// One layer: dim 256, q 256 rows, k and v 64, ffn 512; the output has 100 rows (a ragged last group).
struct Model {
    Tensor q, k, v, o, gate, up, down, output;
    ModelWeights weights;
    Model(GgmlType t, GgmlType output_type = GgmlType::Q8_0)
        : q(make_tensor(t, 256, 256, 1)), k(make_tensor(t, 64, 256, 2)), v(make_tensor(t, 64, 256, 3)),
          o(make_tensor(t, 256, 256, 4)), gate(make_tensor(t, 512, 256, 5)), up(make_tensor(t, 512, 256, 6)),
          down(make_tensor(t, 256, 512, 7)), output(make_tensor(output_type, 100, 256, 8)) {
        LayerWeights lw;
        lw.wq = q.ref;
        lw.wk = k.ref;
        lw.wv = v.ref;
        lw.wo = o.ref;
        lw.w_gate = gate.ref;
        lw.w_up = up.ref;
        lw.w_down = down.ref;
        weights.layers.push_back(lw);
        weights.output = output.ref;
    }
};

std::vector<uint8_t> packed_copy_of(const Tensor& x) {
    std::vector<uint8_t> out(packed_bytes(x.ref.type, x.ref.n_out(), x.ref.n_in()));
    repack_rows(x.ref.type, x.original.data(), x.ref.n_out(), x.ref.n_in(), out.data());
    return out;
}

bool same_bytes(const uint8_t* a, const std::vector<uint8_t>& b) { return std::memcmp(a, b.data(), b.size()) == 0; }

std::vector<const PreparedProjection*> all_of(const PreparedWeights& p) {
    const PreparedLayer& l = p.layers.at(0);
    return {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down, &p.output};
}

// A set with a packed Q4_0 tile and a panel F16 tile on this CPU, or nullptr.
const CpuKernels* tiled_set() {
    for (CpuIsa isa : {CpuIsa::avx512, CpuIsa::avx2, CpuIsa::neon})
        if (const CpuKernels* k = cpu_kernels_for(isa); k && k->packed(GgmlType::Q4_0).tile && k->panel_tile(GgmlType::F16))
            return k;
    return nullptr;
}

} // namespace

TEST_CASE("has_dot_kernel: a dot kernel in the set and rows of whole weight and activation blocks") {
    const CpuKernels& k = *cpu_kernels_for(CpuIsa::scalar);
    CHECK(has_dot_kernel(GgmlType::Q4_0, 64, k));
    CHECK_FALSE(has_dot_kernel(GgmlType::Q4_0, 48, k));
    CHECK_FALSE(has_dot_kernel(GgmlType::Q4_0, 0, k));
    CHECK(has_dot_kernel(GgmlType::Q4_K, 512, k));
    CHECK_FALSE(has_dot_kernel(GgmlType::Q4_K, 64, k));
    CHECK(has_dot_kernel(GgmlType::F16, 3, k));
    CHECK_FALSE(has_dot_kernel(GgmlType::Q8_K, 256, k));   // an activation format, no weight kernel
    CHECK_FALSE(has_dot_kernel(GgmlType::IQ2_XXS, 256, k));
}

TEST_CASE("exact_matmul: every projection on the dequant path, nothing copied") {
    Model m(GgmlType::Q4_0);
    const PreparedWeights p = prepare_weights(m.weights, true, 1, cpu_kernels());
    for (const PreparedProjection* x : all_of(p)) {
        CHECK(x->path == MatmulPath::dequant);
        CHECK(x->copy == nullptr);
    }
    CHECK_FALSE(p.layers[0].qkv);
    CHECK_FALSE(p.layers[0].gate_up);
    CHECK(p.copies.empty());
    CHECK(p.layers[0].q.source.data == m.q.ref.data);
    CHECK(p.output.source.data == m.output.ref.data);
}

TEST_CASE("the scalar set: the dot path in the file layout, quantized activations, nothing copied") {
    Model m(GgmlType::Q4_0);
    const PreparedWeights p = prepare_weights(m.weights, false, 1, *cpu_kernels_for(CpuIsa::scalar));
    for (const PreparedProjection* x : all_of(p)) {
        CHECK(x->path == MatmulPath::dot);
        CHECK(x->acts == ActFormat::q8_0);
        CHECK(x->copy == nullptr);
    }
    CHECK_FALSE(p.layers[0].qkv);
    CHECK(p.copies.empty());
    CHECK(std::memcmp(m.q.ref.data, m.q.original.data(), m.q.original.size()) == 0);   // nothing released
}

TEST_CASE("a format without a dot kernel takes the dequant path") {
    Model m(GgmlType::Q4_0, GgmlType::IQ2_XXS);
    const PreparedWeights p = prepare_weights(m.weights, false, 1, cpu_kernels());
    CHECK(p.output.path == MatmulPath::dequant);
    CHECK(p.output.copy == nullptr);
}

TEST_CASE("a set with tiles: packed copies, fused q/k/v and gate/up whose slices are the parts' copies") {
    const CpuKernels* k = tiled_set();
    if (!k) {
        MESSAGE("skipped: no set with packed and panel tiles on this build or CPU");
        return;
    }
    Model m(GgmlType::Q4_0);
    const PreparedWeights p = prepare_weights(m.weights, false, 2, *k);
    const PreparedLayer& l = p.layers[0];
    for (const PreparedProjection* x : all_of(p)) {
        CHECK(x->path == MatmulPath::packed);
        CHECK(x->copy != nullptr);
    }
    REQUIRE(l.qkv);
    CHECK(l.qkv.type == GgmlType::Q4_0);
    CHECK(l.qkv.n_in == 256);
    CHECK(l.qkv.n_out == 256 + 64 + 64);
    CHECK(l.q.copy == l.qkv.data);
    CHECK(l.k.copy == l.qkv.data + packed_bytes(GgmlType::Q4_0, 256, 256));
    CHECK(l.v.copy == l.k.copy + packed_bytes(GgmlType::Q4_0, 64, 256));
    REQUIRE(l.gate_up);
    CHECK(l.gate_up.n_out == 1024);
    CHECK(l.up.copy == l.gate.copy + packed_bytes(GgmlType::Q4_0, 512, 256));
    CHECK(same_bytes(l.q.copy, packed_copy_of(m.q)));
    CHECK(same_bytes(l.k.copy, packed_copy_of(m.k)));
    CHECK(same_bytes(l.v.copy, packed_copy_of(m.v)));
    CHECK(same_bytes(l.o.copy, packed_copy_of(m.o)));
    CHECK(same_bytes(l.gate.copy, packed_copy_of(m.gate)));
    CHECK(same_bytes(l.up.copy, packed_copy_of(m.up)));
    CHECK(same_bytes(l.down.copy, packed_copy_of(m.down)));
    CHECK(same_bytes(p.output.copy, packed_copy_of(m.output)));   // Q8_0, a ragged last group
    CHECK(p.copies.size() == 5);   // qkv, gate_up, o, down, output
}

TEST_CASE("a set with tiles: F16 weights get panel copies and are never fused") {
    const CpuKernels* k = tiled_set();
    if (!k) {
        MESSAGE("skipped: no set with packed and panel tiles on this build or CPU");
        return;
    }
    Model m(GgmlType::F16, GgmlType::F16);
    const PreparedWeights p = prepare_weights(m.weights, false, 1, *k);
    for (const PreparedProjection* x : all_of(p)) {
        CHECK(x->path == MatmulPath::panels);
        CHECK(x->acts == ActFormat::f16);
    }
    CHECK_FALSE(p.layers[0].qkv);
    CHECK_FALSE(p.layers[0].gate_up);
    std::vector<uint8_t> want(panel16_bytes(64, 256));
    repack_panel16(m.k.original.data(), 64, 256, want.data());
    CHECK(same_bytes(p.layers[0].k.copy, want));
}

TEST_CASE("projections that share one tensor share one copy") {
    const CpuKernels* k = tiled_set();
    if (!k) {
        MESSAGE("skipped: no set with packed tiles on this build or CPU");
        return;
    }
    Model m(GgmlType::Q4_0);
    m.weights.layers[0].w_down = m.o.ref;   // not a real model's layout: the same bytes read twice
    const PreparedWeights p = prepare_weights(m.weights, false, 1, *k);
    CHECK(p.layers[0].down.copy == p.layers[0].o.copy);
    CHECK(p.copies.size() == 4);   // qkv, gate_up, o (= down), output
}

} // namespace tern
