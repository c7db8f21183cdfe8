#include "engine/rope_plan.h"

#include "engine/model_config.h"

namespace tern {

RopePlan rope_plan(const ModelConfig& config, int32_t layer) {
    const LayerConfig& lc = config.layers[static_cast<size_t>(layer)];
    RopePlan r;
    r.neox = config.rope_style == RopeStyle::neox;
    r.n_rot = lc.no_rope ? 0 : lc.n_rot > 0 ? lc.n_rot : config.n_rot;   // gemma4's local layers have their own   // no rotated dims: q and k (and a shift's keys) stay as they are
    r.base = lc.rope_base;
    r.freq_scale = lc.rope_freq_scale;
    r.yarn_ext_factor = lc.yarn_ext_factor;
    r.yarn_corr_low = lc.yarn_corr_low;
    r.yarn_corr_high = lc.yarn_corr_high;
    r.mscale = lc.rope_mscale;
    return r;
}

}  // namespace tern
