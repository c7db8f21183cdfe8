// The gated RMSNorm of a Gated DeltaNet layer (rmsnorm_gated.h).
#include "kernels/cpu/rmsnorm_gated.h"

#include "kernels/cpu/ops.h"
#include "kernels/cpu/silu.h"

namespace tern {

void rmsnorm_gated_f32(const float* o, const float* z, const float* w, float* y, int64_t n_heads, int64_t d,
                       float eps) {
    for (int64_t h = 0; h < n_heads; ++h) {
        rmsnorm_f32(o + h * d, w, y + h * d, d, eps);
        swiglu_rows_scalar(z + h * d, y + h * d, y + h * d, d);
    }
}

} // namespace tern
