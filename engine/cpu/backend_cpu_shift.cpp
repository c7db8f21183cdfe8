// CpuBackend::kv_erase: the context shift (engine/backend.h).
#include <string>
#include <vector>

#include "engine/cpu/backend_cpu.h"
#include "engine/cpu/layer_rope.h"
#include "base/error.h"

namespace tern {

void CpuBackend::kv_erase(int32_t begin, int32_t end) {
    if (!loaded_) throw UsageError("kv_erase: the backend has no model loaded");
    if (begin < 0 || end < begin || end > kv_.n_past())
        throw UsageError("kv_erase: cannot remove positions " + std::to_string(begin) + ".." + std::to_string(end) +
                         ", the cache holds " + std::to_string(kv_.n_past()));
    // The keys after the gap move down by end - begin positions: turn them back by as many, with
    // each layer's own rope (the forward's parameters, engine/cpu/layer_rope.h).
    std::vector<RopeRotation> k_rotation;
    if (end > begin && end < kv_.n_past()) {
        const float* freq_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();
        for (int32_t l = 0; l < config_.n_layers; ++l)
            k_rotation.push_back(layer_rope(config_, l, freq_factors).rotation(begin - end));
    }
    kv_.erase(begin, end, k_rotation, n_threads_);
}

} // namespace tern
