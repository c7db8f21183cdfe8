#pragma once
// Partial offload (-ngl N): the model's last N layers and its output on the GPU backend, the layers
// before them on the CPU backend, as llama.cpp splits a model that does not fit the GPU. Each backend
// is loaded with its slice of the layers (RunOptions::first_layer) and hands the residual stream to the
// next through ForwardBatch::hidden_out / hidden_in; both keep the KV cache of their own layers and move
// together. N of 0 runs everything on the CPU, N at or above the layer count everything on the GPU:
// then the one backend is used alone, with no copy of the stream.
//
// Sequences (a batching engine's requests) when both backends have them: each part keeps every sequence
// over its own paged pool, both pools sized alike and changed together (created, forked, truncated, freed,
// saved and appended in step), and a forward of several sequences (ForwardBatch::spans) gives both parts
// the same spans, the stream of every token handed over between them. Each part is batch invariant (a
// sequence's bits do not depend on what shares its forward), so the split is too.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_snapshot.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace tern {

class SplitBackend final : public Backend {
public:
    // gpu_layers >= 0: the layers to put on `gpu` (counted from the last).
    SplitBackend(std::unique_ptr<Backend> cpu, std::unique_ptr<Backend> gpu, int32_t gpu_layers);

    // The GPU's part against the GPU's memory (the CPU part is the smaller and is mapped from the file).
    MemoryNeed plan_memory(const ModelConfig& config, const ModelWeights& weights,
                           const MemoryRequest& request) const override;
    std::vector<MemoryLimit> memory_limits() const override;
    void load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) override;
    void forward(const ForwardBatch& batch) override;
    std::span<const float> logits(int row) override { return last().logits(row); }
    void argmax(std::span<int32_t> per_row) override { last().argmax(per_row); }
    size_t top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out) override {
        return last().top_logits(row, penalties, out);
    }
    FloatScan scan_logits(int row) override { return last().scan_logits(row); }
    int32_t n_past() const override { return last().n_past(); }
    void kv_truncate(int32_t n_past) override;
    KvSnapshot kv_save(int32_t n) const override;
    void kv_load(const KvSnapshot& snapshot) override;
    KvSnapshot kv_save_range(int32_t begin, int32_t end) const override;
    void kv_append(const KvSnapshot& range) override;
    void kv_erase(int32_t begin, int32_t end) override;
    bool supports_sequences() const override { return cpu_->supports_sequences() && gpu_->supports_sequences(); }
    void seq_create(int32_t seq) override;
    void seq_free(int32_t seq) override;
    void seq_fork(int32_t src, int32_t dst, int32_t n) override;
    int32_t seq_n_past(int32_t seq) const override { return last().seq_n_past(seq); }
    void seq_truncate(int32_t seq, int32_t n) override;
    KvSnapshot seq_save_range(int32_t seq, int32_t begin, int32_t end) const override;
    void seq_append(int32_t seq, const KvSnapshot& range) override;
    // The part with the fewer free positions: a step must fit both pools.
    KvPoolUse kv_pool() const override;
    DeviceKind device_kind() const override { return gpu_layers_ > 0 ? gpu_->device_kind() : cpu_->device_kind(); }
    // "cuda:0" alone, "cuda:0+cpu" when split.
    std::string device_name() const override;
    void set_observer(ForwardObserver* observer) override;

    // The layers on the CPU after load() (0 when the GPU takes all of them).
    int32_t cpu_layers() const { return cpu_layers_; }

private:
    // The layers [first, end) of a model as a model of its own: the embedding only in the first slice,
    // the output norm and matrix only in the last.
    static void slice(const ModelConfig& config, const ModelWeights& weights, int32_t first, int32_t end,
                      ModelConfig& config_out, ModelWeights& weights_out);
    bool split() const { return cpu_layers_ > 0 && gpu_layers_in_use_ > 0; }
    Backend& last() const { return gpu_layers_in_use_ > 0 ? *gpu_ : *cpu_; }

    std::unique_ptr<Backend> cpu_, gpu_;
    int32_t gpu_layers_ = 0;
    int32_t cpu_layers_ = 0, gpu_layers_in_use_ = 0;
    KvSnapshotShape cpu_shape_;            // the CPU part's cache, for splitting a whole snapshot
    std::vector<float> hidden_;            // (n, dim) stream between the parts
    int32_t dim_ = 0;
};

} // namespace tern
