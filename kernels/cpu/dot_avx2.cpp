// AVX2 + FMA + F16C kernel set (compiled with -mavx2 -mfma -mf16c, kernels/CMakeLists.txt; the rest of the
// binary stays baseline x86-64). The kernels themselves are in dot_x86.inl, shared with dot_avx512.cpp.
//
// Only this file's own (anonymous-namespace) functions may use the wider instructions; helpers from shared
// headers (q4_k_scale_min, f16_to_f32, ...) are small constexpr inlines that the optimiser folds in, so no
// out-of-line AVX2 copy of a shared inline function can win the linker's pick over the baseline one.
#include "kernels/cpu/dispatch.h"

#if defined(__x86_64__)
#include "kernels/cpu/dot_x86.inl"

namespace tern {

void fill_cpu_kernels_avx2(CpuKernels& k) { fill_x86_256(k); }

} // namespace tern
#endif
