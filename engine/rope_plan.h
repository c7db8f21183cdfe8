#pragma once
// A layer's RoPE, decided once from the ModelConfig: what the attention step applies to q and k and what a
// context shift turns cached keys with. Kept apart from the layer program so that code needing only the
// rope (engine/cpu/layer_rope, the kernel tests cross-built without the engine) does not pull the program in.
#include <cstdint>

namespace tern {

struct ModelConfig;

// One layer's RoPE as the attention step applies it and the context shift turns cached keys with: pair
// layout, rotated dims (0: NoPE), the layer's base and scale, YaRN, and the attention temperature of q.
struct RopePlan {
    bool neox = false;
    int32_t n_rot = 0;
    float base = 10000.0f, freq_scale = 1.0f;
    float yarn_ext_factor = 0.0f, yarn_corr_low = 0.0f, yarn_corr_high = 0.0f;
    float mscale = 1.0f;
};
RopePlan rope_plan(const ModelConfig& config, int32_t layer);

}  // namespace tern
