#pragma once
// The CUDA backend: the layer program (engine/layer_program.h) over steps on kernels of kernels/cuda, checked
// against the CPU backend (its reference). Weights are uploaded once in their GGUF formats; norms and
// biases as f32. Activations are f32 in device memory; the KV cache lives on the GPU in any KvType, paged
// and shared by sequences (engine/cuda/kv_cache_cuda.h): a forward may hold the tokens of several sequences
// (ForwardBatch::spans, the batching engine's steps), each token rotated at and attending to its own
// sequence's positions. A decode step copies back one token id (argmax on the device), the k
// sampling candidates of a row (top_logits, selected on the device) or, when the caller asks for logits,
// only the rows it asks for.
//
// The same source builds two ways (kernels/cuda/runtime.h): against the CUDA runtime for the binary,
// and against the CUDA emulator for the tests, where it runs on the CPU and is compared with the CPU
// backend (tests/cuda/test_cuda_backend.cpp).
#include <array>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/kv_cache_cuda.h"
#include "engine/layer_program.h"
#include "engine/model_config.h"
#include "engine/tensor_roles.h"
#include "engine/weights.h"

namespace tern {
inline namespace TERN_CUDA_ABI {

// Which GPU to use and how.
struct CudaOptions {
    int device = 0;       // CUDA device index (--device cuda:N)
    bool graphs = true;   // decode steps replay a captured CUDA graph (TERN_CUDA_GRAPHS=0 turns it off)
    // The projections multiply dequantized weights by f32 activations (the CPU's exact_matmul arithmetic)
    // instead of quantizing the activations to int8 for integer dot products (the default, as ggml and the
    // CPU backend do: decode's matmul_q8 and, from compute capability 8.0, prefill's tensor-core gemm_q8):
    // the tests' tight comparison with the CPU.
    bool exact_matmul = false;
    // The prefill GEMM (batches of kGemmMinColumns tokens or more, one sequence): `automatic` takes f16 tensor
    // cores for F16 and F8_E4M3 weights, the int8 tiles for the formats with int8 activations (from compute
    // capability 8.0), dequantized f32 and SGEMM for the rest and with exact_matmul. The others force a path
    // where the weight's format allows it (else automatic's choice): f16 (every format but F32 and BF16;
    // kernels/cuda/gemm_f16.h), int8 (kernels/cuda/gemm_q8.h), f32 (kernels/cuda/gemm.h). TERN_CUDA_PREFILL=
    // f16|int8|f32 sets it (engine/backend_factory.cpp), so a GPU run can time each path.
    enum class Prefill : uint8_t { automatic, f16, int8, f32 };
    Prefill prefill = Prefill::automatic;
    // The forward's kernels go out as programmatic dependent launches where the device has them (compute
    // capability 9.0+, kernels/cuda/dependent_launch.h): each may start while the one before it drains, and
    // a captured decode step keeps the relation as programmatic edges. TERN_CUDA_PDL=0 turns it off.
    bool programmatic_launches = true;
    // Decode's gated FFN launch writes its output's int8 form for the down projection too (matmul_q8_glu_q8:
    // one launch less a layer, the same bytes). TERN_CUDA_GLU_Q8=0 quantizes in a launch of its own instead.
    bool glu_writes_q8 = true;
    // Decode attention with the previous kernel and split rule (TERN_CUDA_ATTN=old), for timing; process-wide.
    bool old_decode_attention = false;
    // Prefill attention on f16 tensor cores where the shapes allow (kernels/cuda/attention_mma.h), or the f32
    // kernel throughout (TERN_CUDA_ATTN_PREFILL=f32: to time both, or to rule the tensor cores out).
    cuda::PrefillAttention prefill_attention = cuda::PrefillAttention::mma;
};

class CudaBackend final : public Backend {
public:
    explicit CudaBackend(const CudaOptions& options = {});
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    // GPU memory: weights (all of them, as stored), the KV cache and one batch's activations.
    MemoryNeed plan_memory(const ModelConfig& config, const ModelWeights& weights,
                           const MemoryRequest& request) const override;
    std::vector<MemoryLimit> memory_limits() const override;
    // Throws InputError for a weight format the CUDA kernels do not read (kernels/cuda/matmul.h).
    void load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) override;
    void forward(const ForwardBatch& batch) override;
    std::span<const float> logits(int row) override;
    void argmax(std::span<int32_t> per_row) override;
    // The candidates selected on the GPU (kernels/cuda/sampling.h): k pairs are copied back, not the row.
    size_t top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out) override;
    // Every kept row scanned on the device at the first request after a forward (kernels/cuda/elementwise.h
    // scan_rows): a word per row crosses to the host, not the row.
    FloatScan scan_logits(int row) override;
    int32_t n_past() const override { return kv_.n_past(); }
    void kv_truncate(int32_t n_past) override;
    KvSnapshot kv_save(int32_t n) const override;
    void kv_load(const KvSnapshot& snapshot) override;
    KvSnapshot kv_save_range(int32_t begin, int32_t end) const override;
    void kv_append(const KvSnapshot& range) override;
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
    DeviceKind device_kind() const override { return DeviceKind::cuda; }
    std::string device_name() const override { return "cuda:" + std::to_string(device_); }
    // The projection inputs are copied back to the host for the observer (calibration on the GPU).
    void set_observer(ForwardObserver* observer) override { observer_ = observer; }

    int n_logit_rows() const { return n_logit_rows_; }

private:
    // A weight as uploaded: its format and shape, and where its bytes are in weights_buffer_.
    struct DeviceWeight {
        GgmlType type = GgmlType::F32;
        int64_t n_in = 0, n_out = 0;
        const void* data = nullptr;   // null when the optional tensor is absent
    };
    // A layer's tensors on the device, by role (engine/tensor_roles.h): the matrices and expert stacks as
    // uploaded (a stack's n_out is one expert's rows; engine/cuda/backend_cuda_moe.cpp), the vectors and the
    // experts' bias rows as f32; absent ones empty / null.
    struct DeviceLayer {
        std::array<DeviceWeight, kLayerRoles> matrices{};
        std::array<const float*, kLayerRoles> vectors{};
        const DeviceWeight& operator[](LayerRole r) const { return matrices[static_cast<size_t>(r)]; }
        const float* vec(LayerRole r) const { return vectors[static_cast<size_t>(r)]; }
    };
    // The forward's steps (engine/layer_program.h) on this backend's kernels; one per forward. Defined in
    // backend_cuda.cpp.
    class Steps;

    void upload_weights(const ModelWeights& weights, int32_t n_ctx,
                        const std::function<void(uint64_t done, uint64_t total)>& on_upload);
    // y (n, w.n_out) = W x (+ bias) on the backend's stream. new_input false: x is the input of the
    // previous call (q/k/v, gate/up), whose int8 form is reused.
    void project(const DeviceWeight& w, const float* x, int64_t n, const float* bias, float* y,
                 bool new_input = true);
    // The decode projections (n < kGemmMinColumns) in fused launches (kernels/cuda/matmul.h), each bit for bit
    // the separate launches it replaces. project_outputs: y_i = W_i x + b_i for matrices that read one x (q, k
    // and v), or y_i += W_i x + b_i with `accumulate` (the residual add); one launch for each run of up to
    // three matrices of one format. project_glu: y = act(W_gate x + b_gate) * (W_up x + b_up) in one launch
    // when gate and up share a format, else two projections and the activation. Every projection of one call
    // reads x, which is quantized to int8 once for them.
    struct Projection {
        const DeviceWeight* w;
        const float* bias;
        float* y;
    };
    // new_input false: x came from norm_for, which already wrote its int8 form.
    void project_outputs(std::initializer_list<Projection> projections, const float* x, int64_t n, bool accumulate,
                         bool new_input = true);
    void project_glu(const DeviceLayer& d, const FfnRoles& roles, FfnActivation act, const float* x, int64_t n,
                     float* y, bool new_input = true);
    // gate = act(gate) * up, n elements: the gated activation after separate gate and up projections.
    void glu_activation(FfnActivation act, float* gate, const float* up, int64_t n);
    // xn = RMSNorm(x) * norm (n rows of reader.n_in), the input of projections of `reader`'s format. When
    // they take int8 activations, the norm's launch writes those too (rmsnorm_rows_q8) and q8_input finds
    // them: pass new_input false to the projections that read xn next.
    void norm_for(const float* x, const float* norm, float* xn, int64_t n, float eps, const DeviceWeight& reader);
    // project_glu's y also as int8 for the down projection (one launch less); false where the down projection
    // reads f32 or the kernel cannot (ffn width not whole 32-element blocks).
    bool glu_writes_q8(const DeviceLayer& d, const FfnRoles& roles, const float* y) const;
    unsigned* glu_counters(int64_t n, int64_t n_out);
    // Whether decode multiplies w by int8 activations (else by f32 ones), and x (n, n_in) in that form.
    bool uses_q8(const DeviceWeight& w) const;
    const void* q8_input(const float* x, int64_t n, int64_t n_in);
    // The prefill GEMM that multiplies w (CudaOptions::prefill), and x (n, n_in) as f16 for the f16 one.
    CudaOptions::Prefill prefill_path(const DeviceWeight& w) const;
    const uint16_t* f16_input(const float* x, int64_t n, int64_t n_in);
    // out (n, dim) = the routed experts' FFN of the normed input xn (a layer with LayerConfig::moe;
    // backend_cuda_moe.cpp).
    // new_input false: xn came from norm_for.
    // Refuses (DeviceCannotRun, one line) a mixture of experts this backend's forward does not run.
    void check_moe_runs(const ModelConfig& config, const ModelWeights& weights) const;
    void moe_ffn(const DeviceLayer& d, const float* xn, int64_t n, float* out, bool new_input);
    void moe_experts_by_slot(const DeviceLayer& d, const float* xn, int64_t n, const int32_t* ids, float* expert_out);
    void moe_experts_grouped(const DeviceLayer& d, const float* xn, int64_t n, const int32_t* ids, float* expert_out);
    // Rows of device memory copied back into observed_, for the observer.
    HostRows observed_rows(const float* x_device, int64_t n_rows, int64_t width);
    // A batch of several sequences as the kernels take it: each span's first position, and where every token
    // goes (uploaded by the KV cache), with the largest position.
    struct SequenceBatch {
        std::vector<int32_t> span_pos0;
        cuda::KvTokenMap map;
        int32_t max_pos = 0;
    };
    SequenceBatch prepare_sequences(std::span<const SequenceSpan> spans);
    // The forward's launches: the layer program over Steps. With `step` (device memory: the token, then its
    // position) the kernels read the token and position there, as a captured graph must. With `seqs` the
    // batch's spans are several sequences' (batch.spans).
    void forward_on_device(const ForwardBatch& batch, const int32_t* step = nullptr,
                           const SequenceBatch* seqs = nullptr);
    // A layer's rope as the kernels take it (the layer program's plan, the model's frequency factors).
    cuda::RopeParams rope_params(const RopePlan& plan) const;
    // One decode step through the captured graph, capturing it first when the step's launches differ
    // from the captured ones (another split of the attention, buffers moved by a larger batch).
    void forward_graph(const ForwardBatch& batch);
    bool graph_fits(const ForwardBatch& batch) const;
    std::vector<int64_t> graph_key(int32_t pos0);
    void reset_graph();
    void reserve_buffers(int64_t n, int64_t logit_rows);
    void finish_logits(int64_t rows);

    int device_ = 0;
    bool graphs_ = true;
    bool exact_ = false;
    CudaOptions::Prefill prefill_ = CudaOptions::Prefill::automatic;
    bool programmatic_ = false;   // CudaOptions::programmatic_launches on a device that has them
    bool glu_q8_ = true;          // CudaOptions::glu_writes_q8
    cuda::PrefillAttention prefill_attention_ = cuda::PrefillAttention::mma;
    bool int8_gemm_ = false;   // the device runs the int8 tensor-core prefill (kernels/cuda/gemm_q8.h)
    bool per_column_ = false;  // this forward's projections take the per-column kernels whatever n (forward_on_device)
    cudaStream_t stream_ = nullptr;
    // The decode step's graph, what it was captured for, and its per-step values on the device.
    cudaGraphExec_t graph_exec_ = nullptr;
    std::vector<int64_t> graph_key_;
    DeviceBuffer step_;   // int32 token, int32 position
    ModelConfig config_;
    DecoderProgram program_;
    bool loaded_ = false;
    ForwardObserver* observer_ = nullptr;

    DeviceBuffer weights_buffer_;   // every matrix, in its GGUF format, one allocation
    DeviceBuffer vectors_buffer_;   // norms, biases, rope factors as f32
    DeviceWeight token_embd_, output_;
    const float* output_norm_ = nullptr;
    const float* rope_freqs_ = nullptr;
    std::vector<DeviceLayer> layers_;

    CudaKvCache kv_;

    // One forward's activations, grown to the largest batch seen.
    DeviceScratch tokens_, x_, xn_, q_, k_, v_, att_, gate_, up_, out_, logits_, ids_;
    // Mixture of experts: a batch's router logits, expert ids and weights; the slots' expert outputs (n * k rows
    // of dim) and the prefill's inputs grouped by expert; the grouping's row lists (host and device).
    DeviceScratch moe_logits_, moe_ids_, moe_weights_, moe_out_, moe_grouped_, moe_rows_;
    std::vector<int32_t> moe_host_ids_, moe_host_rows_;
    DeviceScratch gemm_scratch_;   // a block of dequantized weight rows (the prefill path)
    DeviceScratch f16_acts_;       // a projection input as f16 (the f16 prefill path) ...
    const float* f16_of_ = nullptr;   // ... of this f32 input
    int64_t f16_n_ = 0, f16_width_ = 0;
    DeviceScratch q8_acts_;        // a projection input as int8 (kernels/cuda/matmul_q8.h) ...
    const float* q8_of_ = nullptr; // ... of this f32 input (n columns), at q8_at_: q8_acts_ or q8_ffn_
    int64_t q8_n_ = 0;
    const void* q8_at_ = nullptr;
    // The gated FFN's output as int8, written by its decode launch for the down projection (matmul_q8_glu_q8),
    // and that launch's group counters (zeroed when allocated; every launch leaves them zero).
    DeviceScratch q8_ffn_, glu_done_;
    DeviceBuffer row_ids_;         // 0, 1, 2, ... for the prefill path's dequantizer
    DeviceScratch top_logits_;     // top_logits: its candidates, penalty pairs and selection scratch
    int n_logit_rows_ = 0;
    // Host copies of logit rows, fetched on first request after each forward.
    std::vector<float> host_logits_;
    std::vector<bool> host_row_ready_;
    DeviceScratch row_flags_;               // scan_logits: each kept row's flags on the device
    std::vector<uint32_t> host_row_flags_;  // and on the host; empty until the first scan after a forward
    std::vector<float> observed_;   // a projection input copied back for the observer
};

} // namespace TERN_CUDA_ABI
} // namespace tern
