#pragma once
// The CPU backend: weights stay in their GGUF formats inside the mapping. By default every projection and
// the lm_head quantize their input activations once (ggml's pairing: Q8_0/Q8_1/Q8_K, f16/bf16, f32) and
// run the SIMD dot kernels (kernels/cpu/matmul_quant.h); CpuOptions::exact_matmul dequantizes weight
// rows to f32 instead (kernels/cpu/ops.h matmul_dequant), and over an f32 KV cache also attends by the plain
// softmax (attention_head) instead of the flash kernels. Other activations are f32; the KV cache is f32, f16,
// bf16, q8_0 or f8_e4m3.
#include <array>
#include <initializer_list>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu_options.h"
#include "engine/cpu/kv_cache.h"
#include "engine/cpu/prepared_weights.h"
#include "engine/layer_program.h"
#include "engine/model_config.h"
#include "engine/tensor_roles.h"
#include "engine/weights.h"
#include "kernels/cpu/dot.h"

namespace tern {

// gate = act(gate) * up over n elements, for the model's FFN activation (dense and expert FFNs alike).
void glu_activation(FfnActivation act, float* gate, const float* up, int64_t n, int n_threads);

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(const CpuOptions& options = {});
    // Host memory: engine/cpu/memory_plan.h against the host's limits (engine/memory_budget.h).
    MemoryNeed plan_memory(const ModelConfig& config, const ModelWeights& weights,
                           const MemoryRequest& request) const override;
    std::vector<MemoryLimit> memory_limits() const override;
    // The weights' mapping (the Model) must outlive the backend: only views are kept.
    void load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) override;
    void forward(const ForwardBatch& batch) override;
    std::span<const float> logits(int row) override;
    void argmax(std::span<int32_t> per_row) override;
    int32_t n_past() const override { return kv_.n_past(); }
    void kv_truncate(int32_t n_past) override;
    KvSnapshot kv_save(int32_t n) const override;
    void kv_load(const KvSnapshot& snapshot) override;
    KvSnapshot kv_save_range(int32_t begin, int32_t end) const override;
    void kv_append(const KvSnapshot& range) override;
    // Context shift: moves the later rows down and turns their K back (backend_cpu_shift.cpp).
    void kv_erase(int32_t begin, int32_t end) override;
    // Sequences over one pool of KV pages (engine/kv_pages.h); forward takes batches of several.
    bool supports_sequences() const override { return true; }
    void seq_create(int32_t seq) override { kv_.create(seq); }
    void seq_free(int32_t seq) override;
    void seq_fork(int32_t src, int32_t dst, int32_t n) override { kv_.fork(src, dst, n); }
    int32_t seq_n_past(int32_t seq) const override { return kv_.n_past(seq); }
    void seq_truncate(int32_t seq, int32_t n) override;
    KvSnapshot seq_save_range(int32_t seq, int32_t begin, int32_t end) const override {
        return kv_.save_range(begin, end, seq);
    }
    void seq_append(int32_t seq, const KvSnapshot& range) override { kv_.append(range, seq); }
    KvPoolUse kv_pool() const override;
    DeviceKind device_kind() const override { return DeviceKind::cpu; }
    std::string device_name() const override { return "cpu"; }
    void set_observer(ForwardObserver* observer) override { observer_ = observer; }

    int n_logit_rows() const { return n_logit_rows_; }
    int n_threads() const { return n_threads_; }
    bool exact_matmul() const { return exact_matmul_; }

private:
    // The forward's steps (engine/layer_program.h) over this backend's kernels; one per forward, holding its
    // activations. Defined in backend_cpu.cpp.
    class Steps;

    // A layer's 1-D tensors (norm weights, biases, sinks) converted once to f32, and the experts' bias rows,
    // by role (engine/tensor_roles.h); empty when absent.
    struct LayerVectors {
        std::array<std::vector<float>, kLayerRoles> vectors;
        std::array<std::vector<std::vector<float>>, kLayerRoles> rows;
        const std::vector<float>& operator[](LayerRole r) const { return vectors[static_cast<size_t>(r)]; }
        const std::vector<std::vector<float>>& rows_of(LayerRole r) const { return rows[static_cast<size_t>(r)]; }
    };

    ModelConfig config_;
    ModelWeights weights_;
    DecoderProgram program_;
    std::vector<LayerVectors> layer_vectors_;
    std::vector<float> output_norm_; // (dim)
    std::vector<float> rope_freqs_;  // (n_rot/2), empty when absent
    int n_threads_ = 1;
    bool exact_matmul_ = false;
    bool loaded_ = false;
    ForwardObserver* observer_ = nullptr; // sees each projection group's f32 input (calibration)

    // One matmul input (n_cols, n_in) f32 and its quantized forms, each made at most once and shared by
    // every matmul that reads that input (q/k/v; gate/up).
    struct MatmulInput {
        const float* x = nullptr;
        int64_t n_in = 0, n_cols = 0;
        int n_threads = 1;                               // for quantizing a prefill's many columns
        std::array<bool, 6> ready{};                     // indexed by ActFormat
        std::array<std::vector<unsigned char>, 6> bytes; // (n_cols, act_row_bytes(format, n_in)) per format
        void reset(const float* x_new, int64_t n_in_new, int64_t n_cols_new);
        const void* acts(ActFormat f);
    };
    // y (n_cols, p.source.n_out) = W x (+ bias) along p's path (prepared_weights.h).
    // Defined in backend_cpu_matmul.cpp.
    void project(const PreparedProjection& p, const std::vector<float>& bias, MatmulInput& in, float* y);
    // input_ = RMSNorm(x) * w for n rows of width `dim` (f32 at xn), with the quantized form that `reader`
    // consumes made in the same pass (kernels/cpu/gemm_input.h). Defined in backend_cpu_matmul.cpp.
    void norm_input(const float* x, const std::vector<float>& w, int64_t n, int64_t dim, float* xn,
                    const PreparedProjection& reader);
    // The projections' paths and repacked copies, built in load() (prepared_weights.h).
    PreparedWeights prepared_;
    std::vector<float> fused_out_;      // (n_cols, group n_out) before it is split into the parts
    // ys[i] (n_cols, ps[i]->source.n_out) = W_i x (+ biases[i]) for projections sharing the input `in`: one matmul
    // over their fused copy when there is one, else one project() each. Same bits either way.
    void project_shared(const FusedProjections& fused, std::initializer_list<const PreparedProjection*> ps,
                        std::initializer_list<const std::vector<float>*> biases, MatmulInput& in,
                        std::initializer_list<float*> ys);
    // out (n, dim) = the mixture-of-experts FFN of layer pl over input_ (the normed rows, quantized for pl.router
    // by norm_input). Defined in backend_cpu_moe.cpp.
    void moe_ffn(const PreparedLayer& pl, const LayerVectors& lv, int64_t n, float* out);
    // att (n, n_heads, head_dim_v) = attention of q (n, n_heads, head_dim) at positions pos0.. over layer
    // l's cache of sequence seq, which already holds those positions. Defined in backend_cpu_attention.cpp.
    void attend(int32_t l, int32_t seq, int32_t pos0, int64_t n, const float* q, float* att);
    // The same by the plain softmax of kernels/cpu/ops.h, for exact_matmul_ over an f32 cache (the reference
    // arithmetic quantize --calibrate measures with). Defined in backend_cpu_attention_plain.cpp.
    void attend_plain(int32_t l, int32_t seq, int32_t pos0, int64_t n, const float* q, float* att);

    MatmulInput input_;
    // The layer whose cache layer l attends over: its own, or the earlier one it shares (gemma4).
    int32_t kv_layer(int32_t l) const {
        const int32_t src = program_.layers[static_cast<size_t>(l)].attention.kv_source;
        return src >= 0 ? src : l;
    }
    std::vector<float> per_layer_proj_norm_;   // (per_layer_dim) gemma4, empty elsewhere

    KvCache kv_;
    std::vector<float> logits_; // (n_logit_rows, vocab) f32
    int n_logit_rows_ = 0;
};

} // namespace tern
