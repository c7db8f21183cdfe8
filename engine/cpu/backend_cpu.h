#pragma once
// The CPU backend: weights stay in their GGUF formats inside the mapping. By default every projection and
// the lm_head quantize their input activations once (ggml's pairing: Q8_0/Q8_1/Q8_K, f16/bf16, f32) and
// run the SIMD dot kernels (kernels/cpu/matmul_quant.h); CpuOptions::exact_matmul dequantizes weight
// rows to f32 instead (kernels/cpu/ops.h matmul_dequant). Other activations are f32; the KV cache is
// f32, f16 or bf16.
#include <array>
#include <initializer_list>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/backend.h"
#include "engine/cpu/cpu_options.h"
#include "engine/cpu/kv_cache.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "kernels/cpu/dot.h"

namespace tern {

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
    DeviceKind device_kind() const override { return DeviceKind::cpu; }
    std::string device_name() const override { return "cpu"; }

    int n_logit_rows() const { return n_logit_rows_; }
    int n_threads() const { return n_threads_; }
    bool exact_matmul() const { return exact_matmul_; }

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
    bool exact_matmul_ = false;
    bool loaded_ = false;

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
    // y (n_cols, w.n_out) = W x (+ bias): the SIMD matmul, or matmul_dequant when exact_matmul_ or when
    // the weight format has no dot kernel.
    // Defined in backend_cpu_matmul.cpp.
    void project(const WeightRef& w, const std::vector<float>& bias, MatmulInput& in, float* y);
    // input_ = RMSNorm(x) * w for n rows of width `dim` (f32 at xn), with the quantized form that `reader`
    // consumes made in the same pass (kernels/cpu/gemm_input.h). Defined in backend_cpu_matmul.cpp.
    void norm_input(const float* x, const std::vector<float>& w, int64_t n, int64_t dim, float* xn, const WeightRef& reader);
    // At load: row-interleaved copies (quant/repack.h) of the projections whose format has a packed SIMD
    // kernel on this CPU, keyed by the weight's data pointer; the mapped pages of each packed tensor are
    // released (the file stays mapped), so resident memory stays about one copy of the weights.
    // Defined in backend_cpu_matmul.cpp.
    void pack_weights();
    // Packed bytes (new[] without value-initialisation: pages become resident only as they are written).
    std::unordered_map<const uint8_t*, std::unique_ptr<uint8_t[]>> packed_;
    // Projections that read the same input (q/k/v, gate/up) packed back to back as one matrix, keyed by the
    // first one's data pointer: one matmul streams all their rows, so decode pays one fork/join and one
    // prefetch ramp per group instead of one per matrix. Only for packed (not panel) formats whose parts
    // each fill whole 16-row groups, so every part starts on a group boundary.
    struct FusedGroup {
        GgmlType type = GgmlType::F32;
        int64_t n_in = 0, n_out = 0;       // n_out: the parts' rows together
        std::unique_ptr<uint8_t[]> data;
    };
    std::unordered_map<const uint8_t*, FusedGroup> fused_;
    std::vector<float> fused_out_;      // (n_cols, group n_out) before it is split into the parts
    // Packs w (rows [0, n_out)) into dst, releasing the mapped source pages slice by slice.
    void pack_matrix(const WeightRef& w, bool panels, uint8_t* dst);
    // ys[i] (n_cols, ws[i]->n_out) = W_i x (+ biases[i]) for projections sharing the input `in`: one matmul
    // over their fused copy when pack_weights made one, else one project() each. Same bits either way.
    void project_shared(std::initializer_list<const WeightRef*> ws, std::initializer_list<const std::vector<float>*> biases,
                        MatmulInput& in, std::initializer_list<float*> ys);
    // att (n, n_heads, head_dim_v) = attention of q (n, n_heads, head_dim) at positions pos0.. over layer
    // l's cache, which already holds those positions. Defined in backend_cpu_attention.cpp.
    void attend(int32_t l, int32_t pos0, int64_t n, const float* q, float* att);

    MatmulInput input_;

    KvCache kv_;
    std::vector<float> logits_; // (n_logit_rows, vocab) f32
    int n_logit_rows_ = 0;
};

} // namespace tern
