// A plain f32 forward (the same math as the CPU backend's, without a KV cache: each chunk is one
// causal sequence) that records the inputs of every matrix product. Kept separate from the
// backends so their hot paths carry no instrumentation.
#include "engine/tools/calibration.h"

#include <algorithm>
#include <cmath>

#include "engine/model.h"
#include "kernels/cpu/ops.h"
#include "quant/reference.h"

namespace tern {
namespace {

// Adds the squares of the n_cols x width activations x to acc (width).
void accumulate(std::vector<float>& acc, const float* x, int64_t n_cols, int64_t width) {
    if (acc.empty()) acc.assign(static_cast<size_t>(width), 0.0f);
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t i = 0; i < width; ++i) acc[static_cast<size_t>(i)] += x[c * width + i] * x[c * width + i];
}

std::vector<float> vec(const WeightRef& w) {
    if (!w.present()) return {};
    std::vector<float> v(static_cast<size_t>(w.n_in()));
    dequantize_row(w.type, w.data, v.data(), w.n_in());
    return v;
}

// Adds the outer products x x^T of the n_cols activations to acc (width x width).
void accumulate_moments(std::vector<float>& acc, const float* x, int64_t n_cols, int64_t width) {
    if (acc.empty()) acc.assign(static_cast<size_t>(width * width), 0.0f);
    for (int64_t c = 0; c < n_cols; ++c) {
        const float* xc = x + c * width;
        for (int64_t i = 0; i < width; ++i) {
            float* row = acc.data() + i * width;
            const float xi = xc[i];
            for (int64_t j = 0; j < width; ++j) row[j] += xi * xc[j];
        }
    }
}

void project(const WeightRef& w, const WeightRef& b, const float* x, int64_t n, float* y, int nt) {
    matmul_dequant(w.type, w.data, w.n_in(), w.n_out(), x, n, y, nt);
    if (!b.present()) return;
    const std::vector<float> bias = vec(b);
    for (int64_t c = 0; c < n; ++c)
        for (int64_t r = 0; r < w.n_out(); ++r) y[c * w.n_out() + r] += bias[static_cast<size_t>(r)];
}

} // namespace

ImportanceMatrix collect_importance(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx, int32_t bos,
                                    int nt, bool second_moments) {
    const ModelConfig& c = model.config;
    const ModelWeights& W = model.weights;
    ImportanceMatrix im;
    std::map<std::string, std::vector<float>>& acc = im.columns;
    auto record = [&](const std::string& name, const float* x, int64_t n_cols, int64_t width) {
        accumulate(acc[name], x, n_cols, width);
        if (second_moments && width <= kMaxMomentWidth) accumulate_moments(im.moments[name], x, n_cols, width);
    };
    const int64_t dim = c.dim, hd = c.head_dim, hdv = c.head_dim_v;
    const auto rope = c.rope_style == RopeStyle::neox ? rope_neox_f32 : rope_normal_f32;
    const std::vector<float> freq = vec(W.rope_freqs);
    const float* ff = freq.empty() ? nullptr : freq.data();
    const std::vector<float> out_norm = vec(W.output_norm);

    for (size_t start = 0; start + 2 <= tokens.size(); start += static_cast<size_t>(n_ctx)) {
        const int64_t n = std::min<int64_t>(n_ctx, static_cast<int64_t>(tokens.size() - start));
        std::vector<int32_t> tok(tokens.begin() + static_cast<int64_t>(start), tokens.begin() + static_cast<int64_t>(start) + n);
        if (bos >= 0) tok[0] = bos;
        std::vector<float> x(static_cast<size_t>(n * dim)), xn(x.size()), out(x.size());
        for (int64_t i = 0; i < n; ++i) {
            dequantize_row(W.token_embd.type, W.token_embd.row(tok[static_cast<size_t>(i)]), x.data() + i * dim, dim);
            if (c.embed_scale != 1.0f)
                for (int64_t d = 0; d < dim; ++d) x[static_cast<size_t>(i * dim + d)] *= c.embed_scale;
        }
        for (int32_t l = 0; l < c.n_layers; ++l) {
            const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
            const LayerWeights& lw = W.layers[static_cast<size_t>(l)];
            const int64_t nh = lc.n_heads, nkv = lc.n_kv_heads, qd = nh * hd, kd = nkv * hd, vd = nkv * hdv;
            const std::vector<float> an = vec(lw.attn_norm), fn = vec(lw.ffn_norm);
            for (int64_t i = 0; i < n; ++i) rmsnorm_f32(&x[i * dim], an.data(), &xn[i * dim], dim, c.rms_eps);
            record(lw.wq.name, xn.data(), n, dim);
            acc[lw.wk.name];
            acc[lw.wv.name];
            std::vector<float> q(static_cast<size_t>(n * qd)), k(static_cast<size_t>(n * kd)), v(static_cast<size_t>(n * vd));
            project(lw.wq, lw.bq, xn.data(), n, q.data(), nt);
            project(lw.wk, lw.bk, xn.data(), n, k.data(), nt);
            project(lw.wv, lw.bv, xn.data(), n, v.data(), nt);
            const std::vector<float> qn = vec(lw.q_norm), kn = vec(lw.k_norm);
            for (int64_t i = 0; i < n; ++i) {
                for (int64_t h = 0; h < nh; ++h) {
                    float* p = &q[i * qd + h * hd];
                    if (c.qk_norm) rmsnorm_f32(p, qn.data(), p, hd, c.rms_eps);
                    rope(p, hd, c.n_rot, static_cast<int32_t>(i), lc.rope_base, lc.rope_freq_scale, ff);
                }
                for (int64_t h = 0; h < nkv; ++h) {
                    float* p = &k[i * kd + h * hd];
                    if (c.qk_norm) rmsnorm_f32(p, kn.data(), p, hd, c.rms_eps);
                    rope(p, hd, c.n_rot, static_cast<int32_t>(i), lc.rope_base, lc.rope_freq_scale, ff);
                }
            }
            // Per KV head, the rows of every position contiguous, as attention_head reads them.
            std::vector<float> kh(static_cast<size_t>(nkv * n * hd)), vh(static_cast<size_t>(nkv * n * hdv));
            for (int64_t h = 0; h < nkv; ++h)
                for (int64_t i = 0; i < n; ++i) {
                    std::copy_n(&k[i * kd + h * hd], hd, &kh[(h * n + i) * hd]);
                    std::copy_n(&v[i * vd + h * hdv], hdv, &vh[(h * n + i) * hdv]);
                }
            std::vector<float> att(static_cast<size_t>(n * nh * hdv)), scores(static_cast<size_t>(n));
            for (int64_t i = 0; i < n; ++i)
                for (int64_t h = 0; h < nh; ++h) {
                    const int64_t g = h / (nh / nkv);
                    const int64_t lo = lc.sliding_window > 0 ? std::max<int64_t>(0, i - lc.sliding_window + 1) : 0;
                    attention_head(&q[i * qd + h * hd], &kh[(g * n + lo) * hd], &vh[(g * n + lo) * hdv], KvElem::f32,
                                   i - lo + 1, hd, hdv, c.attn_scale, c.attn_softcap, scores.data(),
                                   &att[(i * nh + h) * hdv]);
                }
            record(lw.wo.name, att.data(), n, nh * hdv);
            project(lw.wo, lw.bo, att.data(), n, out.data(), nt);
            if (c.post_norms) {
                const std::vector<float> pn = vec(lw.post_attn_norm);
                for (int64_t i = 0; i < n; ++i) rmsnorm_f32(&out[i * dim], pn.data(), &out[i * dim], dim, c.rms_eps);
            }
            for (size_t e = 0; e < x.size(); ++e) x[e] += out[e];

            for (int64_t i = 0; i < n; ++i) rmsnorm_f32(&x[i * dim], fn.data(), &xn[i * dim], dim, c.rms_eps);
            record(lw.w_gate.name, xn.data(), n, dim);
            acc[lw.w_up.name];
            const int64_t fd = lc.ffn_dim;
            std::vector<float> gate(static_cast<size_t>(n * fd)), up(gate.size());
            project(lw.w_gate, lw.b_gate, xn.data(), n, gate.data(), nt);
            project(lw.w_up, lw.b_up, xn.data(), n, up.data(), nt);
            if (c.ffn_act == FfnActivation::silu) swiglu_f32(gate.data(), up.data(), gate.data(), n * fd);
            else geglu_tanh_f32(gate.data(), up.data(), gate.data(), n * fd);
            record(lw.w_down.name, gate.data(), n, fd);
            project(lw.w_down, lw.b_down, gate.data(), n, out.data(), nt);
            if (c.post_norms) {
                const std::vector<float> pn = vec(lw.post_ffn_norm);
                for (int64_t i = 0; i < n; ++i) rmsnorm_f32(&out[i * dim], pn.data(), &out[i * dim], dim, c.rms_eps);
            }
            for (size_t e = 0; e < x.size(); ++e) x[e] += out[e];
            // q/k/v (gate/up) share one input: copy the sums after the chunk (below).
        }
        for (int64_t i = 0; i < n; ++i) rmsnorm_f32(&x[i * dim], out_norm.data(), &xn[i * dim], dim, c.rms_eps);
        record(W.output.name, xn.data(), n, dim);
        im.tokens += n;
    }
    // Matrices that read the same input share its statistics; turn sums into means.
    for (const LayerWeights& lw : W.layers) {
        acc[lw.wk.name] = acc[lw.wq.name];
        acc[lw.wv.name] = acc[lw.wq.name];
        acc[lw.w_up.name] = acc[lw.w_gate.name];
        if (!second_moments) continue;
        im.moment_owner[lw.wk.name] = im.moment_owner[lw.wv.name] = lw.wq.name;
        im.moment_owner[lw.w_up.name] = lw.w_gate.name;
    }
    for (auto* m : {&acc, &im.moments})
        for (auto& [name, v] : *m)
            for (float& e : v) e /= static_cast<float>(std::max<int64_t>(1, im.tokens));
    return im;
}

const std::vector<float>* ImportanceMatrix::moments_of(const std::string& tensor) const {
    const auto owner = moment_owner.find(tensor);
    const auto it = moments.find(owner == moment_owner.end() ? tensor : owner->second);
    return it == moments.end() ? nullptr : &it->second;
}

namespace {

// a = wa * a + (1 - wa) * b, element by element, for vectors of equal size (else a is kept).
void mix_into(std::vector<float>& a, const std::vector<float>& b, double wa) {
    if (a.size() != b.size()) return;
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(wa * a[i] + (1.0 - wa) * b[i]);
}

} // namespace

SplitImportance collect_importance_split(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx,
                                         int32_t bos, int nt, bool fit_moments) {
    std::vector<int32_t> even, odd;
    const auto chunk = static_cast<size_t>(n_ctx);
    if (tokens.size() < chunk + 16) {
        // About one chunk: two halves, so both sides see activations (a 1-token odd chunk would not).
        even.assign(tokens.begin(), tokens.begin() + static_cast<int64_t>(tokens.size() / 2));
        odd.assign(tokens.begin() + static_cast<int64_t>(tokens.size() / 2), tokens.end());
    } else {
        // Whole chunks alternate, so every chunk is evaluated exactly as collect_importance would.
        for (size_t start = 0, k = 0; start < tokens.size(); start += chunk, ++k) {
            const size_t end = std::min(tokens.size(), start + chunk);
            std::vector<int32_t>& side = k % 2 == 0 ? even : odd;
            side.insert(side.end(), tokens.begin() + static_cast<int64_t>(start), tokens.begin() + static_cast<int64_t>(end));
        }
    }
    SplitImportance s;
    s.fit = collect_importance(model, even, n_ctx, bos, nt, fit_moments);
    s.check = collect_importance(model, odd, n_ctx, bos, nt, true);
    s.check_tokens = std::move(odd);
    s.all.tokens = s.fit.tokens + s.check.tokens;
    const double wf = s.all.tokens ? double(s.fit.tokens) / double(s.all.tokens) : 0.5;
    s.all.columns = s.fit.columns;
    for (auto& [name, v] : s.all.columns)
        if (const auto it = s.check.columns.find(name); it != s.check.columns.end()) mix_into(v, it->second, wf);
    if (fit_moments) {
        s.all.moments = s.fit.moments;
        s.all.moment_owner = s.fit.moment_owner;
        for (auto& [name, v] : s.all.moments)
            if (const auto it = s.check.moments.find(name); it != s.check.moments.end()) mix_into(v, it->second, wf);
    }
    return s;
}

} // namespace tern
