#pragma once
// What the CPU can do, detected once at start; kernels dispatch on it.
#include <string>

namespace tern {

struct CpuFeatures {
    bool avx2 = false, fma = false, f16c = false;
    bool avx512f = false, avx512bw = false, avx512vl = false, avx512vnni = false, avx512bf16 = false;
    bool neon = false, neon_dotprod = false;
    int physical_cores = 1;
    int logical_cores = 1;

    std::string describe() const;   // "AVX2 FMA F16C AVX512F ..." (or "scalar")
};

const CpuFeatures& cpu_features();   // detected on first call, then cached (immutable)

// The thread count for a -t/--threads value: the value itself when positive, else (0) one thread
// per physical core, the default everywhere (more threads than cores only contend for them).
int resolve_threads(int requested);

} // namespace tern
