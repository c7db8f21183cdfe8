#include "engine/split_backend.h"

#include <algorithm>
#include <string>

#include "base/error.h"

namespace tern {

namespace {

// One change made to both parts' caches: `first`, then `second`; when the second throws, `undo_first` takes
// the first back, so the two stay in step. Where either may go first, the GPU's does: its checks (its
// memory) are the likelier to refuse, and then nothing changed.
template <class First, class Second, class Undo> void in_step(First&& first, Second&& second, Undo&& undo_first) {
    first();
    try {
        second();
    } catch (...) {
        undo_first();
        throw;
    }
}

} // namespace

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
    // gemma4: the snapshots a split cache joins have one head size per part, and a layer on shared KV reads a
    // layer of its own part (engine/layer_program.cpp refuses the rest).
    if (!config.uniform_head_dims())
        throw UsageError("this model's layers have two head sizes: its layers cannot be split across devices yet "
                         "(run it on one)");
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
    // Both parts take the same tokens and spans; the first writes the stream of every token, the second
    // reads it. A failure in the second takes back the positions the first wrote.
    hidden_.resize(batch.tokens.size() * static_cast<size_t>(dim_));
    ForwardBatch front = batch;
    front.hidden_out = hidden_.data();
    ForwardBatch back = batch;
    back.hidden_in = hidden_.data();
    in_step([&] { cpu_->forward(front); }, [&] { gpu_->forward(back); },
            [&] {
                if (batch.spans.empty()) return cpu_->kv_truncate(batch.pos0);
                for (const SequenceSpan& s : batch.spans)
                    cpu_->seq_truncate(s.seq, cpu_->seq_n_past(s.seq) - s.n_tokens);
            });
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
    // Named parts, not a structured binding: lambdas may not capture one before clang 16.
    const auto parts = kv_snapshot_split(range, cpu_shape_);
    in_step([&] { gpu_->kv_append(parts.second); }, [&] { cpu_->kv_append(parts.first); },
            [&] { gpu_->kv_truncate(before); });
}

void SplitBackend::kv_erase(int32_t begin, int32_t end) {
    if (split()) cpu_->kv_erase(begin, end);
    last().kv_erase(begin, end);
}

void SplitBackend::seq_create(int32_t seq) {
    if (!split()) return last().seq_create(seq);
    in_step([&] { gpu_->seq_create(seq); }, [&] { cpu_->seq_create(seq); }, [&] { gpu_->seq_free(seq); });
}

void SplitBackend::seq_free(int32_t seq) {
    if (split()) cpu_->seq_free(seq);   // both hold the same sequences: one refuses what the other would
    last().seq_free(seq);
}

void SplitBackend::seq_fork(int32_t src, int32_t dst, int32_t n) {
    if (!split()) return last().seq_fork(src, dst, n);
    // A fork the CPU's part cannot make (after the GPU's made it) leaves dst empty in both.
    in_step([&] { gpu_->seq_fork(src, dst, n); }, [&] { cpu_->seq_fork(src, dst, n); },
            [&] {
                for (Backend* part : {gpu_.get(), cpu_.get()}) {
                    try {
                        if (dst == 0)
                            part->kv_truncate(0);
                        else
                            part->seq_free(dst);
                    } catch (...) {   // the CPU's may not have it
                    }
                }
            });
}

void SplitBackend::seq_truncate(int32_t seq, int32_t n) {
    if (split()) cpu_->seq_truncate(seq, n);
    last().seq_truncate(seq, n);
}

KvSnapshot SplitBackend::seq_save_range(int32_t seq, int32_t begin, int32_t end) const {
    if (!split()) return last().seq_save_range(seq, begin, end);
    return kv_snapshot_join(cpu_->seq_save_range(seq, begin, end), gpu_->seq_save_range(seq, begin, end));
}

void SplitBackend::seq_append(int32_t seq, const KvSnapshot& range) {
    if (!split()) return last().seq_append(seq, range);
    const int32_t before = gpu_->seq_n_past(seq);
    const auto parts = kv_snapshot_split(range, cpu_shape_);   // named parts: see kv_append
    in_step([&] { gpu_->seq_append(seq, parts.second); }, [&] { cpu_->seq_append(seq, parts.first); },
            [&] { gpu_->seq_truncate(seq, before); });
}

KvPoolUse SplitBackend::kv_pool() const {
    if (!split()) return last().kv_pool();
    const KvPoolUse c = cpu_->kv_pool(), g = gpu_->kv_pool();
    const auto free_positions = [](const KvPoolUse& u) {
        return static_cast<int64_t>(u.pages - u.pages_in_use) * u.positions_per_page;
    };
    return free_positions(c) < free_positions(g) ? c : g;
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
