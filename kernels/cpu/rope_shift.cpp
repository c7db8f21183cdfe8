#include "kernels/cpu/rope_shift.h"

#include <cmath>

#include "kernels/cpu/ops.h"

namespace tern {

RopeRotation rope_rotation(bool neox, int64_t n_rot, int32_t delta, float base, float freq_scale,
                           const float* freq_factors, const RopeYarn& yarn) {
    RopeRotation r;
    r.neox = neox;
    r.n_rot = n_rot;
    const int64_t half = n_rot / 2;
    r.cos.resize(static_cast<size_t>(half));
    r.sin.resize(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
        // The same angle and the same float rounding of cos/sin as the forward's rotate().
        const double theta = rope_theta(i, n_rot, delta, base, freq_scale, freq_factors, yarn);
        r.cos[static_cast<size_t>(i)] = static_cast<float>(std::cos(theta));
        r.sin[static_cast<size_t>(i)] = static_cast<float>(std::sin(theta));
    }
    return r;
}

void rope_rotate_rows(const RopeRotation& rotation, float* x, int64_t n_rows, int64_t row_stride) {
    const int64_t half = rotation.n_rot / 2;
    const float* c = rotation.cos.data();
    const float* s = rotation.sin.data();
    for (int64_t r = 0; r < n_rows; ++r) {
        float* row = x + r * row_stride;
        if (rotation.neox) {
            float* a = row;
            float* b = row + half;
            for (int64_t i = 0; i < half; ++i) {
                const float x0 = a[i], x1 = b[i];
                a[i] = x0 * c[i] - x1 * s[i];
                b[i] = x0 * s[i] + x1 * c[i];
            }
        } else {
            for (int64_t i = 0; i < half; ++i) {
                const float x0 = row[2 * i], x1 = row[2 * i + 1];
                row[2 * i] = x0 * c[i] - x1 * s[i];
                row[2 * i + 1] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

} // namespace tern
