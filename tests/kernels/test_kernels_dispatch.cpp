// kernels/cpu/dispatch: the one kernel table per set. Every set that this build and CPU can run is complete
// (a kernel of each family for every format it covers), the scalar set holds the scalar twins and no tiles,
// the SIMD sets hold the kernels the loop nests used to pick by ISA (packed tiles and decode, panel tiles,
// attention, SwiGLU), and each set's widening of 16-bit activations gives its scalar twin's bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_f16.h"
#include "kernels/cpu/silu.h"
#include "quant/types.h"
#include "tests/kernel_test_data.h"

// Function pointers compared inside doctest's CHECK((...)): doctest cannot print them, so the comparison is not
// decomposed.
namespace tern {
namespace {

constexpr CpuIsa kIsas[] = {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon};
constexpr GgmlType kPackedTypes[] = {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K};
constexpr ActFormat kActFormats[] = {ActFormat::f32,  ActFormat::f16,  ActFormat::bf16,
                                     ActFormat::q8_0, ActFormat::q8_1, ActFormat::q8_k};

std::vector<const CpuKernels*> runnable_sets() {
    std::vector<const CpuKernels*> v;
    for (CpuIsa isa : kIsas)
        if (const CpuKernels* k = cpu_kernels_for(isa)) v.push_back(k);
    return v;
}

} // namespace

TEST_CASE("every runnable set is complete: dots, quantizers, widening, attention and SwiGLU") {
    REQUIRE(cpu_kernels_for(CpuIsa::scalar) != nullptr);
    for (const CpuKernels* k : runnable_sets()) {
        CAPTURE(std::string(cpu_isa_name(k->isa)));
        for (GgmlType t : test::kDotWeightTypes) {
            CAPTURE(type_name(t));
            CHECK((k->find_dot(t) != nullptr));
            CHECK((k->dot(t) == k->find_dot(t)));
        }
        for (GgmlType t : {GgmlType::Q8_K, GgmlType::Q8_1, GgmlType::IQ2_XXS, GgmlType::I8}) {
            CAPTURE(type_name(t));
            CHECK((k->find_dot(t) == nullptr));
            CHECK_THROWS_AS(k->dot(t), std::invalid_argument);
        }
        for (ActFormat f : kActFormats) CHECK((k->quantizer(f) != nullptr));
        CHECK((k->widen16 != nullptr));
        CHECK((k->attn_chunk != nullptr));
        CHECK((k->swiglu != nullptr));
        // A decode kernel only beside a tile; packed and panel tiles only for their formats.
        for (GgmlType t : kPackedTypes)
            if (k->packed(t).decode) CHECK((k->packed(t).tile != nullptr));
        for (GgmlType t : {GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::Q4_1, GgmlType::Q5_K}) {
            CHECK((k->packed(t).tile == nullptr));
            CHECK((k->packed(t).decode == nullptr));
        }
        for (GgmlType t : kPackedTypes) CHECK((k->panel_tile(t) == nullptr));
    }
}

TEST_CASE("the scalar set holds the scalar twins and no tiles") {
    const CpuKernels* s = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(s);
    CHECK((s->isa == CpuIsa::scalar));
    CHECK((s->q4_0 == vec_dot_q4_0_q8_0_scalar));
    CHECK((s->f32 == vec_dot_f32_f32_scalar));
    CHECK((s->widen16 == widen16_scalar));
    CHECK((s->attn_chunk == attn_chunk_scalar));
    CHECK((s->swiglu == swiglu_rows_scalar));
    for (GgmlType t : kPackedTypes) {
        CHECK((s->packed(t).tile == nullptr));
        CHECK((s->packed(t).decode == nullptr));
    }
    CHECK((s->panel_tile(GgmlType::F16) == nullptr));
    CHECK((s->panel_tile(GgmlType::BF16) == nullptr));
}

TEST_CASE("the process's set is one of the tables, chosen once") {
    const CpuKernels& k = cpu_kernels();
    CHECK((&k == cpu_kernels_for(k.isa)));
    CHECK((&cpu_kernels() == &k));
}

TEST_CASE("the SIMD sets hold the kernels of their ISA") {
    const CpuKernels* s = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(s);
    if (const CpuKernels* k = cpu_kernels_for(CpuIsa::avx2)) {
        for (GgmlType t : kPackedTypes) CHECK((k->packed(t).tile != nullptr));
        CHECK((k->packed(GgmlType::Q4_0).decode != nullptr));
        CHECK((k->packed(GgmlType::Q8_0).decode != nullptr));
        CHECK((k->packed(GgmlType::Q4_K).decode != nullptr));
        CHECK((k->packed(GgmlType::Q6_K).decode == nullptr));   // Q6_K decode takes the tile
        CHECK((k->panel_tile(GgmlType::F16) != nullptr));
        CHECK((k->panel_tile(GgmlType::BF16) != nullptr));
        CHECK((k->attn_chunk != s->attn_chunk));
        CHECK((k->swiglu != s->swiglu));
    }
    if (const CpuKernels* k = cpu_kernels_for(CpuIsa::avx512)) {
        const CpuKernels* avx2 = cpu_kernels_for(CpuIsa::avx2);
        REQUIRE(avx2);   // AVX-512 implies the AVX2 set
        for (GgmlType t : kPackedTypes) {
            CHECK((k->packed(t).tile != nullptr));
            CHECK((k->packed(t).tile != avx2->packed(t).tile));
            CHECK((k->packed(t).decode == nullptr));   // the AVX2 decode kernels are not part of this set
        }
        CHECK((k->panel_tile(GgmlType::F16) != avx2->panel_tile(GgmlType::F16)));
        CHECK((k->widen16 != avx2->widen16));
        CHECK((k->attn_chunk == avx2->attn_chunk));   // attention and SwiGLU stay AVX2
        CHECK((k->swiglu == avx2->swiglu));
    }
    if (const CpuKernels* k = cpu_kernels_for(CpuIsa::neon)) {
        CHECK((k->q4_0 != s->q4_0));
        for (GgmlType t : kPackedTypes) CHECK((k->packed(t).tile == nullptr));   // plain layout and dot kernels
        CHECK((k->panel_tile(GgmlType::F16) == nullptr));
        CHECK((k->attn_chunk == s->attn_chunk));
        CHECK((k->swiglu == s->swiglu));
    }
}

TEST_CASE("attn_chunk_kernel: the set's kernel, or the scalar twin for head dims that are not multiples of 8") {
    for (const CpuKernels* k : runnable_sets()) {
        CAPTURE(std::string(cpu_isa_name(k->isa)));
        AttnParams p;
        p.head_dim = p.head_dim_v = 64;
        CHECK((attn_chunk_kernel(p, k) == k->attn_chunk));
        p.head_dim_v = 36;
        CHECK((attn_chunk_kernel(p, k) == AttnChunkFn(attn_chunk_scalar)));
        p.head_dim = 36;
        p.head_dim_v = 64;
        CHECK((attn_chunk_kernel(p, k) == AttnChunkFn(attn_chunk_scalar)));
    }
    AttnParams p;
    p.head_dim = p.head_dim_v = 128;
    CHECK((attn_chunk_kernel(p) == cpu_kernels().attn_chunk));
}

TEST_CASE("every set's widening of 16-bit values gives the scalar twin's bits (all 65536 values, any tail; NaNs stay NaNs)") {
    std::vector<uint16_t> all(65536 + 13);
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i * 40503u);   // every value, shuffled
    for (const CpuKernels* k : runnable_sets()) {
        CAPTURE(std::string(cpu_isa_name(k->isa)));
        for (GgmlType t : {GgmlType::F16, GgmlType::BF16}) {
            CAPTURE(type_name(t));
            for (int64_t n : {int64_t(1), int64_t(7), int64_t(8), int64_t(17), int64_t(all.size())}) {
                CAPTURE(n);
                std::vector<float> want(size_t(n), -1.0f), got(size_t(n), -2.0f);
                widen16_scalar(t, all.data(), want.data(), n);
                k->widen16(t, all.data(), got.data(), n);
                // The same bits, except that F16C quiets a signalling NaN (a NaN stays a NaN).
                size_t differ = 0;
                for (size_t i = 0; i < want.size(); ++i)
                    if (std::memcmp(&want[i], &got[i], 4) != 0 && !(std::isnan(want[i]) && std::isnan(got[i]))) ++differ;
                CHECK(differ == 0);
            }
        }
    }
}

} // namespace tern
