#include "engine/split_backend.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace tern {

SplitBackend::SplitBackend(std::unique_ptr<Backend> cpu, std::unique_ptr<Backend> gpu, int32_t gpu_layers)
    : cpu_(std::move(cpu)), gpu_(std::move(gpu)), gpu_layers_(std::max(gpu_layers, 0)) {}

void SplitBackend::slice(const ModelConfig& c, const ModelWeights& w, int32_t first, int32_t end, ModelConfig& co,
                         ModelWeights& wo) {
    co = c;
    co.layers.assign(c.layers.begin() + first, c.layers.begin() + end);
    co.n_layers = end - first;
    wo = w;
    wo.layers.assign(w.layers.begin() + first, w.layers.begin() + end);
    if (first > 0) wo.token_embd = {};
    if (end < c.n_layers) {
        wo.output = {};
        wo.output_norm = {};
    }
}

MemoryNeed SplitBackend::plan_memory(const ModelConfig& config, const ModelWeights& weights,
                                     const MemoryRequest& request) const {
    const int32_t on_gpu = std::min(gpu_layers_, config.n_layers);
    if (on_gpu == 0) return cpu_->plan_memory(config, weights, request);
    ModelConfig c;
    ModelWeights w;
    slice(config, weights, config.n_layers - on_gpu, config.n_layers, c, w);
    return gpu_->plan_memory(c, w, request);
}

std::vector<MemoryLimit> SplitBackend::memory_limits() const {
    return gpu_layers_ > 0 ? gpu_->memory_limits() : cpu_->memory_limits();
}

void SplitBackend::load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) {
    gpu_layers_in_use_ = std::min(gpu_layers_, config.n_layers);
    cpu_layers_ = config.n_layers - gpu_layers_in_use_;
    dim_ = config.dim;
    if (!split()) {
        last().load(config, weights, options);
        return;
    }
    ModelConfig c;
    ModelWeights w;
    slice(config, weights, 0, cpu_layers_, c, w);
    RunOptions o = options;
    cpu_->load(c, w, o);
    cpu_shape_ = {options.kv_type, {}, config.head_dim, config.head_dim_v, options.n_ctx};
    for (const LayerConfig& lc : c.layers) cpu_shape_.n_kv_heads.push_back(lc.n_kv_heads);
    slice(config, weights, cpu_layers_, config.n_layers, c, w);
    o.first_layer = options.first_layer + cpu_layers_;
    gpu_->load(c, w, o);
}

void SplitBackend::forward(const ForwardBatch& batch) {
    if (!split()) {
        last().forward(batch);
        return;
    }
    hidden_.resize(batch.tokens.size() * static_cast<size_t>(dim_));
    ForwardBatch front = batch;
    front.hidden_out = hidden_.data();
    cpu_->forward(front);
    ForwardBatch back = batch;
    back.hidden_in = hidden_.data();
    try {
        gpu_->forward(back);
    } catch (...) {
        cpu_->kv_truncate(batch.pos0);   // the two caches stay in step
        throw;
    }
}

void SplitBackend::kv_truncate(int32_t n_past) {
    if (split()) cpu_->kv_truncate(n_past);
    last().kv_truncate(n_past);
}

KvSnapshot SplitBackend::kv_save(int32_t n) const {
    if (!split()) return last().kv_save(n);
    return kv_snapshot_join(cpu_->kv_save(n), gpu_->kv_save(n));
}

void SplitBackend::kv_load(const KvSnapshot& snapshot) {
    if (!split()) return last().kv_load(snapshot);
    const auto [front, back] = kv_snapshot_split(snapshot, cpu_shape_);
    gpu_->kv_load(back);   // the larger check first: a misfit leaves both as they were
    cpu_->kv_load(front);
}

KvSnapshot SplitBackend::kv_save_range(int32_t begin, int32_t end) const {
    if (!split()) return last().kv_save_range(begin, end);
    return kv_snapshot_join(cpu_->kv_save_range(begin, end), gpu_->kv_save_range(begin, end));
}

void SplitBackend::kv_append(const KvSnapshot& range) {
    if (!split()) return last().kv_append(range);
    const int32_t before = n_past();
    const auto [front, back] = kv_snapshot_split(range, cpu_shape_);
    gpu_->kv_append(back);
    try {
        cpu_->kv_append(front);
    } catch (...) {
        gpu_->kv_truncate(before);
        throw;
    }
}

void SplitBackend::kv_erase(int32_t begin, int32_t end) {
    if (split()) cpu_->kv_erase(begin, end);
    last().kv_erase(begin, end);
}

std::string SplitBackend::device_name() const {
    if (gpu_layers_in_use_ == 0 && cpu_layers_ > 0) return cpu_->device_name();
    return split() ? gpu_->device_name() + "+cpu" : gpu_->device_name();
}

void SplitBackend::set_observer(ForwardObserver* observer) {
    cpu_->set_observer(observer);
    gpu_->set_observer(observer);
}

} // namespace tern
