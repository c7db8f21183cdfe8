#pragma once
// The CPU backend: weights stay in their GGUF formats inside the mapping and are dequantized row by
// row inside the matrix products; activations are f32; the KV cache is f32, f16 or bf16.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_cache.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace tern {

class CpuBackend final : public Backend {
public:
    // The weights' mapping (the Model) must outlive the backend: only views are kept.
    void load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) override;
    void forward(const ForwardBatch& batch) override;
    std::span<const float> logits(int row) override;
    void argmax(std::span<int32_t> per_row) override;
    int32_t n_past() const override { return kv_.n_past(); }
    void kv_truncate(int32_t n_past) override;
    KvSnapshot kv_save(int32_t n) const override;
    void kv_load(const KvSnapshot& snapshot) override;
    std::string device_name() const override { return "cpu"; }

    int n_logit_rows() const { return n_logit_rows_; }
    int n_threads() const { return n_threads_; }

private:
    // The small 1-D tensors (norm weights, biases) converted once to f32; empty when absent.
    struct LayerVectors {
        std::vector<float> attn_norm, bq, bk, bv, q_norm, k_norm, bo, post_attn_norm;
        std::vector<float> ffn_norm, b_gate, b_up, b_down, post_ffn_norm;
    };

    ModelConfig config_;
    ModelWeights weights_;
    std::vector<LayerVectors> layer_vectors_;
    std::vector<float> output_norm_; // (dim)
    std::vector<float> rope_freqs_;  // (n_rot/2), empty when absent
    int n_threads_ = 1;
    bool loaded_ = false;

    KvCache kv_;
    std::vector<float> logits_; // (n_logit_rows, vocab) f32
    int n_logit_rows_ = 0;
};

} // namespace tern
