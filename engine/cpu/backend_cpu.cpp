#include "engine/cpu/backend_cpu.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/cpu/layer_rope.h"
#include "engine/cpu/memory_plan.h"
#include "engine/memory_budget.h"
#include "base/error.h"
#include "kernels/cpu/matmul_quant.h"
#include "kernels/cpu/ops.h"
#include "base/parallel_for.h"
#include "kernels/cpu/quantize_act.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu_features.h"
#include "quant/reference.h"

namespace tern {
namespace {

// A 1-D tensor as f32 (empty when the optional tensor is absent).
std::vector<float> vector_f32(const WeightRef& w) {
    if (!w.present()) return {};
    std::vector<float> out(static_cast<size_t>(w.n_in()));
    dequantize_row(w.type, w.data, out.data(), w.n_in());
    return out;
}

// RMSNorm of each of n_rows rows of width `width`, in place when x == y.
void rmsnorm_rows(const float* x, const std::vector<float>& w, float* y, int64_t n_rows, int64_t width, float eps) {
    for (int64_t i = 0; i < n_rows; ++i)
        rmsnorm_f32(x + i * width, w.data(), y + i * width, width, eps);
}

} // namespace

CpuBackend::CpuBackend(const CpuOptions& options)
    : n_threads_(resolve_threads(options.n_threads)), exact_matmul_(options.exact_matmul) {
    input_.n_threads = n_threads_;
}

MemoryNeed CpuBackend::plan_memory(const ModelConfig& config, const ModelWeights& weights,
                                   const MemoryRequest& request) const {
    return cpu_memory_need(config, weights, request);
}

std::vector<MemoryLimit> CpuBackend::memory_limits() const { return host_memory_limits(); }

void CpuBackend::load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) {
    if (options.n_ctx <= 0) throw UsageError("context size must be positive, got " + std::to_string(options.n_ctx));
    config_ = config;
    weights_ = weights;
    first_layer_ = options.first_layer;

    layer_vectors_.assign(weights.layers.size(), {});
    for (size_t l = 0; l < weights.layers.size(); ++l) {
        const LayerWeights& lw = weights.layers[l];
        LayerVectors& lv = layer_vectors_[l];
        lv.attn_norm = vector_f32(lw.attn_norm);
        lv.bq = vector_f32(lw.bq);
        lv.bk = vector_f32(lw.bk);
        lv.bv = vector_f32(lw.bv);
        lv.q_norm = vector_f32(lw.q_norm);
        lv.k_norm = vector_f32(lw.k_norm);
        lv.bo = vector_f32(lw.bo);
        lv.post_attn_norm = vector_f32(lw.post_attn_norm);
        lv.ffn_norm = vector_f32(lw.ffn_norm);
        lv.b_gate = vector_f32(lw.b_gate);
        lv.b_up = vector_f32(lw.b_up);
        lv.b_down = vector_f32(lw.b_down);
        lv.post_ffn_norm = vector_f32(lw.post_ffn_norm);
    }
    output_norm_ = vector_f32(weights.output_norm);
    rope_freqs_ = vector_f32(rope_factors_for(weights, config, options.n_ctx));

    std::vector<int32_t> n_kv_heads;
    for (const LayerConfig& lc : config.layers)
        n_kv_heads.push_back(lc.n_kv_heads);
    const int32_t pool = std::max(options.kv_pool_positions, options.n_ctx);
    kv_.init(options.kv_type, n_kv_heads, config.head_dim, config.head_dim_v, options.n_ctx,
             static_cast<int32_t>(kv_pages_for(pool)));
    logits_.clear();
    n_logit_rows_ = 0;
    prepared_ = {};   // the previous model's copies go before the new ones are made
    prepared_ = prepare_weights(weights_, exact_matmul_, n_threads_, cpu_kernels());
    loaded_ = true;
}

// The whole decoder for N tokens at positions pos0 .. pos0+N-1, one straight line:
// embed -> per layer {norm, q/k/v, q/k norm, rope, KV write, attention, output, FFN} -> norm -> lm_head.
void CpuBackend::forward(const ForwardBatch& batch) {
    if (!loaded_) throw UsageError("forward: the backend has no model loaded");
    const ModelConfig& c = config_;
    const int64_t n = static_cast<int64_t>(batch.tokens.size());
    check_forward_batch(batch, kv_.n_past(), kv_.n_ctx(), c.vocab, [this](int32_t seq) { return kv_.n_past(seq); });
    // The batch as sequence spans (one, sequence 0, for a plain batch), each token's sequence and position,
    // and the pages every span writes, mapped before the threads write them.
    const SequenceSpan single{0, static_cast<int32_t>(n), batch.wanted};
    const std::span<const SequenceSpan> spans = batch.spans.empty() ? std::span(&single, 1) : batch.spans;
    std::vector<int32_t> span_pos0, token_seq, token_pos;
    for (const SequenceSpan& s : spans) {
        const int32_t past = kv_.n_past(s.seq);
        kv_.reserve(past + s.n_tokens, s.seq);
        span_pos0.push_back(past);
        for (int32_t i = 0; i < s.n_tokens; ++i) {
            token_seq.push_back(s.seq);
            token_pos.push_back(past + i);
        }
    }

    const int nt = n_threads_;
    const int64_t dim = c.dim;
    const int64_t head_dim = c.head_dim;
    const int64_t head_dim_v = c.head_dim_v;
    const float* freq_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();

    std::vector<float> x(static_cast<size_t>(n * dim));   // (n, dim) residual stream
    std::vector<float> xn(static_cast<size_t>(n * dim));  // (n, dim) normed input of a sub-block
    std::vector<float> q, k, v, att;                      // (n, n_heads*head_dim) ... per layer
    std::vector<float> gate, up;                          // (n, ffn_dim)
    std::vector<float> out(static_cast<size_t>(n * dim)); // (n, dim) sub-block output

    // Embeddings: dequantize each token's row (gemma scales it by sqrt(dim)); a later slice of a split
    // model starts from the stream the slice before it computed.
    if (!weights_.token_embd.present()) {
        if (!batch.hidden_in) throw UsageError("forward: a slice without the embedding needs the hidden state in");
        std::copy(batch.hidden_in, batch.hidden_in + n * dim, x.begin());
    }
    for (int64_t i = 0; i < n && weights_.token_embd.present(); ++i) {
        float* xi = x.data() + i * dim;
        dequantize_row(weights_.token_embd.type, weights_.token_embd.row(batch.tokens[static_cast<size_t>(i)]), xi,
                       dim);
        if (c.embed_scale != 1.0f)
            for (int64_t d = 0; d < dim; ++d)
                xi[d] *= c.embed_scale;
    }

    for (int32_t l = 0; l < c.n_layers; ++l) {
        const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
        const PreparedLayer& pl = prepared_.layers[static_cast<size_t>(l)];
        const LayerVectors& lv = layer_vectors_[static_cast<size_t>(l)];
        const int64_t n_heads = lc.n_heads, n_kv_heads = lc.n_kv_heads;
        const int64_t q_dim = n_heads * head_dim, k_dim = n_kv_heads * head_dim, v_dim = n_kv_heads * head_dim_v;
        const int64_t att_dim = n_heads * head_dim_v;
        const LayerRope rope = layer_rope(c, l, freq_factors); // also what kv_erase turns keys with

        // Attention block: q/k/v projections (+ biases).
        q.resize(static_cast<size_t>(n * q_dim)); // (n, n_heads, head_dim)
        k.resize(static_cast<size_t>(n * k_dim)); // (n, n_kv_heads, head_dim)
        v.resize(static_cast<size_t>(n * v_dim)); // (n, n_kv_heads, head_dim_v)
        norm_input(x.data(), lv.attn_norm, n, dim, xn.data(), pl.q); // q, k and v share one quantized input
        if (observer_) observer_->matmul_input(first_layer_ + l, ProjectionInput::attn_qkv, xn.data(), n, dim);
        project_shared(pl.qkv, {&pl.q, &pl.k, &pl.v}, {&lv.bq, &lv.bk, &lv.bv}, input_, {q.data(), k.data(), v.data()});

        // Per-head q/k norm (qwen3, gemma3), then RoPE at each token's position, then the KV write.
        const int rope_threads = threads_for_work(n * (n_heads + n_kv_heads) * head_dim * 16, nt);
        parallel_for(n, rope_threads, 16, [&](int64_t i0, int64_t i1) {
          for (int64_t i = i0; i < i1; ++i) {
            const int32_t pos = token_pos[static_cast<size_t>(i)];
            const float q_temperature = c.attn_temperature(pos);   // 1 but for mistral3 past its original context
            for (int64_t h = 0; h < n_heads; ++h) {
                float* qh = q.data() + i * q_dim + h * head_dim;
                if (c.qk_norm) rmsnorm_f32(qh, lv.q_norm.data(), qh, head_dim, c.rms_eps);
                rope.apply(qh, pos);
                if (q_temperature != 1.0f)
                    for (int64_t d = 0; d < head_dim; ++d) qh[d] *= q_temperature;
            }
            for (int64_t h = 0; h < n_kv_heads; ++h) {
                float* kh = k.data() + i * k_dim + h * head_dim;
                if (c.qk_norm) rmsnorm_f32(kh, lv.k_norm.data(), kh, head_dim, c.rms_eps);
                rope.apply(kh, pos);
            }
            kv_.write(l, pos, k.data() + i * k_dim, v.data() + i * v_dim, token_seq[static_cast<size_t>(i)]);
          }
        });

        // Attention over the cache (backend_cpu_attention.cpp).
        att.resize(static_cast<size_t>(n * att_dim)); // (n, n_heads, head_dim_v)
        for (size_t s = 0, first = 0; s < spans.size(); first += static_cast<size_t>(spans[s].n_tokens), ++s) {
            const float* qs = q.data() + first * static_cast<size_t>(q_dim);
            float* as = att.data() + first * static_cast<size_t>(att_dim);
            if (exact_matmul_ && kv_.format() == KvType::f32)
                attend_plain(l, spans[s].seq, span_pos0[s], spans[s].n_tokens, qs, as);
            else
                attend(l, spans[s].seq, span_pos0[s], spans[s].n_tokens, qs, as);
        }

        // Output projection (+ bias), gemma's post-attention norm, residual.
        if (observer_) observer_->matmul_input(first_layer_ + l, ProjectionInput::attn_output, att.data(), n, att_dim);
        input_.reset(att.data(), att_dim, n);
        project(pl.o, lv.bo, input_, out.data());
        if (c.post_norms) rmsnorm_rows(out.data(), lv.post_attn_norm, out.data(), n, dim, c.rms_eps);
        for (int64_t e = 0; e < n * dim; ++e)
            x[static_cast<size_t>(e)] += out[static_cast<size_t>(e)];

        // FFN block: down(act(gate x) * (up x)), or the routed experts' (backend_cpu_moe.cpp); gemma's post-FFN
        // norm, residual.
        if (c.moe()) {
            norm_input(x.data(), lv.ffn_norm, n, dim, xn.data(), pl.router);
            moe_ffn(pl, n, out.data());
        } else {
            const int64_t ffn_dim = lc.ffn_dim;
            gate.resize(static_cast<size_t>(n * ffn_dim)); // (n, ffn_dim)
            up.resize(static_cast<size_t>(n * ffn_dim));   // (n, ffn_dim)
            norm_input(x.data(), lv.ffn_norm, n, dim, xn.data(), pl.gate); // gate and up share one quantized input
            if (observer_) observer_->matmul_input(first_layer_ + l, ProjectionInput::ffn_gate_up, xn.data(), n, dim);
            project_shared(pl.gate_up, {&pl.gate, &pl.up}, {&lv.b_gate, &lv.b_up}, input_, {gate.data(), up.data()});
            if (c.ffn_act == FfnActivation::silu)
                swiglu_f32(gate.data(), up.data(), gate.data(), n * ffn_dim, nt);
            else
                geglu_tanh_f32(gate.data(), up.data(), gate.data(), n * ffn_dim, nt);
            if (observer_) observer_->matmul_input(first_layer_ + l, ProjectionInput::ffn_down, gate.data(), n, ffn_dim);
            input_.reset(gate.data(), ffn_dim, n);
            project(pl.down, lv.b_down, input_, out.data());
        }
        if (c.post_norms) rmsnorm_rows(out.data(), lv.post_ffn_norm, out.data(), n, dim, c.rms_eps);
        for (int64_t e = 0; e < n * dim; ++e)
            x[static_cast<size_t>(e)] += out[static_cast<size_t>(e)];
    }
    for (size_t s = 0; s < spans.size(); ++s) kv_.set_n_past(span_pos0[s] + spans[s].n_tokens, spans[s].seq);
    if (!weights_.output.present()) {   // a slice before the last: the stream goes on to the next device
        if (!batch.hidden_out) throw UsageError("forward: a slice without the output matrix needs a hidden state out");
        std::copy(x.begin(), x.end(), batch.hidden_out);
        n_logit_rows_ = 0;
        return;
    }

    // Final norm and lm_head on the rows whose logits are wanted: per span its last token's or all of them,
    // gathered in span order (a plain batch's rows are already one run at the end).
    std::vector<int64_t> kept;
    for (size_t s = 0, first = 0; s < spans.size(); first += static_cast<size_t>(spans[s].n_tokens), ++s)
        for (int32_t i = spans[s].wanted == LogitsWanted::all ? 0 : spans[s].n_tokens - 1; i < spans[s].n_tokens; ++i)
            kept.push_back(static_cast<int64_t>(first) + i);
    const auto rows = static_cast<int64_t>(kept.size());
    const float* xl = x.data() + kept.front() * dim;
    if (kept.back() - kept.front() + 1 != rows) {   // not one run: gather them into `out`, free by now
        for (int64_t r = 0; r < rows; ++r)
            std::copy_n(x.data() + kept[static_cast<size_t>(r)] * dim, dim, out.data() + r * dim);
        xl = out.data();
    }
    logits_.resize(static_cast<size_t>(rows * c.vocab)); // (rows, vocab)
    norm_input(xl, output_norm_, rows, dim, xn.data(), prepared_.output);
    if (observer_) observer_->matmul_input(-1, ProjectionInput::lm_head, xn.data(), rows, dim);
    project(prepared_.output, {}, input_, logits_.data());
    if (c.final_softcap > 0.0f) softcap_f32(logits_.data(), rows * c.vocab, c.final_softcap);
    n_logit_rows_ = static_cast<int>(rows);
}

std::span<const float> CpuBackend::logits(int row) {
    if (row < 0 || row >= n_logit_rows_)
        throw UsageError("logits: row " + std::to_string(row) + " requested but the last forward kept " +
                         std::to_string(n_logit_rows_));
    return {logits_.data() + static_cast<size_t>(row) * static_cast<size_t>(config_.vocab),
            static_cast<size_t>(config_.vocab)};
}

void CpuBackend::argmax(std::span<int32_t> per_row) {
    if (static_cast<int64_t>(per_row.size()) > n_logit_rows_)
        throw UsageError("argmax: " + std::to_string(per_row.size()) + " rows requested but the last forward kept " +
                         std::to_string(n_logit_rows_));
    for (size_t r = 0; r < per_row.size(); ++r) {
        const std::span<const float> row = logits(static_cast<int>(r));
        per_row[r] = static_cast<int32_t>(argmax_f32(row.data(), static_cast<int64_t>(row.size())));
    }
}

void CpuBackend::seq_free(int32_t seq) {
    check_seq_free(seq);
    kv_.free(seq);
}

void CpuBackend::seq_truncate(int32_t seq, int32_t n) {
    check_seq_truncate(seq, n, kv_.n_past(seq));
    kv_.set_n_past(n, seq);
}

KvPoolUse CpuBackend::kv_pool() const {
    return {kv_.pages().n_slots(), kv_.pages_in_use(), kKvPagePositions};
}

void CpuBackend::kv_truncate(int32_t n_past) {
    if (n_past < 0 || n_past > kv_.n_past())
        throw UsageError("kv_truncate: cannot keep " + std::to_string(n_past) + " positions, the cache holds " +
                         std::to_string(kv_.n_past()));
    kv_.set_n_past(n_past); // later writes overwrite the forgotten positions
}

KvSnapshot CpuBackend::kv_save(int32_t n) const {
    return kv_.save(n);
}

void CpuBackend::kv_load(const KvSnapshot& snapshot) {
    kv_.load(snapshot);
}

KvSnapshot CpuBackend::kv_save_range(int32_t begin, int32_t end) const {
    return kv_.save_range(begin, end);
}

void CpuBackend::kv_append(const KvSnapshot& range) {
    kv_.append(range);
}

} // namespace tern
