// The once-initialised kernel tables (the only mutable-at-start state of kernels/cpu).
#include "kernels/cpu/dispatch.h"

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>

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

VecDotFn CpuKernels::dot(GgmlType w) const {
    VecDotFn f = nullptr;
    switch (w) {
    case GgmlType::Q4_0: f = q4_0; break;
    case GgmlType::Q4_1: f = q4_1; break;
    case GgmlType::Q5_0: f = q5_0; break;
    case GgmlType::Q5_1: f = q5_1; break;
    case GgmlType::Q8_0: f = q8_0; break;
    case GgmlType::Q2_K: f = q2_k; break;
    case GgmlType::Q3_K: f = q3_k; break;
    case GgmlType::Q4_K: f = q4_k; break;
    case GgmlType::Q5_K: f = q5_k; break;
    case GgmlType::Q6_K: f = q6_k; break;
    case GgmlType::IQ4_NL: f = iq4_nl; break;
    case GgmlType::IQ4_XS: f = iq4_xs; break;
    case GgmlType::F8_E4M3: f = f8_e4m3; break;
    case GgmlType::F16: f = f16; break;
    case GgmlType::BF16: f = bf16; break;
    case GgmlType::F32: f = f32; break;
    default: break;
    }
    if (!f)
        throw std::invalid_argument(std::string("CPU kernels (") + cpu_isa_name(isa) + "): no dot kernel for weight format " +
                                    std::string(type_name(w)));
    return f;
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

struct Tables {
    CpuKernels set[4];
    bool ok[4] = {};
    Tables() {
        for (int i = 0; i < 4; ++i) {
            const auto isa = static_cast<CpuIsa>(i);
            ok[i] = isa_supported(isa);
            if (!ok[i]) continue;
            CpuKernels& k = set[i];
            fill_cpu_kernels_scalar(k);   // every set starts complete; SIMD files override what they have
            switch (isa) {
            case CpuIsa::scalar: break;
            case CpuIsa::avx2: fill_cpu_kernels_avx2(k); break;
            case CpuIsa::avx512:
                fill_cpu_kernels_avx2(k);
                fill_cpu_kernels_avx512(k);
                break;
            case CpuIsa::neon: fill_cpu_kernels_neon(k); break;
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

#if !defined(__x86_64__)
void fill_cpu_kernels_avx2(CpuKernels&) {}
void fill_cpu_kernels_avx512(CpuKernels&) {}
#endif
#if !defined(__aarch64__)
void fill_cpu_kernels_neon(CpuKernels&) {}
#endif

} // namespace tern
