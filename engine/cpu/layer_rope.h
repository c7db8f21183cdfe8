#pragma once
// The RoPE of one layer exactly as the forward applies it: pair layout, rotated dims, the layer's own
// base and frequency scale (Gemma 3's local and global layers differ) and the model's frequency
// factors (Llama 3.1 rope_freqs). The forward rotates q/k with apply(); the context shift turns
// cached keys with rotation(), so both read the same parameters from one place.
#include <cstdint>

#include "engine/rope_plan.h"
#include "engine/model_config.h"
#include "kernels/cpu/rope_shift.h"

namespace tern {

struct LayerRope {
    bool neox = false;
    int64_t head_dim = 0, n_rot = 0;
    float base = 10000.0f, freq_scale = 1.0f;
    const float* freq_factors = nullptr; // (n_rot/2) or null; owned by the backend
    RopeYarn yarn;                       // the layer's YaRN (off unless rope.scaling.type is yarn)

    // One head (head_dim floats) at position pos, bit-identical to rope_neox_f32 / rope_normal_f32. The
    // cos/sin table of the last position is kept per thread (the forward rotates every q and k head of a
    // token on one thread, one after another), so pow/cos/sin run once per token instead of once per head.
    void apply(float* x, int32_t pos) const;
    // The rotation that moves a key cached at position p to position p + delta (YaRN's angles, no mscale).
    RopeRotation rotation(int32_t delta) const;
};

// The rope the layer program planned for a layer (engine/rope_plan.h), over heads of head_dim.
LayerRope layer_rope(const RopePlan& plan, int64_t head_dim, const float* freq_factors);
LayerRope layer_rope(const ModelConfig& config, int32_t layer, const float* freq_factors);

} // namespace tern
