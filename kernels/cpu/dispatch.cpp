// The once-initialised kernel tables (the only mutable-at-start state of kernels/cpu): which kernel of each
// family every set holds is decided here and nowhere else.
#include "kernels/cpu/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/causal_conv1d.h"
#include "kernels/cpu/gated_delta.h"
#include "kernels/cpu/gemm_f16.h"
#include "kernels/cpu/silu.h"
#include "kernels/cpu_features.h"

namespace tern {

const char* cpu_isa_name(CpuIsa isa) {
    switch (isa) {
    case CpuIsa::scalar: return "scalar";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::neon: return "neon";
    }
    return "?";
}

VecDotFn CpuKernels::find_dot(GgmlType w) const {
    switch (w) {
    case GgmlType::Q4_0: return q4_0;
    case GgmlType::Q4_1: return q4_1;
    case GgmlType::Q5_0: return q5_0;
    case GgmlType::Q5_1: return q5_1;
    case GgmlType::Q8_0: return q8_0;
    case GgmlType::Q2_K: return q2_k;
    case GgmlType::Q3_K: return q3_k;
    case GgmlType::Q4_K: return q4_k;
    case GgmlType::Q5_K: return q5_k;
    case GgmlType::Q6_K: return q6_k;
    case GgmlType::IQ4_NL: return iq4_nl;
    case GgmlType::IQ4_XS: return iq4_xs;
    case GgmlType::F8_E4M3: return f8_e4m3;
    case GgmlType::MXFP4: return mxfp4;
    case GgmlType::F16: return f16;
    case GgmlType::BF16: return bf16;
    case GgmlType::F32: return f32;
    default: return nullptr;
    }
}

VecDotFn CpuKernels::dot(GgmlType w) const {
    const VecDotFn f = find_dot(w);
    if (!f)
        throw std::invalid_argument(std::string("CPU kernels (") + cpu_isa_name(isa) + "): no dot kernel for weight format " +
                                    std::string(type_name(w)));
    return f;
}

VecDotColsFn CpuKernels::find_dot_cols(GgmlType w) const {
    switch (w) {
    case GgmlType::Q5_0: return q5_0_cols;
    default: return nullptr;
    }
}

CpuKernels::Packed CpuKernels::packed(GgmlType w) const {
    switch (w) {
    case GgmlType::Q4_0: return packed_q4_0;
    case GgmlType::Q8_0: return packed_q8_0;
    case GgmlType::Q4_K: return packed_q4_k;
    case GgmlType::Q6_K: return packed_q6_k;
    default: return {};
    }
}

F16TileFn CpuKernels::panel_tile(GgmlType w) const {
    return w == GgmlType::F16 ? panel_f16 : w == GgmlType::BF16 ? panel_bf16 : nullptr;
}

namespace {

bool isa_supported(CpuIsa isa) {
    const CpuFeatures& f = cpu_features();
    switch (isa) {
    case CpuIsa::scalar: return true;
    case CpuIsa::avx2:
#if defined(__x86_64__)
        return f.avx2 && f.fma && f.f16c;
#else
        return false;
#endif
    case CpuIsa::avx512:
#if defined(__x86_64__)
        return f.avx2 && f.fma && f.f16c && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
#else
        return false;
#endif
    case CpuIsa::neon:
#if defined(__aarch64__)
        return f.neon && f.neon_dotprod;
#else
        return false;
#endif
    }
    return false;
}

// The scalar twins: what a set without a kernel of its own runs. No packed or panel tiles: on such a set the
// weights stay in the file layout and go through the dot kernels.
void fill_scalar(CpuKernels& k) {
    fill_cpu_kernels_scalar(k);
    k.widen16 = widen16_scalar;
    k.attn_chunk = attn_chunk_scalar;
    k.swiglu = swiglu_rows_scalar;
    k.causal_conv1d = causal_conv1d_scalar;
    k.gated_delta_recurrent = gated_delta_recurrent_scalar;
    k.gated_delta_chunked = gated_delta_chunked_scalar;
}

void fill_avx2(CpuKernels& k) {
#if defined(__x86_64__)
    fill_cpu_kernels_avx2(k);
    fill_packed_avx2(k);
    fill_panels_avx2(k);
    fill_attention_avx2(k);
    fill_swiglu_avx2(k);
    fill_causal_conv1d_avx2(k);
    fill_gated_delta_avx2(k);
#else
    (void)k;
#endif
}

// The 256-bit dot kernels recompiled with VNNI, then the 512-bit ones; its own packed tiles (and no packed decode
// kernel: the AVX2 one is not part of this set), panel tiles and gated delta rule; attention, SwiGLU and the
// causal conv1d stay AVX2.
void fill_avx512(CpuKernels& k) {
#if defined(__x86_64__)
    fill_cpu_kernels_avx2(k);
    fill_cpu_kernels_avx512(k);
    fill_packed_avx512(k);
    fill_panels_avx512(k);
    fill_attention_avx2(k);
    fill_swiglu_avx2(k);
    fill_causal_conv1d_avx2(k);
    fill_gated_delta_avx512(k);
#else
    (void)k;
#endif
}

void fill_neon(CpuKernels& k) {
#if defined(__aarch64__)
    fill_cpu_kernels_neon(k);
#else
    (void)k;
#endif
}

struct Tables {
    CpuKernels set[4];
    bool ok[4] = {};
    Tables() {
        for (int i = 0; i < 4; ++i) {
            const auto isa = static_cast<CpuIsa>(i);
            ok[i] = isa_supported(isa);
            if (!ok[i]) continue;
            CpuKernels& k = set[i];
            fill_scalar(k);   // every set starts complete; the SIMD files override what they have
            switch (isa) {
            case CpuIsa::scalar: break;
            case CpuIsa::avx2: fill_avx2(k); break;
            case CpuIsa::avx512: fill_avx512(k); break;
            case CpuIsa::neon: fill_neon(k); break;
            }
            k.isa = isa;
        }
    }
};

const Tables& tables() {
    static const Tables t;
    return t;
}

const CpuKernels& choose() {
    const Tables& t = tables();
    if (const char* env = std::getenv("TERN_CPU_ISA"); env && *env) {
        const std::string_view want(env);
        for (int i = 0; i < 4; ++i) {
            if (want != cpu_isa_name(static_cast<CpuIsa>(i))) continue;
            if (!t.ok[i])
                throw std::runtime_error("TERN_CPU_ISA=" + std::string(want) + ": this CPU (" + cpu_features().describe() +
                                         ") or this build cannot run that kernel set");
            return t.set[i];
        }
        throw std::runtime_error("TERN_CPU_ISA=" + std::string(want) + ": expected scalar, avx2, avx512 or neon");
    }
    for (int i : {2, 3, 1}) // avx512, neon, avx2
        if (t.ok[i]) return t.set[i];
    return t.set[0];
}

} // namespace

const CpuKernels& cpu_kernels() {
    static const CpuKernels& k = choose();
    return k;
}

const CpuKernels* cpu_kernels_for(CpuIsa isa) {
    const Tables& t = tables();
    const int i = static_cast<int>(isa);
    return t.ok[i] ? &t.set[i] : nullptr;
}

} // namespace tern
