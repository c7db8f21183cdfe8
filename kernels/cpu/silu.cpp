// The scalar twin of SiLU / SwiGLU (silu.h).
#include "kernels/cpu/silu.h"

#include <cmath>
#include <cstring>

#include "kernels/cpu/ops.h"

namespace tern {

float exp_f32(float x) {
    using namespace silu_detail;
    x = x < kHi ? x : kHi;   // the operand order of vminps / vmaxps: a NaN takes the bound
    x = x > kLo ? x : kLo;
    const float n = std::nearbyint(x * kLog2e);
    float r = std::fma(n, -kLn2Hi, x);
    r = std::fma(n, -kLn2Lo, r);
    float p = kC[0];
    for (int i = 1; i < 8; ++i) p = std::fma(p, r, kC[i]);
    const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return p * scale;
}

void swiglu_rows_scalar(const float* gate, const float* up, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = silu_f32(gate[i]) * up[i];
}

} // namespace tern
