#pragma once
// What the CPU backend needs in host memory for a model and a context: the weights that end up
// resident (mapped pages, or the packed copies it makes of the matrices it multiplies), the KV
// cache (KvCache's layout, kernels/kv_format.h) and the buffers of one forward batch. Compared with
// the host's limits (engine/memory_budget.h) before anything large is allocated.
#include "engine/memory_need.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace tern {

MemoryNeed cpu_memory_need(const ModelConfig& config, const ModelWeights& weights, const MemoryRequest& request);

} // namespace tern
