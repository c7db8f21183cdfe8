#include "engine/cuda/backend_cuda.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include "base/error.h"
#include "engine/load_errors.h"
#include "engine/memory_budget.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/dependent_launch.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemm_f16.h"
#include "kernels/cuda/gemm_q8.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_q8.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/sampling.h"
#include "quant/reference.h"

namespace tern {
inline namespace TERN_CUDA_ABI {
namespace {

// Scratch, the runtime's own context and the allocator's slack on the GPU.
constexpr uint64_t kFixedOverhead = 64ull << 20;
// Batches of this many tokens or more take a GEMM path (CudaOptions::prefill, prefill_path): f16 tensor cores
// (kernels/cuda/gemm_f16.h), the int8 tensor-core one (kernels/cuda/gemm_q8.h) where its formats and the device
// allow, else dequantized weights and cuBLAS (kernels/cuda/gemm.h), whose weight blocks take up to
// kGemmScratchBytes.
constexpr int64_t kGemmMinColumns = 16;
constexpr int64_t kGemmScratchBytes = 64ll << 20;
// The f16 prefill path's block of dequantized rows (F16 weights need none): small enough that the block the
// dequantizer writes is still in L2 (50 MB on an H100) when the GEMM reads it, large enough for whole-device
// GEMMs (2048 rows of 4096). A first guess that awaits tuning on a GPU; within kGemmScratchBytes, whose buffer
// it shares.
constexpr int64_t kGemmF16ScratchBytes = 16ll << 20;

uint64_t tensor_bytes(const WeightRef& w) {
    if (!w.present()) return 0;
    return static_cast<uint64_t>(w.row_size()) * static_cast<uint64_t>(std::max<int64_t>(w.n_out(), 1)) *
           static_cast<uint64_t>(std::max<int64_t>(w.n_mats, 1));   // every expert of a stack
}

// The matrices of a model, token_embd and the output included (once when tied): every role of
// engine/tensor_roles.h that a projection reads.
std::vector<const WeightRef*> matrices(const ModelWeights& w) {
    std::vector<const WeightRef*> m = {&w.token_embd, &w.output};
    for (const LayerWeights& l : w.layers)
        for (const LayerTensor& t : layer_tensors())
            if (is_matrix(t.kind)) m.push_back(&(l.*t.member));
    return m;
}

// The 1-D tensors the forward reads as f32, and the experts' bias stacks (one row per expert).
std::vector<const WeightRef*> vectors(const ModelWeights& w) {
    std::vector<const WeightRef*> v = {&w.output_norm, &w.rope_freqs, &w.rope_factors_long, &w.rope_factors_short};
    for (const LayerWeights& l : w.layers)
        for (const LayerTensor& t : layer_tensors())
            if (!is_matrix(t.kind)) v.push_back(&(l.*t.member));
    return v;
}

// Elements of one of those: every row of a bias stack.
int64_t vector_elems(const WeightRef& v) {
    return v.n_in() * std::max<int64_t>(v.n_out(), 1);
}

// f32 elements of one forward's activations per token (engine/cuda/backend_cuda.cpp forward), and the
// widths the scratch buffers are sized by.
// A mixture of experts' FFN runs k slots a token: its gate / up widths are k expert widths, and it adds the
// router's logits, ids and weights and two sets of k rows of dim (the slots' outputs, the grouped inputs).
struct ActivationWidths {
    int64_t q = 0, kv = 0, att = 0, ffn = 0;
    int64_t router = 0, slots = 0;   // floats per token: n_expert + 2 k, k * dim
};
ActivationWidths activation_widths(const ModelConfig& c) {
    ActivationWidths w;
    const int64_t k = c.moe() ? c.n_expert_used : 1;
    for (const LayerConfig& l : c.layers) {
        w.q = std::max<int64_t>(w.q, static_cast<int64_t>(l.n_heads) * c.head_dim);
        w.kv = std::max<int64_t>(w.kv, static_cast<int64_t>(l.n_kv_heads) * std::max(c.head_dim, c.head_dim_v));
        w.att = std::max<int64_t>(w.att, static_cast<int64_t>(l.n_heads) * c.head_dim_v);
        w.ffn = std::max<int64_t>(w.ffn, (l.moe ? k : 1) * l.ffn_dim);
        if (l.moe) w.ffn = std::max<int64_t>(w.ffn, c.expert_shared_ffn_dim);   // the shared experts' FFN
    }
    if (c.moe()) {
        w.router = c.n_expert + 2 * k;
        w.slots = k * c.dim;
    }
    return w;
}

} // namespace

CudaBackend::CudaBackend(const CudaOptions& options)
    : device_(options.device), graphs_(options.graphs), exact_(options.exact_matmul), prefill_(options.prefill),
      glu_q8_(options.glu_writes_q8), prefill_attention_(options.prefill_attention) {
    cuda_call(cudaSetDevice(device_), "selecting the GPU");
    cuda::set_old_decode_attention(options.old_decode_attention);
    int8_gemm_ = cuda::gemm_q8_device_supported(device_);
    programmatic_ = options.programmatic_launches && cuda::programmatic_launch_supported(device_);
    cuda_call(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    step_ = DeviceBuffer(2 * sizeof(int32_t), "the decode step's values");
}

CudaBackend::~CudaBackend() {
    reset_graph();
    if (stream_) {
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
    }
}

MemoryNeed CudaBackend::plan_memory(const ModelConfig& c, const ModelWeights& w, const MemoryRequest& r) const {
    MemoryNeed need;
    std::set<const uint8_t*> seen;
    for (const WeightRef* m : matrices(w))
        if (m->present() && seen.insert(m->data).second) need.weights += tensor_bytes(*m);
    for (const WeightRef* v : vectors(w))
        if (v->present()) need.weights += 4ull * static_cast<uint64_t>(vector_elems(*v));
    need.copies = need.weights;   // all of it is copied to the GPU
    need.kv = kv_cache_bytes(c, r.kv_type, std::max(r.kv_pool_positions, r.n_ctx));   // the pool's pages
    const ActivationWidths aw = activation_widths(c);
    const uint64_t per_token =
        4ull * static_cast<uint64_t>(3 * c.dim + aw.q + 2 * aw.kv + aw.att + 2 * aw.ffn + aw.router + 2 * aw.slots) + 4 +
        static_cast<uint64_t>(cuda::q8_column_bytes(std::max<int64_t>({c.dim, aw.att, aw.ffn, aw.slots}))) +
        2ull * static_cast<uint64_t>(std::max<int64_t>({c.dim, aw.att, aw.ffn, aw.slots})) +   // f16 activations
        static_cast<uint64_t>(cuda::q8_column_bytes(aw.ffn) + aw.ffn / 8);   // the gated FFN's int8 output, counters
    const uint64_t batch = static_cast<uint64_t>(std::max(1, std::min(r.n_batch, std::max(r.n_ctx, 1))));
    const uint64_t logit_rows = static_cast<uint64_t>(std::max(1, r.n_logit_rows));
    need.buffers = batch * per_token + logit_rows * 4ull * static_cast<uint64_t>(c.vocab) + kFixedOverhead +
                   static_cast<uint64_t>(kGemmScratchBytes) + 4ull * static_cast<uint64_t>(c.vocab);
    return need;
}

std::vector<MemoryLimit> CudaBackend::memory_limits() const {
    size_t free_bytes = 0, total_bytes = 0;
    cuda_call(cudaMemGetInfo(&free_bytes, &total_bytes), "asking the GPU's free memory");
    MemoryLimit limit;
    limit.available = free_bytes;
    limit.source = "free memory of " + device_name() + " (cudaMemGetInfo)";
    limit.counts = MemoryLimit::Counts::resident;
    return {limit};
}

void CudaBackend::upload_weights(const ModelWeights& w, int32_t n_ctx,
                                 const std::function<void(uint64_t done, uint64_t total)>& on_upload) {
    // Every distinct matrix once (a tied output is token_embd itself), at 256-byte offsets, in the order
    // the model lists them.
    struct Placed {
        const WeightRef* ref;
        uint64_t offset;
    };
    std::vector<Placed> placed;
    std::map<const uint8_t*, uint64_t> offsets;
    uint64_t total = 0, bytes = 0;
    for (const WeightRef* m : matrices(w)) {
        if (!m->present() || offsets.count(m->data)) continue;
        if (!cuda::matmul_supports(m->type))
            throw DeviceCannotRun(device_name(), "tensor " + m->name + " is " + std::string(type_name(m->type)) +
                                                     ", a format its kernels do not read");
        offsets[m->data] = total;
        placed.push_back({m, total});
        total += (tensor_bytes(*m) + 255) / 256 * 256;
        bytes += tensor_bytes(*m);
    }
    weights_buffer_ = DeviceBuffer(total, "the model's weights");
    uint64_t done = 0;
    for (const Placed& p : placed) {
        cuda_call(cudaMemcpyAsync(weights_buffer_.bytes() + p.offset, p.ref->data, tensor_bytes(*p.ref),
                                  cudaMemcpyHostToDevice, stream_),
                  "uploading the weights");
        done += tensor_bytes(*p.ref);
        if (on_upload) {   // a pageable copy returns once staged: the bar follows the copies
            cuda_call(cudaStreamSynchronize(stream_), "uploading the weights");
            on_upload(done, bytes);
        }
    }
    auto device_weight = [&](const WeightRef& m) {
        DeviceWeight d;
        if (!m.present()) return d;
        d.type = m.type;
        d.n_in = m.n_in();
        d.n_out = m.n_out();
        d.data = weights_buffer_.bytes() + offsets.at(m.data);
        return d;
    };

    // The vectors, dequantized to f32 on the host, in one buffer.
    std::vector<float> host_vectors;
    std::map<const WeightRef*, size_t> vector_offsets;
    for (const WeightRef* v : vectors(w)) {
        if (!v->present()) continue;
        vector_offsets[v] = host_vectors.size();
        const size_t n = static_cast<size_t>(vector_elems(*v));
        host_vectors.resize(host_vectors.size() + (n + 63) / 64 * 64);
        dequantize_row(v->type, v->data, host_vectors.data() + vector_offsets[v], vector_elems(*v));
    }
    vectors_buffer_ = DeviceBuffer(host_vectors.size() * sizeof(float), "norm weights and biases");
    cuda_call(cudaMemcpyAsync(vectors_buffer_.get(), host_vectors.data(), host_vectors.size() * sizeof(float),
                              cudaMemcpyHostToDevice, stream_),
              "uploading norm weights and biases");
    auto device_vector = [&](const WeightRef& v) -> const float* {
        if (!v.present()) return nullptr;
        return vectors_buffer_.as<float>() + vector_offsets.at(&v);
    };

    token_embd_ = device_weight(w.token_embd);
    output_ = device_weight(w.output);
    output_norm_ = device_vector(w.output_norm);
    rope_freqs_ = device_vector(rope_factors_for(w, config_, n_ctx));
    layers_.assign(w.layers.size(), {});
    for (size_t l = 0; l < w.layers.size(); ++l)
        for (const LayerTensor& t : layer_tensors()) {
            const WeightRef& ref = w.layers[l].*t.member;
            const auto r = static_cast<size_t>(t.role);
            if (is_matrix(t.kind))
                layers_[l].matrices[r] = device_weight(ref);
            else
                layers_[l].vectors[r] = device_vector(ref);
        }
    // 0 .. n-1 for the GEMM path's dequantizer (the widest matrix's rows).
    int64_t widest = 0;
    for (const WeightRef* m : matrices(w))
        if (m->present()) widest = std::max(widest, m->n_out());
    std::vector<int32_t> ids(static_cast<size_t>(widest));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    row_ids_ = DeviceBuffer(ids.size() * sizeof(int32_t), "row indices");
    cuda_call(cudaMemcpyAsync(row_ids_.get(), ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "uploading row indices");
    // The host vectors go out of scope: wait for their copies.
    cuda_call(cudaStreamSynchronize(stream_), "uploading the weights");
}

void CudaBackend::load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) {
    if (options.n_ctx <= 0) throw UsageError("context size must be positive, got " + std::to_string(options.n_ctx));
    loaded_ = false;
    reset_graph();
    if (config.moe()) check_moe_runs(config, weights);
    // gemma4's layer features have no CUDA steps yet: refused whole, before anything is uploaded.
    if (config.per_layer_dim > 0 || config.shares_kv() || config.v_norm || !config.uniform_head_dims())
        throw DeviceCannotRun(device_name(), "gemma4's layers (per-layer token embeddings, KV shared between layers, "
                                             "per-layer head sizes, V norm) run on the CPU only for now");
    // Shapes the kernels cannot run are refused before anything is uploaded: the block KV formats' head
    // dims (worded with the flag by the app), then what the attention kernel takes (head dims, group size).
    require_kv_head_dims(options.kv_type, config.head_dim, config.head_dim_v);
    for (const LayerConfig& lc : config.layers) {
        cuda::KvLayer shape;
        shape.type = options.kv_type;
        shape.n_kv_heads = lc.n_kv_heads;
        shape.head_dim = config.head_dim;
        shape.head_dim_v = config.head_dim_v;
        shape.n_ctx = options.n_ctx;
        try {
            cuda::attention_plan(shape, 1, lc.n_heads, 0, lc.sliding_window);
        } catch (const std::invalid_argument& e) {
            throw DeviceCannotRun(device_name(), e.what());
        }
    }
    config_ = config;
    program_ = decoder_program(config, options.first_layer);
    weights_buffer_.reset();
    vectors_buffer_.reset();
    upload_weights(weights, options.n_ctx, options.on_upload);
    std::vector<int32_t> n_kv_heads;
    for (const LayerConfig& lc : config.layers)
        n_kv_heads.push_back(lc.n_kv_heads);
    const int32_t pool = std::max(options.kv_pool_positions, options.n_ctx);
    kv_.init(options.kv_type, n_kv_heads, config.head_dim, config.head_dim_v, options.n_ctx,
             static_cast<int32_t>(kv_pages_for(pool)), stream_);
    n_logit_rows_ = 0;
    loaded_ = true;
}

void CudaBackend::project(const DeviceWeight& w, const float* x, int64_t n, const float* bias, float* y,
                          bool new_input) {
    if (new_input) q8_of_ = f16_of_ = nullptr;
    if (n < kGemmMinColumns || per_column_) {   // decode, draft verification: one pass over the weights per 8 columns
        if (uses_q8(w)) {
            cuda::matmul_q8(w.type, w.data, w.n_in, w.n_out, q8_input(x, n, w.n_in), n, bias, y, stream_);
            return;
        }
        cuda::matmul(w.type, w.data, w.n_in, w.n_out, x, n, bias, y, stream_);
        return;
    }
    switch (prefill_path(w)) {
    case CudaOptions::Prefill::int8:   // integer tensor-core tiles that read the weights once per 64 tokens
        cuda::gemm_q8(w.type, w.data, w.n_in, w.n_out, q8_input(x, n, w.n_in), n, bias, y, stream_);
        return;
    case CudaOptions::Prefill::f16: {   // f16 weights and activations on tensor cores, f32 sums
        const int64_t halves = std::max<int64_t>(w.n_in, kGemmF16ScratchBytes / 2);
        auto* scratch = static_cast<uint16_t*>(
            gemm_scratch_.reserve(static_cast<size_t>(halves) * sizeof(uint16_t), "dequantized weights"));
        cuda::matmul_gemm_f16(w.type, w.data, w.n_in, w.n_out, f16_input(x, n, w.n_in), n, bias, y, scratch, halves,
                              stream_);
        return;
    }
    default: {   // the weights dequantized block by block into f32 and multiplied by cuBLAS
        const int64_t floats = std::max<int64_t>(w.n_in, kGemmScratchBytes / 4);
        cuda::matmul_gemm(w.type, w.data, w.n_in, w.n_out, x, n, bias, y, row_ids_.as<int32_t>(),
                          gemm_scratch_.floats(static_cast<size_t>(floats), "dequantized weights"), floats, stream_);
        return;
    }
    }
}

CudaOptions::Prefill CudaBackend::prefill_path(const DeviceWeight& w) const {
    using P = CudaOptions::Prefill;
    const bool f16 = cuda::gemm_f16_supports(w.type), int8 = uses_q8(w) && int8_gemm_;
    if (prefill_ == P::f32 || (prefill_ == P::f16 && f16) || (prefill_ == P::int8 && int8)) return prefill_;
    if (exact_) return P::f32;
    if (f16 && (w.type == GgmlType::F16 || w.type == GgmlType::F8_E4M3)) return P::f16;
    return int8 ? P::int8 : P::f32;
}

bool CudaBackend::uses_q8(const DeviceWeight& w) const {
    return !exact_ && cuda::matmul_q8_supports(w.type) && w.n_in % cuda::kQ8ActBlock == 0;
}

// Integer dot products: the input quantized to int8 once for every projection that reads it.
const void* CudaBackend::q8_input(const float* x, int64_t n, int64_t n_in) {
    if (q8_of_ != x || q8_n_ != n) {
        void* acts = q8_acts_.reserve(cuda::quantized_activation_bytes(n, n_in), "quantized activations");
        cuda::quantize_activations(x, n, n_in, acts, stream_);
        q8_of_ = x;
        q8_n_ = n;
        q8_at_ = acts;
    }
    return q8_at_;
}

// f16 tensor cores: the input converted once for every projection that reads it.
const uint16_t* CudaBackend::f16_input(const float* x, int64_t n, int64_t n_in) {
    if (f16_of_ != x || f16_n_ != n || f16_width_ != n_in) {
        void* acts = f16_acts_.reserve(static_cast<size_t>(n * n_in) * sizeof(uint16_t), "f16 activations");
        cuda::convert_to_f16(x, n * n_in, static_cast<uint16_t*>(acts), stream_);
        f16_of_ = x;
        f16_n_ = n;
        f16_width_ = n_in;
    }
    return static_cast<const uint16_t*>(f16_acts_.data());
}

void CudaBackend::norm_for(const float* x, const float* norm, float* xn, int64_t n, float eps,
                           const DeviceWeight& reader) {
    const int64_t width = reader.n_in;
    if (uses_q8(reader)) {
        void* acts = q8_acts_.reserve(cuda::quantized_activation_bytes(n, width), "quantized activations");
        if (cuda::rmsnorm_rows_q8_takes(x, norm, xn, acts, width)) {
            cuda::rmsnorm_rows_q8(x, norm, xn, n, width, eps, acts, stream_);
            q8_of_ = xn;
            q8_n_ = n;
            q8_at_ = acts;
            return;
        }
    }
    cuda::rmsnorm_rows(x, norm, xn, n, width, eps, stream_);
    q8_of_ = nullptr;
}

void CudaBackend::project_outputs(std::initializer_list<Projection> projections, const float* x, int64_t n,
                                  bool accumulate, bool new_input) {
    if (new_input) q8_of_ = nullptr;
    const Projection* p = projections.begin();
    const auto count = static_cast<int>(projections.size());
    for (int first = 0; first < count;) {
        const DeviceWeight& w = *p[first].w;
        int end = first + 1;
        while (end < count && end - first < cuda::kMaxMatmulOutputs && p[end].w->type == w.type) ++end;
        cuda::MatmulOutput outputs[cuda::kMaxMatmulOutputs];
        for (int i = first; i < end; ++i) outputs[i - first] = {p[i].w->data, p[i].w->n_out, p[i].bias, p[i].y};
        if (uses_q8(w))
            cuda::matmul_q8_outputs(w.type, w.n_in, outputs, end - first, q8_input(x, n, w.n_in), n, accumulate,
                                    stream_);
        else
            cuda::matmul_outputs(w.type, w.n_in, outputs, end - first, x, n, accumulate, stream_);
        first = end;
    }
}

void CudaBackend::project_glu(const DeviceLayer& d, const FfnRoles& roles, FfnActivation act, const float* x,
                              int64_t n, float* y, bool new_input) {
    const DeviceWeight &gate = d[roles.gate], &up = d[roles.up];
    const float* b_gate = roles.biases ? d.vec(LayerRole::b_gate) : nullptr;
    const float* b_up = roles.biases ? d.vec(LayerRole::b_up) : nullptr;
    if (gate.type != up.type) {   // a mixed quantization: the two projections apart, then the activation
        float* u = up_.floats(static_cast<size_t>(n * up.n_out), "activations");
        project(gate, x, n, b_gate, y, new_input);
        project(up, x, n, b_up, u, false);
        glu_activation(act, y, u, n * gate.n_out);
        return;
    }
    if (new_input) q8_of_ = nullptr;
    const cuda::GluActivation a = act == FfnActivation::silu        ? cuda::GluActivation::silu
                                  : act == FfnActivation::gelu_tanh ? cuda::GluActivation::gelu_tanh
                                                                    : cuda::GluActivation::swiglu_oai;
    if (uses_q8(gate) && glu_writes_q8(d, roles, y)) {   // y's int8 form for the down projection in the same launch
        const void* x_q = q8_input(x, n, gate.n_in);
        void* y_q = q8_ffn_.reserve(cuda::quantized_activation_bytes(n, gate.n_out), "quantized activations");
        cuda::matmul_q8_glu_q8(gate.type, gate.n_in, gate.n_out, gate.data, b_gate, up.data, b_up, a, x_q, n, y,
                               y_q, glu_counters(n, gate.n_out), stream_);
        q8_of_ = y;
        q8_n_ = n;
        q8_at_ = y_q;
        return;
    }
    if (uses_q8(gate))
        cuda::matmul_q8_glu(gate.type, gate.n_in, gate.n_out, gate.data, b_gate, up.data, b_up, a,
                            q8_input(x, n, gate.n_in), n, y, stream_);
    else
        cuda::matmul_glu(gate.type, gate.n_in, gate.n_out, gate.data, b_gate, up.data, b_up, a, x, n, y, stream_);
    if (q8_of_ == y) q8_of_ = nullptr;   // y was rewritten
}

// matmul_q8_glu_q8's counters for n columns of n_out outputs: zeroed when allocated (outside a graph's capture:
// reserve_buffers asks first), and every launch leaves them zero.
unsigned* CudaBackend::glu_counters(int64_t n, int64_t n_out) {
    const size_t bytes = cuda::matmul_q8_glu_q8_counters(n, n_out) * sizeof(unsigned);
    if (glu_done_.size() < bytes) {
        glu_done_.reserve(bytes, "the gated FFN's group counters");
        cuda_call(cudaMemsetAsync(glu_done_.data(), 0, glu_done_.size(), stream_), "zeroing the group counters");
    }
    return static_cast<unsigned*>(glu_done_.data());
}

bool CudaBackend::glu_writes_q8(const DeviceLayer& d, const FfnRoles& roles, const float* y) const {
    const DeviceWeight &gate = d[roles.gate], &down = d[roles.down];
    return glu_q8_ && uses_q8(down) && down.n_in == gate.n_out && cuda::matmul_q8_glu_q8_takes(gate.n_out, y, q8_ffn_.data());
}

void CudaBackend::glu_activation(FfnActivation act, float* gate, const float* up, int64_t n) {
    switch (act) {
    case FfnActivation::silu: cuda::swiglu(gate, up, gate, n, stream_); return;
    case FfnActivation::gelu_tanh: cuda::geglu_tanh(gate, up, gate, n, stream_); return;
    case FfnActivation::swiglu_oai: cuda::swiglu_oai(gate, up, gate, n, stream_); return;
    }
}

HostRows CudaBackend::observed_rows(const float* x_device, int64_t n_rows, int64_t width) {
    observed_.resize(static_cast<size_t>(n_rows * width));
    cuda_call(cudaMemcpyAsync(observed_.data(), x_device, observed_.size() * sizeof(float), cudaMemcpyDeviceToHost,
                              stream_),
              "copying a projection input for the observer");
    cuda_call(cudaStreamSynchronize(stream_), "copying a projection input for the observer");
    return {observed_.data(), n_rows, width};
}

cuda::RopeParams CudaBackend::rope_params(const RopePlan& plan) const {
    cuda::RopeParams rope;
    rope.neox = plan.neox;
    rope.n_rot = plan.n_rot;
    rope.base = plan.base;
    rope.freq_scale = plan.freq_scale;
    rope.freq_factors = rope_freqs_;
    rope.yarn_ext_factor = plan.yarn_ext_factor;
    rope.yarn_corr_low = plan.yarn_corr_low;
    rope.yarn_corr_high = plan.yarn_corr_high;
    rope.mscale = plan.mscale;
    rope.q_temp_scale = config_.attn_temp_scale;
    rope.q_temp_floor = config_.attn_temp_floor;
    return rope;
}

void CudaBackend::forward(const ForwardBatch& batch) {
    if (!loaded_) throw UsageError("forward: the backend has no model loaded");
    check_forward_batch(batch, kv_.n_past(), kv_.n_ctx(), config_.vocab,
                        [this](int32_t seq) { return kv_.n_past(seq); });
    try {
        if (!batch.spans.empty()) {
            const SequenceBatch seqs = prepare_sequences(batch.spans);
            forward_on_device(batch, nullptr, &seqs);
            for (size_t s = 0; s < batch.spans.size(); ++s)
                kv_.set_n_past(seqs.span_pos0[s] + batch.spans[s].n_tokens, batch.spans[s].seq);
            return;
        }
        const auto n = static_cast<int32_t>(batch.tokens.size());
        kv_.reserve(batch.pos0 + n);   // sequence 0's pages for the batch, shared ones copied first
        kv_.sync_pages();
        if (graph_fits(batch))
            forward_graph(batch);
        else
            forward_on_device(batch);
        kv_.set_n_past(batch.pos0 + n);
    } catch (const cuda::Error& e) {
        throw RuntimeFailure(std::string("cuda: ") + e.what());
    } catch (const std::invalid_argument& e) {   // a launcher's refusal: load() lets no known shape through
        throw RuntimeFailure(std::string("cuda: ") + e.what());
    }
}

// Each span's pages mapped (shared ones copied), then the token map on the device. The pool may lack pages
// for a later span after earlier ones were mapped: those keep them (their positions are not yet valid).
CudaBackend::SequenceBatch CudaBackend::prepare_sequences(std::span<const SequenceSpan> spans) {
    SequenceBatch b;
    for (const SequenceSpan& s : spans) {
        const int32_t past = kv_.n_past(s.seq);
        kv_.reserve(past + s.n_tokens, s.seq);
        b.span_pos0.push_back(past);
        b.max_pos = std::max(b.max_pos, past + s.n_tokens - 1);
    }
    b.map = kv_.map_tokens(spans, b.span_pos0);
    return b;
}

bool CudaBackend::graph_fits(const ForwardBatch& batch) const {
    // One token, its logits kept, nothing copied back in the middle (observer), a whole model.
    return graphs_ && batch.tokens.size() == 1 && batch.wanted == LogitsWanted::last && !observer_ &&
           token_embd_.data && output_.data;
}

void CudaBackend::reset_graph() {
    if (graph_exec_) cudaGraphExecDestroy(graph_exec_);
    graph_exec_ = nullptr;
    graph_key_.clear();
}

// What a captured step depends on besides the values in step_: each layer's attention split (which
// grows with the position) and the addresses of the buffers it reads and writes.
std::vector<int64_t> CudaBackend::graph_key(int32_t pos0) {
    std::vector<int64_t> key;
    for (int32_t l = 0; l < config_.n_layers; ++l) {
        const LayerConfig& lc = config_.layers[static_cast<size_t>(l)];
        key.push_back(cuda::attention_plan(kv_.layer(l), 1, lc.n_heads, pos0, lc.sliding_window).splits);
    }
    for (const DeviceScratch* b : {&tokens_, &x_, &xn_, &q_, &k_, &v_, &att_, &gate_, &up_, &out_, &logits_, &q8_acts_,
                                   &q8_ffn_, &glu_done_, &moe_logits_, &moe_ids_, &moe_weights_, &moe_out_})
        key.push_back(static_cast<int64_t>(reinterpret_cast<intptr_t>(b->data())));
    return key;
}

void CudaBackend::forward_graph(const ForwardBatch& batch) {
    const int32_t values[2] = {batch.tokens[0], batch.pos0};
    cuda_call(cudaMemcpyAsync(step_.get(), values, sizeof values, cudaMemcpyHostToDevice, stream_),
              "copying the decode step's values");
    reserve_buffers(1, 1);   // before the key: a first step allocates them
    std::vector<int64_t> key = graph_key(batch.pos0);
    if (!graph_exec_ || key != graph_key_) {
        reset_graph();
        // Global mode: an allocation or a free while capturing fails instead of leaving captured launches
        // pointing at memory that is gone at replay (every buffer the step uses is reserved above).
        cuda_call(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeGlobal), "capturing the decode step");
        cudaGraph_t graph = nullptr;
        try {
            forward_on_device(batch, step_.as<int32_t>());
        } catch (...) {
            cudaStreamEndCapture(stream_, &graph);
            if (graph) cudaGraphDestroy(graph);
            throw;
        }
        cuda_call(cudaStreamEndCapture(stream_, &graph), "capturing the decode step");
        const cudaError_t e = cudaGraphInstantiate(&graph_exec_, graph, 0);
        cudaGraphDestroy(graph);
        cuda_call(e, "instantiating the decode step's graph");
        graph_key_ = std::move(key);
    }
    cuda_call(cudaGraphLaunch(graph_exec_, stream_), "replaying the decode step");
    finish_logits(1);
}

// The activations of an n-token batch keeping logit_rows rows of logits (grown, never shrunk).
void CudaBackend::reserve_buffers(int64_t n, int64_t logit_rows) {
    const ModelConfig& c = config_;
    const ActivationWidths aw = activation_widths(c);
    const auto un = static_cast<size_t>(n), dim = static_cast<size_t>(c.dim);
    tokens_.reserve(un * sizeof(int32_t), "the batch's tokens");
    x_.floats(un * dim, "activations");
    xn_.floats(un * dim, "activations");
    out_.floats(un * dim, "activations");
    q_.floats(un * static_cast<size_t>(aw.q), "activations");
    k_.floats(un * static_cast<size_t>(aw.kv), "activations");
    v_.floats(un * static_cast<size_t>(aw.kv), "activations");
    att_.floats(un * static_cast<size_t>(aw.att), "activations");
    gate_.floats(un * static_cast<size_t>(aw.ffn), "activations");
    up_.floats(un * static_cast<size_t>(aw.ffn), "activations");
    logits_.floats(static_cast<size_t>(logit_rows) * static_cast<size_t>(c.vocab), "logits");
    if (c.moe()) {
        const auto slots = un * static_cast<size_t>(c.n_expert_used);
        moe_logits_.floats(un * static_cast<size_t>(c.n_expert), "router logits");
        moe_ids_.reserve(slots * sizeof(int32_t), "expert ids");
        moe_weights_.floats(slots, "expert weights");
        moe_out_.floats(slots * dim, "expert outputs");
    }
    // Every projection's int8 input fits from the start: a buffer replaced in the middle of a captured
    // step would leave the step's earlier launches pointing at freed memory.
    if (n < kGemmMinColumns || (int8_gemm_ && !exact_))
        q8_acts_.reserve(cuda::quantized_activation_bytes(n, std::max<int64_t>({c.dim, aw.att, aw.ffn, aw.slots})),
                         "quantized activations");
    // The gated FFN's int8 output and counters, where a dense FFN or shared experts run.
    const bool gated_ffn = !c.moe() || c.n_dense_lead > 0 || c.n_expert_shared > 0;
    if (n < kGemmMinColumns && !exact_ && glu_q8_ && gated_ffn) {
        q8_ffn_.reserve(cuda::quantized_activation_bytes(n, aw.ffn), "quantized activations");
        glu_counters(n, aw.ffn);
    }
}

// The host's view after a forward: logit rows not yet copied back.
void CudaBackend::finish_logits(int64_t rows) {
    n_logit_rows_ = static_cast<int>(rows);
    host_logits_.resize(static_cast<size_t>(rows) * static_cast<size_t>(config_.vocab));
    host_row_ready_.assign(static_cast<size_t>(rows), false);
    host_row_flags_.clear();
}

// One forward's launches: the layer program's steps on kernels/cuda, over the activations of reserve_buffers.
//
// Decode and draft verification take the fused launches (kernels/cuda/matmul.h, attention.h), bit for bit
// the separate ones; a prefill batch takes the GEMM path with separate kernels. Launches per decode layer
// with int8 activations, one matrix format per layer, attention in one launch: 19 separate, fused 9 (llama,
// qwen: norm + q8, q/k/v, rope + KV write, attention, q8, o + residual, norm + q8, gate/up + act + q8, down
// + residual) / 11 (gemma, whose post-norms keep the residual adds); test_cuda_backend pins them. With
// programmatic launches (kernels/cuda/dependent_launch.h) each may start while the one before it drains.
    //
// Batch invariance of a batch of several sequences (the batching engine's steps): a sequence's bits must
// not depend on what else shares its forward, so no choice may depend on the batch's size. The rule:
// such a batch takes the decode path whatever its size (per_column_: every projection, lm_head included,
// on the per-column kernels of kernels/cuda/matmul.h / matmul_q8.h, whose column sums are the same bits in
// a pass of 1 or of 8 columns and in any pass: the warp's reduction tree is the same for every column
// count, and the int8 activations are quantized column by column), never the int8 tensor-core GEMM or
// cuBLAS, whose tiles round differently; and attention_tokens, whose work per token depends on its own
// position only (kernels/cuda/attention.h). The row-wise kernels (norms, residual adds, activations,
// embedding, rope and the KV write) treat each token alone. A long prompt then costs one pass over the
// weights per 8 of its tokens: the price of tokens that do not change with the batch.
class CudaBackend::Steps final : public DecoderSteps {
public:
    Steps(CudaBackend& b, const ForwardBatch& batch, const int32_t* step, const SequenceBatch* seqs)
        : b_(b), c_(b.config_), batch_(batch), seqs_(seqs), step_(step), programmatic_(b.programmatic_) {
        n_ = static_cast<int64_t>(batch.tokens.size());
        decode_ = n_ < kGemmMinColumns || seqs;
        b_.per_column_ = seqs != nullptr;
        int64_t kept = 0;   // the logit rows the layer program's final_norm will keep
        for (const RowRun& r : kept_rows(batch)) kept += r.count;
        b_.reserve_buffers(n_, kept);
        const ActivationWidths aw = activation_widths(c_);
        const auto un = static_cast<size_t>(n_);
        pos0_device_ = step ? step + 1 : nullptr;   // a graph reads the position there
        tokens_ = step ? const_cast<int32_t*>(step) : static_cast<int32_t*>(b_.tokens_.reserve(0, ""));
        x_ = b_.x_.floats(un * static_cast<size_t>(c_.dim), "activations");       // (n, dim) residual stream
        xn_ = b_.xn_.floats(un * static_cast<size_t>(c_.dim), "activations");     // (n, dim) a block's input
        out_ = b_.out_.floats(un * static_cast<size_t>(c_.dim), "activations");   // (n, dim) a block's output
        q_ = b_.q_.floats(un * static_cast<size_t>(aw.q), "activations");
        k_ = b_.k_.floats(un * static_cast<size_t>(aw.kv), "activations");
        v_ = b_.v_.floats(un * static_cast<size_t>(aw.kv), "activations");
        att_ = b_.att_.floats(un * static_cast<size_t>(aw.att), "activations");
        gate_ = b_.gate_.floats(un * static_cast<size_t>(aw.ffn), "activations");
        up_ = b_.up_.floats(un * static_cast<size_t>(aw.ffn), "activations");
        if (!step)
            cuda_call(cudaMemcpyAsync(tokens_, batch.tokens.data(), un * sizeof(int32_t), cudaMemcpyHostToDevice,
                                      b_.stream_),
                      "copying the batch's tokens");
    }

    bool has_embedding() const override { return b_.token_embd_.data != nullptr; }
    bool has_output() const override { return b_.output_.data != nullptr; }

    void embed(float scale) override {
        cuda::embed_rows(b_.token_embd_.type, b_.token_embd_.data, c_.dim, tokens_, n_, scale, x_, b_.stream_);
    }

    void stream_in() override {
        cuda_call(cudaMemcpyAsync(x_, batch_.hidden_in, rows_bytes(n_), cudaMemcpyHostToDevice, b_.stream_),
                  "copying the hidden state to the GPU");
    }

    // Decode norms and quantizes the block's input in one launch.
    void block_input(int32_t l, const BlockInput& in) override {
        const DeviceLayer& d = layer(l);
        if (!in.norm) {   // the block reads the stream itself: its int8 form is made by the first projection
            cuda_call(cudaMemcpyAsync(xn_, x_, rows_bytes(n_), cudaMemcpyDeviceToDevice, b_.stream_),
                      "copying a block's input");
            b_.q8_of_ = nullptr;
            return;
        }
        if (decode_)
            b_.norm_for(x_, d.vec(in.weight), xn_, n_, c_.rms_eps, d[in.reader]);
        else
            cuda::rmsnorm_rows(x_, d.vec(in.weight), xn_, n_, c_.dim, c_.rms_eps, b_.stream_);
    }

    // q/k/v projections (+ biases), q/k norm and RoPE, the KV write.
    void attention_qkv(int32_t l, const AttentionPlan& plan) override {
        const LayerConfig& lc = c_.layers[static_cast<size_t>(l)];
        const DeviceLayer& d = layer(l);
        const cuda::RopeParams rope = b_.rope_params(plan.rope);
        const bool per_head = plan.qk_norm && !plan.qk_norm_whole;
        const float* q_norm = per_head ? d.vec(LayerRole::q_norm) : nullptr;
        const float* k_norm = per_head ? d.vec(LayerRole::k_norm) : nullptr;
        const DeviceWeight &wq = d[LayerRole::wq], &wk = d[LayerRole::wk], &wv = d[LayerRole::wv];
        const float *bq = d.vec(LayerRole::bq), *bk = d.vec(LayerRole::bk), *bv = d.vec(LayerRole::bv);
        if (decode_)   // q, k and v in one launch
            b_.project_outputs({{&wq, bq, q_}, {&wk, bk, k_}, {&wv, bv, v_}}, xn_, n_, false, false);
        else {
            b_.project(wq, xn_, n_, bq, q_);
            b_.project(wk, xn_, n_, bk, k_, false);   // q, k and v read one input
            b_.project(wv, xn_, n_, bv, v_, false);
        }
        if (plan.qk_norm && plan.qk_norm_whole) {   // olmo2: one norm over every head, before the rope
            cuda::rmsnorm_rows(q_, d.vec(LayerRole::q_norm), q_, n_, wq.n_out, c_.rms_eps, b_.stream_);
            cuda::rmsnorm_rows(k_, d.vec(LayerRole::k_norm), k_, n_, wk.n_out, c_.rms_eps, b_.stream_);
        }
        if (decode_) {   // the rotated k and v stored by the rope kernel
            if (seqs_)
                cuda::qk_norm_rope_kv_write_tokens(b_.kv_.layer(l), q_, k_, v_, n_, lc.n_heads, q_norm, k_norm,
                                                   c_.rms_eps, rope, seqs_->map, b_.stream_);
            else
                cuda::qk_norm_rope_kv_write(b_.kv_.layer(l), q_, k_, v_, n_, lc.n_heads, q_norm, k_norm, c_.rms_eps,
                                            rope, batch_.pos0, b_.stream_, pos0_device_);
            return;
        }
        cuda::qk_norm_rope(q_, k_, n_, lc.n_heads, lc.n_kv_heads, c_.head_dim, q_norm, k_norm, c_.rms_eps, rope,
                           batch_.pos0, b_.stream_, pos0_device_);
        cuda::kv_write(b_.kv_.layer(l), k_, v_, n_, batch_.pos0, b_.stream_, pos0_device_);
    }

    void attend(int32_t l) override {
        const LayerConfig& lc = c_.layers[static_cast<size_t>(l)];
        const float* sinks = layer(l).vec(LayerRole::attn_sinks);
        att_width_ = int64_t{lc.n_heads} * c_.head_dim_v;
        if (seqs_)
            cuda::attention_tokens(b_.kv_.layer(l), q_, n_, lc.n_heads, lc.sliding_window, c_.attn_scale,
                                   c_.attn_softcap, att_, seqs_->map, seqs_->max_pos, b_.stream_, sinks);
        else
            cuda::attention(b_.kv_.layer(l), q_, n_, lc.n_heads, batch_.pos0, lc.sliding_window, c_.attn_scale,
                            c_.attn_softcap, att_, b_.stream_, pos0_device_, sinks, b_.prefill_attention_);
    }

    // Output projection (+ bias), the residual add. Without a post-norm or a scale, decode adds the projection
    // straight into the stream.
    void attention_output(int32_t l, const ResidualPlan& r) override {
        const DeviceLayer& d = layer(l);
        if (accumulates(r)) {
            b_.project_outputs({{&d[LayerRole::wo], d.vec(LayerRole::bo), x_}}, att_, n_, true);
            return;
        }
        b_.project(d[LayerRole::wo], att_, n_, d.vec(LayerRole::bo), out_);
        add_residual(d, r);
    }

    // The dense FFN's or the shared experts' gate and up (roles: ffn_roles(which)).
    void ffn_gate_up(int32_t l, GatedFfn which) override {
        const DeviceLayer& d = layer(l);
        const FfnRoles roles = ffn_roles(which);
        ffn_width_ = d[roles.gate].n_out;
        if (decode_) {
            b_.project_glu(d, roles, c_.ffn_act, xn_, n_, gate_, false);
            return;
        }
        b_.project(d[roles.gate], xn_, n_, roles.biases ? d.vec(LayerRole::b_gate) : nullptr, gate_);
        b_.project(d[roles.up], xn_, n_, roles.biases ? d.vec(LayerRole::b_up) : nullptr, up_, false);   // one input
        b_.glu_activation(c_.ffn_act, gate_, up_, n_ * ffn_width_);
    }

    // gate's int8 form may have come with it (project_glu).
    void ffn_down(int32_t l, GatedFfn which, const ResidualPlan& r) override {
        const DeviceLayer& d = layer(l);
        const FfnRoles roles = ffn_roles(which);
        const float* bias = roles.biases ? d.vec(LayerRole::b_down) : nullptr;
        if (accumulates(r)) {
            b_.project_outputs({{&d[roles.down], bias, x_}}, gate_, n_, true, false);
            return;
        }
        b_.project(d[roles.down], gate_, n_, bias, out_, false);
        add_residual(d, r);
    }

    // The routed experts (backend_cuda_moe.cpp). Decode's norm wrote xn's int8 form; a shared experts' FFN run
    // since moved the int8 buffer on to its own activations (q8_of_), so the router's projection quantizes xn again.
    void ffn_experts(int32_t l, const ResidualPlan& r) override {
        const DeviceLayer& d = layer(l);
        b_.moe_ffn(d, xn_, n_, out_, !decode_);
        add_residual(d, r);
    }

    void stream_out() override {
        cuda_call(cudaMemcpyAsync(batch_.hidden_out, x_, rows_bytes(n_), cudaMemcpyDeviceToHost, b_.stream_),
                  "copying the hidden state to the host");
        cuda_call(cudaStreamSynchronize(b_.stream_), "copying the hidden state to the host");
        b_.n_logit_rows_ = 0;
    }

    // A plain batch keeps one run at the end of x, normed where it is. A batch of spans keeps per span its last
    // row or all of its rows: those runs are gathered into out_ first, in span order.
    void final_norm(std::span<const RowRun> kept) override {
        const int64_t dim = c_.dim;
        kept_rows_ = 0;
        for (const RowRun& r : kept) kept_rows_ += r.count;
        if (batch_.spans.empty()) {
            cuda::rmsnorm_rows(x_ + kept.front().first * dim, b_.output_norm_, xn_, kept_rows_, dim, c_.rms_eps,
                               b_.stream_);
            return;
        }
        int64_t row = 0;
        for (const RowRun& r : kept) {
            cuda_call(cudaMemcpyAsync(out_ + row * dim, x_ + r.first * dim, rows_bytes(r.count),
                                      cudaMemcpyDeviceToDevice, b_.stream_),
                      "gathering the kept rows");
            row += r.count;
        }
        cuda::rmsnorm_rows(out_, b_.output_norm_, xn_, kept_rows_, dim, c_.rms_eps, b_.stream_);
    }

    // The rows stay on the GPU until asked for.
    void lm_head(int64_t rows, const LogitsPlan& plan) override {
        const int64_t vocab = c_.vocab;
        float* logits = b_.logits_.floats(static_cast<size_t>(rows) * static_cast<size_t>(vocab), "logits");
        b_.project(b_.output_, xn_, rows, nullptr, logits);
        if (plan.softcap > 0.0f) cuda::softcap(logits, rows * vocab, plan.softcap, b_.stream_);
        if (plan.multiplier != 1.0f) cuda::scale(logits, rows * vocab, plan.multiplier, b_.stream_);
        if (!step_) b_.finish_logits(rows);   // a captured step finishes at its replay
    }

    HostRows projection_input(ProjectionInput which) override {
        switch (which) {
        case ProjectionInput::attn_output: return b_.observed_rows(att_, n_, att_width_);
        case ProjectionInput::ffn_down: return b_.observed_rows(gate_, n_, ffn_width_);
        case ProjectionInput::lm_head: return b_.observed_rows(xn_, kept_rows_, c_.dim);
        default: return b_.observed_rows(xn_, n_, c_.dim);
        }
    }

private:
    const DeviceLayer& layer(int32_t l) const { return b_.layers_[static_cast<size_t>(l)]; }
    size_t rows_bytes(int64_t rows) const { return static_cast<size_t>(rows * c_.dim) * sizeof(float); }
    // Decode adds a projection straight into the stream (the matmul's accumulate) when nothing comes between.
    bool accumulates(const ResidualPlan& r) const { return decode_ && !r.post_norm && r.scale == 1.0f; }

    // x += scale * post_norm(out); the post-norm fused into the add when there is no scale.
    void add_residual(const DeviceLayer& d, const ResidualPlan& r) {
        const float* norm = r.post_norm ? d.vec(r.norm) : nullptr;
        if (r.scale != 1.0f) {
            if (norm) cuda::rmsnorm_rows(out_, norm, out_, n_, c_.dim, c_.rms_eps, b_.stream_);
            cuda::scale(out_, n_ * c_.dim, r.scale, b_.stream_);
            norm = nullptr;
        }
        cuda::add_residual(x_, out_, norm, n_, c_.dim, c_.rms_eps, b_.stream_);
    }

    CudaBackend& b_;
    const ModelConfig& c_;
    const ForwardBatch& batch_;
    const SequenceBatch* seqs_;
    const int32_t* step_;
    const cuda::ProgrammaticLaunches programmatic_;   // the forward's launches, programmatic where enabled
    int64_t n_ = 0;
    bool decode_ = false;
    const int32_t* pos0_device_ = nullptr;
    int32_t* tokens_ = nullptr;
    float *x_ = nullptr, *xn_ = nullptr, *out_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr,
          *att_ = nullptr, *gate_ = nullptr, *up_ = nullptr;
    int64_t att_width_ = 0, ffn_width_ = 0, kept_rows_ = 0;
};

void CudaBackend::forward_on_device(const ForwardBatch& batch, const int32_t* step, const SequenceBatch* seqs) {
    Steps steps(*this, batch, step, seqs);
    run_decoder(program_, batch, steps, observer_);
}

std::span<const float> CudaBackend::logits(int row) {
    if (row < 0 || row >= n_logit_rows_)
        throw UsageError("logits: row " + std::to_string(row) + " requested but the last forward kept " +
                         std::to_string(n_logit_rows_));
    const auto vocab = static_cast<size_t>(config_.vocab);
    float* host = host_logits_.data() + static_cast<size_t>(row) * vocab;
    if (!host_row_ready_[static_cast<size_t>(row)]) {
        cuda_call(cudaMemcpyAsync(host, logits_.floats(0, "logits") + static_cast<size_t>(row) * vocab,
                                  vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                  "copying logits to the host");
        cuda_call(cudaStreamSynchronize(stream_), "copying logits to the host");
        host_row_ready_[static_cast<size_t>(row)] = true;
    }
    return {host, vocab};
}

FloatScan CudaBackend::scan_logits(int row) {
    if (row < 0 || row >= n_logit_rows_)
        throw UsageError("scan_logits: row " + std::to_string(row) + " requested but the last forward kept " +
                         std::to_string(n_logit_rows_));
    if (host_row_flags_.empty()) {
        const auto rows = static_cast<size_t>(n_logit_rows_);
        auto* flags = static_cast<uint32_t*>(row_flags_.reserve(rows * sizeof(uint32_t), "logit row flags"));
        try {
            cuda::scan_rows(logits_.floats(0, "logits"), n_logit_rows_, config_.vocab, flags, stream_);
        } catch (const cuda::Error& e) {
            throw RuntimeFailure(std::string("cuda: ") + e.what());
        }
        host_row_flags_.resize(rows);
        cuda_call(cudaMemcpyAsync(host_row_flags_.data(), flags, rows * sizeof(uint32_t), cudaMemcpyDeviceToHost,
                                  stream_),
                  "copying the logit row flags to the host");
        cuda_call(cudaStreamSynchronize(stream_), "copying the logit row flags to the host");
    }
    const uint32_t f = host_row_flags_[static_cast<size_t>(row)];
    return {(f & cuda::kRowHasNan) != 0, (f & cuda::kRowHasPosInf) != 0, (f & cuda::kRowHasFinite) != 0};
}

void CudaBackend::argmax(std::span<int32_t> per_row) {
    if (static_cast<int64_t>(per_row.size()) > n_logit_rows_)
        throw UsageError("argmax: " + std::to_string(per_row.size()) + " rows requested but the last forward kept " +
                         std::to_string(n_logit_rows_));
    if (per_row.empty()) return;
    const auto rows = static_cast<int64_t>(per_row.size());
    // The ids, then the split argmax's partial results (16-byte aligned).
    const size_t ids_bytes = (per_row.size() * sizeof(int32_t) + 15) / 16 * 16;
    const auto scratch_bytes = static_cast<size_t>(cuda::argmax_rows_split_scratch_bytes(rows, config_.vocab));
    auto* ids = static_cast<int32_t*>(ids_.reserve(ids_bytes + scratch_bytes, "argmax ids"));
    try {
        cuda::argmax_rows_split(logits_.floats(0, "logits"), rows, config_.vocab, ids,
                                reinterpret_cast<uint8_t*>(ids) + ids_bytes, stream_);
    } catch (const cuda::Error& e) {
        throw RuntimeFailure(std::string("cuda: ") + e.what());
    }
    cuda_call(cudaMemcpyAsync(per_row.data(), ids, per_row.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
              "copying token ids to the host");
    cuda_call(cudaStreamSynchronize(stream_), "copying token ids to the host");
}

// The engine's candidate and penalty types are the kernels' (kernels/cuda/sampling.h) byte for byte: they
// are copied to and from the device as they are.
static_assert(kMaxTopCandidates == cuda::kTopLogitsMax);
static_assert(sizeof(LogitCandidate) == sizeof(cuda::TopLogit) &&
              offsetof(LogitCandidate, id) == offsetof(cuda::TopLogit, id) &&
              offsetof(LogitCandidate, logit) == offsetof(cuda::TopLogit, logit));
static_assert(sizeof(PenaltyCount) == sizeof(cuda::PenaltyPair) &&
              offsetof(PenaltyCount, id) == offsetof(cuda::PenaltyPair, id) &&
              offsetof(PenaltyCount, count) == offsetof(cuda::PenaltyPair, count));

size_t CudaBackend::top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out) {
    if (row < 0 || row >= n_logit_rows_)
        throw UsageError("top_logits: row " + std::to_string(row) + " requested but the last forward kept " +
                         std::to_string(n_logit_rows_));
    if (out.size() > static_cast<size_t>(kMaxTopCandidates))
        throw UsageError("top_logits: " + std::to_string(out.size()) + " candidates asked for, at most " +
                         std::to_string(kMaxTopCandidates));
    const int64_t vocab = config_.vocab;
    const size_t n = std::min(out.size(), static_cast<size_t>(vocab));
    if (n == 0) return 0;
    const int k = static_cast<int>(out.size());
    // One allocation: the k candidates, the penalty pairs, the selection's scratch (each 16-byte aligned).
    auto round16 = [](size_t b) { return (b + 15) / 16 * 16; };
    const size_t out_bytes = round16(out.size() * sizeof(cuda::TopLogit));
    const size_t pair_bytes = round16(penalties.seen.size() * sizeof(cuda::PenaltyPair));
    const auto scratch_bytes = static_cast<size_t>(cuda::top_logits_scratch_bytes(vocab, k));
    auto* base = static_cast<uint8_t*>(top_logits_.reserve(out_bytes + pair_bytes + scratch_bytes, "top logits"));
    auto* device_out = reinterpret_cast<cuda::TopLogit*>(base);
    auto* pairs = reinterpret_cast<cuda::PenaltyPair*>(base + out_bytes);
    // A few hundred bytes from pageable memory: the stream waits for them to be staged.
    if (!penalties.seen.empty())
        cuda_call(cudaMemcpyAsync(pairs, penalties.seen.data(), penalties.seen.size() * sizeof(cuda::PenaltyPair),
                                  cudaMemcpyHostToDevice, stream_),
                  "copying the penalty window to the device");
    cuda::TopLogitsPenalties device_penalties;
    device_penalties.pairs = pairs;
    device_penalties.n_pairs = static_cast<int32_t>(penalties.seen.size());
    device_penalties.repeat = penalties.repeat;
    device_penalties.frequency = penalties.frequency;
    device_penalties.presence = penalties.presence;
    try {
        cuda::top_logits(logits_.floats(0, "logits") + static_cast<size_t>(row) * static_cast<size_t>(vocab), vocab,
                         device_penalties, k, device_out, base + out_bytes + pair_bytes, stream_);
    } catch (const cuda::Error& e) {
        throw RuntimeFailure(std::string("cuda: ") + e.what());
    }
    cuda_call(cudaMemcpyAsync(out.data(), device_out, n * sizeof(cuda::TopLogit), cudaMemcpyDeviceToHost, stream_),
              "copying the top logits to the host");
    cuda_call(cudaStreamSynchronize(stream_), "copying the top logits to the host");
    return n;
}

void CudaBackend::kv_truncate(int32_t n_past) {
    if (n_past < 0 || n_past > kv_.n_past())
        throw UsageError("kv_truncate: cannot keep " + std::to_string(n_past) + " positions, the cache holds " +
                         std::to_string(kv_.n_past()));
    kv_.set_n_past(n_past);   // later writes overwrite the forgotten positions; whole pages past them go back
}

void CudaBackend::seq_free(int32_t seq) {
    check_seq_free(seq);
    kv_.free(seq);
}

void CudaBackend::seq_truncate(int32_t seq, int32_t n) {
    check_seq_truncate(seq, n, kv_.n_past(seq));
    kv_.set_n_past(n, seq);
}

KvPoolUse CudaBackend::kv_pool() const {
    return {kv_.pages().n_slots(), kv_.pages().slots_in_use(), kKvPagePositions};
}

KvSnapshot CudaBackend::kv_save(int32_t n) const { return kv_.save(n); }
void CudaBackend::kv_load(const KvSnapshot& snapshot) { kv_.load(snapshot); }
KvSnapshot CudaBackend::kv_save_range(int32_t begin, int32_t end) const { return kv_.save_range(begin, end); }
void CudaBackend::kv_append(const KvSnapshot& range) { kv_.append(range); }

void CudaBackend::kv_erase(int32_t begin, int32_t end) {
    if (!loaded_) throw UsageError("kv_erase: the backend has no model loaded");
    if (begin < 0 || end < begin || end > kv_.n_past())
        throw UsageError("kv_erase: cannot remove positions " + std::to_string(begin) + ".." + std::to_string(end) +
                         ", the cache holds " + std::to_string(kv_.n_past()));
    if (end == begin) return;
    try {
        kv_.make_writable(0, begin, kv_.n_past());   // the rows from begin on are rewritten: shared pages copied first
        kv_.sync_pages();
        for (int32_t l = 0; l < config_.n_layers; ++l) {
            cuda::RopeParams rope = rope_params(rope_plan(config_, l));
            rope.mscale = 1.0f;   // a shift turns keys by an angle difference: YaRN's angles, no mscale
            rope.q_temp_scale = 0.0f;
            rope.q_temp_floor = 0;
            cuda::kv_erase(kv_.layer(l), begin, end, kv_.n_past(), rope, stream_);
        }
    } catch (const cuda::Error& e) {
        throw RuntimeFailure(std::string("cuda: ") + e.what());
    }
    kv_.set_n_past(kv_.n_past() - (end - begin));
}

} // namespace TERN_CUDA_ABI
} // namespace tern
