#pragma once
// Rotating RoPE'd rows by a fixed number of positions: the context shift of a long conversation
// moves cached keys to new positions without recomputing them. RoPE turns pair i of a key at
// position p by the angle p * theta_i, so a key cached at p becomes the key at p + delta by one
// more turn of delta * theta_i per pair; the angles are those of the forward's rope_*_f32
// (kernels/cpu/ops.h rope_theta), so norms applied before RoPE (Qwen3's and Gemma 3's K norm)
// are untouched and the composed rotation equals a direct one up to f32 rounding.
#include <cstdint>
#include <vector>

#include "kernels/cpu/ops.h"

namespace tern {

// The cos/sin of one rotation by `delta` positions, computed once and applied to many rows.
struct RopeRotation {
    bool neox = false;      // pairs (i, i + n_rot/2) instead of (2i, 2i+1)
    int64_t n_rot = 0;      // rotated dims per row (0: no rotation); dims n_rot.. pass through
    std::vector<float> cos; // n_rot / 2
    std::vector<float> sin; // n_rot / 2
};

// The rotation rope_neox_f32 / rope_normal_f32 apply at position `delta` (which may be negative). With
// YaRN the angles are YaRN's (linear in the position, so turns compose) but yarn.mscale is left out: the
// cached key already carries it once, and a rotation must not change its length.
RopeRotation rope_rotation(bool neox, int64_t n_rot, int32_t delta, float base, float freq_scale,
                           const float* freq_factors, const RopeYarn& yarn = {});

// Rotates n_rows rows in place: row r starts at x + r * row_stride. The scalar definition; it is
// also what runs (the loops vectorise; a shift costs far less than one decode step, models.md).
void rope_rotate_rows(const RopeRotation& rotation, float* x, int64_t n_rows, int64_t row_stride);

} // namespace tern
