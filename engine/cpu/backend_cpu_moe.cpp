// The CPU backend's routed experts (a layer with LayerConfig::moe; shared experts are the dense FFN's steps): route
// each token (engine/moe_router.h), then run each expert once over the tokens that chose it, then sum every token's
// experts in rank order.
//
// Batch invariance: a token's output bits do not depend on the other tokens of the batch. Its routing reads only
// its own logits; each expert's matmuls take that expert's tokens as columns, and the kernels' per-column
// arithmetic does not depend on how many columns there are; its input row is quantized on its own; the sum over
// its experts runs in rank order. Decode (one token) reads only its n_expert_used experts' rows.
#include <algorithm>
#include <cstring>
#include <vector>

#include "engine/cpu/backend_cpu.h"
#include "engine/moe_router.h"
#include "kernels/cpu/ops.h"

namespace tern {

void CpuBackend::moe_ffn(const PreparedLayer& pl, const LayerVectors& lv, int64_t n, float* out) {
    const ModelConfig& c = config_;
    const int64_t dim = c.dim, n_expert = c.n_expert, k = c.n_expert_used, ffn = c.expert_ffn_dim;
    const float* xn = input_.x;   // (n, dim): the normed input, quantized for the router by norm_input

    // Router logits (n, n_expert), then each token's experts and weights (n, k).
    std::vector<float> logits(static_cast<size_t>(n * n_expert)), probs(static_cast<size_t>(2 * n_expert));
    const std::vector<float>& selection_bias = lv[LayerRole::exp_probs_b];
    project(pl.router, lv[LayerRole::ffn_gate_inp_b], input_, logits.data());
    std::vector<int32_t> ids(static_cast<size_t>(n * k));
    std::vector<float> weights(static_cast<size_t>(n * k));
    for (int64_t i = 0; i < n; ++i)
        route_experts(logits.data() + i * n_expert, c, probs.data(), ids.data() + i * k, weights.data() + i * k,
                      selection_bias.empty() ? nullptr : selection_bias.data());

    // The (token, rank) slots grouped by expert, tokens in batch order within an expert.
    std::vector<int64_t> first(static_cast<size_t>(n_expert + 1), 0);
    for (const int32_t e : ids) ++first[static_cast<size_t>(e) + 1];
    for (int64_t e = 0; e < n_expert; ++e) first[static_cast<size_t>(e + 1)] += first[static_cast<size_t>(e)];
    std::vector<int64_t> slots(static_cast<size_t>(n * k));   // token * k + rank
    {
        std::vector<int64_t> next(first.begin(), first.end() - 1);
        for (int64_t s = 0; s < n * k; ++s) slots[static_cast<size_t>(next[static_cast<size_t>(ids[static_cast<size_t>(s)])]++)] = s;
    }

    // Each chosen expert over its tokens: gather their inputs, gate/up, activation, down, scatter to the slots.
    std::vector<float> expert_out(static_cast<size_t>(n * k * dim));   // (n, k, dim)
    std::vector<float> xe, gate, up, ye;
    static const std::vector<float> kNoBias;
    for (int64_t e = 0; e < n_expert; ++e) {
        const int64_t s0 = first[static_cast<size_t>(e)], m = first[static_cast<size_t>(e + 1)] - s0;
        if (m == 0) continue;
        xe.resize(static_cast<size_t>(m * dim));
        for (int64_t j = 0; j < m; ++j)
            std::memcpy(xe.data() + j * dim, xn + (slots[static_cast<size_t>(s0 + j)] / k) * dim,
                        static_cast<size_t>(dim) * sizeof(float));
        gate.resize(static_cast<size_t>(m * ffn));
        up.resize(static_cast<size_t>(m * ffn));
        ye.resize(static_cast<size_t>(m * dim));
        const auto ue = static_cast<size_t>(e);
        input_.reset(xe.data(), dim, m);
        const auto bias = [&](const std::vector<std::vector<float>>& rows) -> const std::vector<float>& {
            return rows.empty() ? kNoBias : rows[ue];
        };
        project_shared(pl.gate_up_exps[ue], {&pl.gate_exps[ue], &pl.up_exps[ue]},
                       {&bias(lv.rows_of(LayerRole::gate_exps_b)), &bias(lv.rows_of(LayerRole::up_exps_b))}, input_, {gate.data(), up.data()});
        glu_activation(c.ffn_act, gate.data(), up.data(), m * ffn, n_threads_);
        input_.reset(gate.data(), ffn, m);
        project(pl.down_exps[ue], bias(lv.rows_of(LayerRole::down_exps_b)), input_, ye.data());
        for (int64_t j = 0; j < m; ++j)
            std::memcpy(expert_out.data() + slots[static_cast<size_t>(s0 + j)] * dim, ye.data() + j * dim,
                        static_cast<size_t>(dim) * sizeof(float));
    }

    // out = sum over ranks r of weight_r * expert_out_r, in rank order.
    for (int64_t i = 0; i < n; ++i) {
        float* o = out + i * dim;
        const float* y = expert_out.data() + i * k * dim;
        const float* w = weights.data() + i * k;
        for (int64_t d = 0; d < dim; ++d) o[d] = w[0] * y[d];
        for (int64_t r = 1; r < k; ++r)
            for (int64_t d = 0; d < dim; ++d) o[d] += w[r] * y[r * dim + d];
    }
}

} // namespace tern
