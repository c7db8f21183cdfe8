#include "engine/cpu/layer_rope.h"

#include <cstring>
#include <vector>

#include "engine/model_config.h"
#include "kernels/cpu/ops.h"

namespace tern {

namespace {

// rope_cos_sin's table for one position and everything the angles depend on. The frequency factors are
// compared by value, not by address: a later model may reuse a freed model's address for other factors.
struct RopeTableCache {
    int64_t n_rot = -1;
    int32_t pos = 0;
    float base = 0.0f, freq_scale = 0.0f;
    RopeYarn yarn;
    std::vector<float> factors; // (n_rot/2) copy, or empty for none
    std::vector<float> cos, sin;

    bool holds(const LayerRope& r, int32_t p) const {
        if (r.n_rot != n_rot || p != pos || r.base != base || r.freq_scale != freq_scale ||
            !(r.yarn == yarn))
            return false;
        if (!r.freq_factors) return factors.empty();
        return !factors.empty() &&
               std::memcmp(factors.data(), r.freq_factors, factors.size() * sizeof(float)) == 0;
    }

    void fill(const LayerRope& r, int32_t p) {
        const auto half = static_cast<size_t>(r.n_rot / 2);
        n_rot = r.n_rot;
        pos = p;
        base = r.base;
        freq_scale = r.freq_scale;
        yarn = r.yarn;
        if (r.freq_factors)
            factors.assign(r.freq_factors, r.freq_factors + half);
        else
            factors.clear();
        cos.resize(half);
        sin.resize(half);
        rope_cos_sin(r.n_rot, p, r.base, r.freq_scale, r.freq_factors, cos.data(), sin.data(), r.yarn);
    }
};

} // namespace

void LayerRope::apply(float* x, int32_t pos) const {
    thread_local RopeTableCache table;
    if (!table.holds(*this, pos)) table.fill(*this, pos);
    rope_rotate_f32(x, neox, n_rot, table.cos.data(), table.sin.data());
}

RopeRotation LayerRope::rotation(int32_t delta) const {
    return rope_rotation(neox, n_rot, delta, base, freq_scale, freq_factors, yarn);
}

LayerRope layer_rope(const RopePlan& plan, int64_t head_dim, const float* freq_factors) {
    LayerRope r;
    r.neox = plan.neox;
    r.head_dim = head_dim;
    r.n_rot = plan.n_rot;
    r.base = plan.base;
    r.freq_scale = plan.freq_scale;
    r.freq_factors = freq_factors;
    r.yarn = RopeYarn{plan.yarn_ext_factor, plan.yarn_corr_low, plan.yarn_corr_high, plan.mscale};
    return r;
}

LayerRope layer_rope(const ModelConfig& config, int32_t layer, const float* freq_factors) {
    const LayerConfig& lc = config.layers[static_cast<size_t>(layer)];
    return layer_rope(rope_plan(config, layer), lc.head_dim > 0 ? lc.head_dim : config.head_dim,
                      lc.no_freq_factors ? nullptr : freq_factors);
}

} // namespace tern
