#include "engine/layer_rope.h"

#include "kernels/cpu/ops.h"

namespace tern {

void LayerRope::apply(float* x, int32_t pos) const {
    if (neox)
        rope_neox_f32(x, head_dim, n_rot, pos, base, freq_scale, freq_factors);
    else
        rope_normal_f32(x, head_dim, n_rot, pos, base, freq_scale, freq_factors);
}

RopeRotation LayerRope::rotation(int32_t delta) const {
    return rope_rotation(neox, n_rot, delta, base, freq_scale, freq_factors);
}

LayerRope layer_rope(const ModelConfig& config, int32_t layer, const float* freq_factors) {
    const LayerConfig& lc = config.layers[static_cast<size_t>(layer)];
    LayerRope r;
    r.neox = config.rope_style == RopeStyle::neox;
    r.head_dim = config.head_dim;
    r.n_rot = config.n_rot;
    r.base = lc.rope_base;
    r.freq_scale = lc.rope_freq_scale;
    r.freq_factors = freq_factors;
    return r;
}

} // namespace tern
