#include "engine/cpu/backend_cpu.h"

#include <algorithm>
#include <cmath>
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

// A matrix's rows as f32 vectors (empty when the optional tensor is absent): the per-expert bias rows.
std::vector<std::vector<float>> rows_f32(const WeightRef& w) {
    std::vector<std::vector<float>> rows;
    for (int64_t r = 0; w.present() && r < w.n_out(); ++r) {
        rows.emplace_back(static_cast<size_t>(w.n_in()));
        dequantize_row(w.type, w.row(r), rows.back().data(), w.n_in());
    }
    return rows;
}

} // namespace

void glu_activation(FfnActivation act, float* gate, const float* up, int64_t n, int n_threads) {
    switch (act) {
    case FfnActivation::silu: swiglu_f32(gate, up, gate, n, n_threads); return;
    case FfnActivation::gelu_tanh: geglu_tanh_f32(gate, up, gate, n, n_threads); return;
    // gpt-oss's constants (its config.json's swiglu_limit; the alpha of its reference implementation).
    case FfnActivation::swiglu_oai: swiglu_oai_f32(gate, up, gate, n, 1.702f, 7.0f, n_threads); return;
    }
}

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
    program_ = decoder_program(config, options.first_layer);

    layer_vectors_.assign(weights.layers.size(), {});
    for (size_t l = 0; l < weights.layers.size(); ++l)
        for (const LayerTensor& t : layer_tensors()) {
            const WeightRef& w = weights.layers[l].*t.member;
            const auto r = static_cast<size_t>(t.role);
            if (t.kind == TensorKind::vector) layer_vectors_[l].vectors[r] = vector_f32(w);
            if (t.kind == TensorKind::vector_rows) layer_vectors_[l].rows[r] = rows_f32(w);
        }
    output_norm_ = vector_f32(weights.output_norm);
    rope_freqs_ = vector_f32(rope_factors_for(weights, config, options.n_ctx));

    per_layer_proj_norm_ = vector_f32(weights.per_layer_proj_norm);

    // A layer that reads another's KV (gemma4's shared layers) gets none of its own: 0 heads, no bytes.
    std::vector<int32_t> n_kv_heads, head_dims, head_dims_v;
    for (int32_t l = 0; l < config.n_layers; ++l) {
        const LayerConfig& lc = config.layers[static_cast<size_t>(l)];
        n_kv_heads.push_back(lc.has_kv() ? lc.n_kv_heads : 0);
        head_dims.push_back(config.head_dim_of(l));
        head_dims_v.push_back(config.head_dim_v_of(l));
    }
    const int32_t pool = std::max(options.kv_pool_positions, options.n_ctx);
    kv_.init(options.kv_type, n_kv_heads, head_dims, head_dims_v, options.n_ctx,
             static_cast<int32_t>(kv_pages_for(pool)));
    logits_.clear();
    n_logit_rows_ = 0;
    prepared_ = {};   // the previous model's copies go before the new ones are made
    prepared_ = prepare_weights(weights_, exact_matmul_, n_threads_, cpu_kernels());
    loaded_ = true;
}

// One forward's activations and the layer program's steps on the CPU kernels.
class CpuBackend::Steps final : public DecoderSteps {
public:
    Steps(CpuBackend& b, const ForwardBatch& batch) : b_(b), c_(b.config_), batch_(batch) {
        n_ = static_cast<int64_t>(batch.tokens.size());
        // The batch as sequence spans (one, sequence 0, for a plain batch), each token's sequence and position,
        // and the pages every span writes, mapped before the threads write them.
        single_ = SequenceSpan{0, static_cast<int32_t>(n_), batch.wanted};
        spans_ = batch.spans.empty() ? std::span(&single_, 1) : batch.spans;
        for (const SequenceSpan& s : spans_) {
            const int32_t past = b_.kv_.n_past(s.seq);
            b_.kv_.reserve(past + s.n_tokens, s.seq);
            span_pos0_.push_back(past);
            for (int32_t i = 0; i < s.n_tokens; ++i) {
                token_seq_.push_back(s.seq);
                token_pos_.push_back(past + i);
            }
        }
        x_.resize(static_cast<size_t>(n_ * c_.dim));
        xn_.resize(static_cast<size_t>(n_ * c_.dim));
        out_.resize(static_cast<size_t>(n_ * c_.dim));
    }

    // The positions the batch filled, per sequence: the cache holds them once the forward is through.
    void commit() {
        for (size_t s = 0; s < spans_.size(); ++s)
            b_.kv_.set_n_past(span_pos0_[s] + spans_[s].n_tokens, spans_[s].seq);
    }

    bool has_embedding() const override { return b_.weights_.token_embd.present(); }
    bool has_output() const override { return b_.weights_.output.present(); }

    // Each token's row dequantized (gemma scales it by sqrt(dim)).
    void embed(float scale) override {
        const WeightRef& e = b_.weights_.token_embd;
        const int64_t dim = c_.dim;
        for (int64_t i = 0; i < n_; ++i) {
            float* xi = x_.data() + i * dim;
            dequantize_row(e.type, e.row(batch_.tokens[static_cast<size_t>(i)]), xi, dim);
            if (scale != 1.0f)
                for (int64_t d = 0; d < dim; ++d) xi[d] *= scale;
        }
    }

    void stream_in() override { std::copy(batch_.hidden_in, batch_.hidden_in + n_ * c_.dim, x_.begin()); }

    // The norm and the quantized form its reader takes in one pass; without a norm the reader quantizes x.
    void block_input(int32_t l, const BlockInput& in) override {
        if (in.norm) {
            b_.norm_input(x_.data(), vectors(l)[in.weight], n_, c_.dim, xn_.data(), reader(l, in.reader));
            return;
        }
        std::copy(x_.begin(), x_.end(), xn_.begin());
        b_.input_.reset(xn_.data(), c_.dim, n_);
    }

    // q/k/v (+ biases) from one quantized input; per token: the q/k norm, RoPE at its position, the KV write.
    void attention_qkv(int32_t l, const AttentionPlan& plan) override {
        const LayerConfig& lc = c_.layers[static_cast<size_t>(l)];
        const PreparedLayer& pl = prepared(l);
        const LayerVectors& lv = vectors(l);
        const int64_t head_dim = c_.head_dim_of(l), head_dim_v = c_.head_dim_v_of(l);
        const int64_t n_heads = lc.n_heads;
        // A layer reading another's KV (gemma4) projects q alone and writes nothing to the cache.
        const bool own_kv = plan.kv_source < 0;
        const int64_t n_kv_heads = own_kv ? lc.n_kv_heads : 0;
        const int64_t q_dim = n_heads * head_dim, k_dim = n_kv_heads * head_dim, v_dim = n_kv_heads * head_dim_v;
        q_.resize(static_cast<size_t>(n_ * q_dim)); // (n, n_heads, head_dim)
        k_.resize(static_cast<size_t>(n_ * k_dim)); // (n, n_kv_heads, head_dim)
        v_.resize(static_cast<size_t>(n_ * v_dim)); // (n, n_kv_heads, head_dim_v)
        if (own_kv && pl.v.source.present()) {
            b_.project_shared(pl.qkv, {&pl.q, &pl.k, &pl.v},
                              {&lv[LayerRole::bq], &lv[LayerRole::bk], &lv[LayerRole::bv]}, b_.input_,
                              {q_.data(), k_.data(), v_.data()});
        } else if (own_kv) {   // gemma4 without attn_v (its 31B's global layers): V is K's projection, before K's norm
            b_.project_shared(pl.qkv, {&pl.q, &pl.k}, {&lv[LayerRole::bq], &lv[LayerRole::bk]}, b_.input_,
                              {q_.data(), k_.data()});
            std::copy(k_.begin(), k_.end(), v_.begin());
        } else {
            b_.project(pl.q, lv[LayerRole::bq], b_.input_, q_.data());
        }

        const float* freq_factors = b_.rope_freqs_.empty() || lc.no_freq_factors ? nullptr : b_.rope_freqs_.data();
        const LayerRope rope = layer_rope(plan.rope, head_dim, freq_factors);
        const bool per_head = plan.qk_norm && !plan.qk_norm_whole, whole = plan.qk_norm && plan.qk_norm_whole;
        const float* q_norm = lv[LayerRole::q_norm].data();
        const float* k_norm = lv[LayerRole::k_norm].data();
        const float eps = c_.rms_eps;
        const int rope_threads = threads_for_work(n_ * (n_heads + n_kv_heads) * head_dim * 16, b_.n_threads_);
        parallel_for(n_, rope_threads, 16, [&](int64_t i0, int64_t i1) {
          std::vector<float> ones;   // V's norm has no weight (gemma4)
          if (plan.v_norm) ones.assign(static_cast<size_t>(head_dim_v), 1.0f);
          for (int64_t i = i0; i < i1; ++i) {
            const int32_t pos = token_pos_[static_cast<size_t>(i)];
            const float q_temperature = c_.attn_temperature(pos);   // 1 but for mistral3 past its original context
            float* qi = q_.data() + i * q_dim;
            float* ki = k_.data() + i * k_dim;
            float* vi = v_.data() + i * v_dim;
            if (whole) {   // olmo2: one norm over every head
                rmsnorm_f32(qi, q_norm, qi, q_dim, eps);
                if (own_kv) rmsnorm_f32(ki, k_norm, ki, k_dim, eps);
            }
            for (int64_t h = 0; h < n_heads; ++h) {
                float* qh = qi + h * head_dim;
                if (per_head) rmsnorm_f32(qh, q_norm, qh, head_dim, eps);
                rope.apply(qh, pos);
                if (q_temperature != 1.0f)
                    for (int64_t d = 0; d < head_dim; ++d) qh[d] *= q_temperature;
            }
            if (!own_kv) continue;
            for (int64_t h = 0; h < n_kv_heads; ++h) {
                float* kh = ki + h * head_dim;
                if (per_head) rmsnorm_f32(kh, k_norm, kh, head_dim, eps);
                rope.apply(kh, pos);
                if (plan.v_norm) rmsnorm_f32(vi + h * head_dim_v, ones.data(), vi + h * head_dim_v, head_dim_v, eps);
            }
            b_.kv_.write(l, pos, ki, vi, token_seq_[static_cast<size_t>(i)]);
          }
        });
    }

    // Attention over the cache, span by span (backend_cpu_attention.cpp).
    void attend(int32_t l) override {
        const LayerConfig& lc = c_.layers[static_cast<size_t>(l)];
        const int64_t q_dim = int64_t{lc.n_heads} * c_.head_dim_of(l);
        att_dim_ = int64_t{lc.n_heads} * c_.head_dim_v_of(l);
        att_.resize(static_cast<size_t>(n_ * att_dim_)); // (n, n_heads, head_dim_v)
        for (size_t s = 0, first = 0; s < spans_.size(); first += static_cast<size_t>(spans_[s].n_tokens), ++s) {
            const float* qs = q_.data() + first * static_cast<size_t>(q_dim);
            float* as = att_.data() + first * static_cast<size_t>(att_dim_);
            if (b_.exact_matmul_ && b_.kv_.format() == KvType::f32)
                b_.attend_plain(l, spans_[s].seq, span_pos0_[s], spans_[s].n_tokens, qs, as);
            else
                b_.attend(l, spans_[s].seq, span_pos0_[s], spans_[s].n_tokens, qs, as);
        }
    }

    void attention_output(int32_t l, const ResidualPlan& r) override {
        b_.input_.reset(att_.data(), att_dim_, n_);
        b_.project(prepared(l).o, vectors(l)[LayerRole::bo], b_.input_, out_.data());
        add_residual(l, r);
    }

    // gate = act(gate) * up, gate and up from one quantized input: the dense FFN's or the shared experts'.
    void ffn_gate_up(int32_t l, GatedFfn which) override {
        const Ffn f = ffn(l, which);
        ffn_dim_ = f.gate.source.n_out();
        gate_.resize(static_cast<size_t>(n_ * ffn_dim_)); // (n, ffn_dim)
        up_.resize(static_cast<size_t>(n_ * ffn_dim_));   // (n, ffn_dim)
        b_.project_shared(f.gate_up, {&f.gate, &f.up}, {&f.b_gate, &f.b_up}, b_.input_, {gate_.data(), up_.data()});
        glu_activation(c_.ffn_act, gate_.data(), up_.data(), n_ * ffn_dim_, b_.n_threads_);
    }

    void ffn_down(int32_t l, GatedFfn which, const ResidualPlan& r) override {
        const Ffn f = ffn(l, which);
        b_.input_.reset(gate_.data(), ffn_dim_, n_);
        b_.project(f.down, f.b_down, b_.input_, out_.data());
        add_residual(l, r);
    }

    // The routed experts over the normed input (backend_cpu_moe.cpp); a shared experts' FFN before them left the
    // matmul input at its own activations.
    void ffn_experts(int32_t l, const ResidualPlan& r) override {
        if (b_.input_.x != xn_.data()) b_.input_.reset(xn_.data(), c_.dim, n_);
        b_.moe_ffn(prepared(l), vectors(l), n_, out_.data());
        add_residual(l, r);
    }

    // gemma4: per token, the projection of its (scaled) embedding to every layer's chunk, each chunk RMS-normed
    // with per_layer_proj_norm, plus its per_layer_token_embd row scaled by sqrt(per_layer_dim), all over sqrt(2),
    // in llama.cpp's order of operations. Kept as (n, n_layers, per_layer_dim) for per_layer_block.
    void per_layer_inputs() override {
        const int64_t pld = c_.per_layer_dim, width = int64_t{c_.n_layers} * pld, dim = c_.dim;
        per_layer_.resize(static_cast<size_t>(n_ * width));
        b_.input_.reset(x_.data(), dim, n_);
        b_.project(b_.prepared_.per_layer_model_proj, {}, b_.input_, per_layer_.data());
        const float proj_scale = 1.0f / std::sqrt(static_cast<float>(dim));
        const float tok_scale = std::sqrt(static_cast<float>(pld));
        const float in_scale = 1.0f / std::sqrt(2.0f);
        const WeightRef& te = b_.weights_.per_layer_token_embd;
        std::vector<float> row(static_cast<size_t>(width));
        for (int64_t i = 0; i < n_; ++i) {
            float* pi = per_layer_.data() + i * width;
            for (int64_t e = 0; e < width; ++e) pi[e] *= proj_scale;
            rmsnorm_rows(pi, b_.per_layer_proj_norm_, pi, c_.n_layers, pld, c_.rms_eps);
            dequantize_row(te.type, te.row(batch_.tokens[static_cast<size_t>(i)]), row.data(), width);
            for (int64_t e = 0; e < width; ++e) pi[e] = (pi[e] + row[static_cast<size_t>(e)] * tok_scale) * in_scale;
        }
    }

    // x += post_norm(proj(gelu(inp_gate x) * the layer's chunk of the per-layer inputs)).
    void per_layer_block(int32_t l) override {
        const PreparedLayer& pl = prepared(l);
        const int64_t pld = c_.per_layer_dim, width = int64_t{c_.n_layers} * pld, dim = c_.dim;
        const int64_t model_layer = b_.program_.first_layer + l;
        gate_.resize(static_cast<size_t>(n_ * pld));
        up_.resize(static_cast<size_t>(n_ * pld));
        b_.input_.reset(x_.data(), dim, n_);
        b_.project(pl.per_layer_gate, {}, b_.input_, gate_.data());
        for (int64_t i = 0; i < n_; ++i)
            std::copy_n(per_layer_.data() + i * width + model_layer * pld, pld, up_.data() + i * pld);
        glu_activation(FfnActivation::gelu_tanh, gate_.data(), up_.data(), n_ * pld, b_.n_threads_);
        b_.input_.reset(gate_.data(), pld, n_);
        b_.project(pl.per_layer_proj, {}, b_.input_, out_.data());
        add_residual(l, ResidualPlan{true, LayerRole::per_layer_post_norm, 1.0f});
    }

    void layer_output_scale(int32_t l) override {
        const std::vector<float>& s = vectors(l)[LayerRole::layer_out_scale];
        if (s.empty()) return;
        for (float& v : x_) v *= s[0];
    }

    void stream_out() override {
        std::copy(x_.begin(), x_.end(), batch_.hidden_out);
        b_.n_logit_rows_ = 0;
    }

    // The kept rows are one run of x unless the spans keep rows apart: those are gathered into out_, free by now.
    void final_norm(std::span<const RowRun> kept) override {
        const int64_t dim = c_.dim;
        rows_ = 0;
        for (const RowRun& r : kept) rows_ += r.count;
        const float* xl = x_.data() + kept.front().first * dim;
        if (kept.back().first + kept.back().count - kept.front().first != rows_) {
            int64_t row = 0;
            for (const RowRun& r : kept)
                for (int64_t i = 0; i < r.count; ++i, ++row)
                    std::copy_n(x_.data() + (r.first + i) * dim, dim, out_.data() + row * dim);
            xl = out_.data();
        }
        b_.norm_input(xl, b_.output_norm_, rows_, dim, xn_.data(), b_.prepared_.output);
    }

    void lm_head(int64_t rows, const LogitsPlan& plan) override {
        const int64_t vocab = c_.vocab;
        b_.logits_.resize(static_cast<size_t>(rows * vocab)); // (rows, vocab)
        b_.project(b_.prepared_.output, {}, b_.input_, b_.logits_.data());
        if (plan.softcap > 0.0f) softcap_f32(b_.logits_.data(), rows * vocab, plan.softcap);
        if (plan.multiplier != 1.0f)
            for (float& v : b_.logits_) v *= plan.multiplier;
        b_.n_logit_rows_ = static_cast<int>(rows);
    }

    HostRows projection_input(ProjectionInput which) override {
        switch (which) {
        case ProjectionInput::attn_output: return {att_.data(), n_, att_dim_};
        case ProjectionInput::ffn_down: return {gate_.data(), n_, ffn_dim_};
        case ProjectionInput::lm_head: return {xn_.data(), rows_, c_.dim};
        default: return {xn_.data(), n_, c_.dim};
        }
    }

private:
    const PreparedLayer& prepared(int32_t l) const { return b_.prepared_.layers[static_cast<size_t>(l)]; }
    const LayerVectors& vectors(int32_t l) const { return b_.layer_vectors_[static_cast<size_t>(l)]; }

    // A gated FFN's prepared projections and biases (the shared experts have none).
    struct Ffn {
        const PreparedProjection &gate, &up, &down;
        const FusedProjections& gate_up;
        const std::vector<float> &b_gate, &b_up, &b_down;
    };
    Ffn ffn(int32_t l, GatedFfn which) const {
        static const std::vector<float> kNone;
        const PreparedLayer& pl = prepared(l);
        const LayerVectors& lv = vectors(l);
        if (which == GatedFfn::shared_experts)
            return {pl.gate_shexp, pl.up_shexp, pl.down_shexp, pl.gate_up_shexp, kNone, kNone, kNone};
        return {pl.gate, pl.up, pl.down, pl.gate_up, lv[LayerRole::b_gate], lv[LayerRole::b_up], lv[LayerRole::b_down]};
    }

    // The projection whose format a block input is quantized for.
    const PreparedProjection& reader(int32_t l, LayerRole role) const {
        const PreparedLayer& pl = prepared(l);
        switch (role) {
        case LayerRole::w_gate: return pl.gate;
        case LayerRole::ffn_gate_inp: return pl.router;
        default: return pl.q;
        }
    }

    // x += scale * post_norm(out).
    void add_residual(int32_t l, const ResidualPlan& r) {
        const int64_t dim = c_.dim;
        if (r.post_norm) rmsnorm_rows(out_.data(), vectors(l)[r.norm], out_.data(), n_, dim, c_.rms_eps);
        if (r.scale != 1.0f)
            for (int64_t e = 0; e < n_ * dim; ++e) x_[static_cast<size_t>(e)] += out_[static_cast<size_t>(e)] * r.scale;
        else
            for (int64_t e = 0; e < n_ * dim; ++e) x_[static_cast<size_t>(e)] += out_[static_cast<size_t>(e)];
    }

    CpuBackend& b_;
    const ModelConfig& c_;
    const ForwardBatch& batch_;
    int64_t n_ = 0;
    SequenceSpan single_;
    std::span<const SequenceSpan> spans_;
    std::vector<int32_t> span_pos0_, token_seq_, token_pos_;
    std::vector<float> x_;    // (n, dim) residual stream
    std::vector<float> xn_;   // (n, dim) a block's input
    std::vector<float> q_, k_, v_, att_;   // per layer: (n, n_heads*head_dim) ...
    std::vector<float> gate_, up_;         // (n, ffn_dim)
    std::vector<float> out_;               // (n, dim) a block's output
    std::vector<float> per_layer_;         // (n, n_layers, per_layer_dim) gemma4's per-layer inputs
    int64_t att_dim_ = 0, ffn_dim_ = 0, rows_ = 0;
};

void CpuBackend::forward(const ForwardBatch& batch) {
    if (!loaded_) throw UsageError("forward: the backend has no model loaded");
    check_forward_batch(batch, kv_.n_past(), kv_.n_ctx(), config_.vocab, [this](int32_t seq) { return kv_.n_past(seq); });
    Steps steps(*this, batch);
    run_decoder(program_, batch, steps, observer_);
    steps.commit();
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
