#pragma once
// Run-time choice of the CPU kernel set, made ONCE: a table of function pointers per weight format
// (dot products) and per activation format (quantizers), filled from cpu_features() on first use.
// TERN_CPU_ISA=scalar|avx2|avx512|neon forces one (tests, benchmarks); asking for a set this CPU or this
// build cannot run is an error, not a silent fallback.
//
// Sets and what they need:
//   scalar  always                      (dot_scalar.cpp, the oracle)
//   avx2    AVX2 + FMA + F16C           (dot_avx2.cpp)
//   avx512  AVX-512 F/BW/VL + VNNI      (dot_avx512.cpp; 256-bit VNNI for the k-quants, 512-bit for the rest)
//   neon    aarch64 with dotprod        (dot_neon.cpp, built only for aarch64)
#include <cstdint>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/quantize_act.h"

namespace tern {

enum class CpuIsa : uint8_t { scalar, avx2, avx512, neon };
const char* cpu_isa_name(CpuIsa isa);

struct CpuKernels {
    CpuIsa isa = CpuIsa::scalar;
    VecDotFn q4_0 = nullptr, q4_1 = nullptr, q5_0 = nullptr, q5_1 = nullptr, q8_0 = nullptr;
    VecDotFn q2_k = nullptr, q3_k = nullptr, q4_k = nullptr, q5_k = nullptr, q6_k = nullptr;
    VecDotFn iq4_nl = nullptr, iq4_xs = nullptr, f8_e4m3 = nullptr;
    VecDotFn f16 = nullptr, bf16 = nullptr, f32 = nullptr;
    QuantizeActFn quantize[6] = {};   // indexed by ActFormat

    // The dot kernel for weight format `w` (InputError-style std::invalid_argument when there is none).
    VecDotFn dot(GgmlType w) const;
    QuantizeActFn quantizer(ActFormat f) const { return quantize[static_cast<int>(f)]; }
};

// The set for this process: the best the CPU supports, or TERN_CPU_ISA. Chosen on the first call.
const CpuKernels& cpu_kernels();
// A specific set, or nullptr when this build or this CPU cannot run it (tests compare sets with it).
const CpuKernels* cpu_kernels_for(CpuIsa isa);

// Filled by each ISA's file (internal to kernels/cpu).
void fill_cpu_kernels_scalar(CpuKernels& k);
void fill_cpu_kernels_avx2(CpuKernels& k);
void fill_cpu_kernels_avx512(CpuKernels& k);
void fill_cpu_kernels_neon(CpuKernels& k);

} // namespace tern
