#include "engine/quantize/importance.h"

#include <algorithm>

#include "engine/weights.h"

namespace tern {
namespace {

// Adds the squares of the n_rows x width activations x to acc (width).
void accumulate(std::vector<float>& acc, const float* x, int64_t n_rows, int64_t width) {
    if (acc.empty()) acc.assign(static_cast<size_t>(width), 0.0f);
    for (int64_t c = 0; c < n_rows; ++c)
        for (int64_t i = 0; i < width; ++i) acc[static_cast<size_t>(i)] += x[c * width + i] * x[c * width + i];
}

// Adds the outer products x x^T of the n_rows activations to acc (width x width).
void accumulate_moments(std::vector<float>& acc, const float* x, int64_t n_rows, int64_t width) {
    if (acc.empty()) acc.assign(static_cast<size_t>(width * width), 0.0f);
    for (int64_t c = 0; c < n_rows; ++c) {
        const float* xc = x + c * width;
        for (int64_t i = 0; i < width; ++i) {
            float* row = acc.data() + i * width;
            const float xi = xc[i];
            for (int64_t j = 0; j < width; ++j) row[j] += xi * xc[j];
        }
    }
}

} // namespace

ImportanceObserver::ImportanceObserver(const ModelWeights& weights, bool second_moments)
    : weights_(weights), second_moments_(second_moments) {}

const std::string& ImportanceObserver::tensor_name(int32_t layer, ProjectionInput which) const {
    if (which == ProjectionInput::lm_head) return weights_.output.name;
    const LayerWeights& lw = weights_.layers.at(static_cast<size_t>(layer));
    switch (which) {
    case ProjectionInput::attn_qkv: return lw.wq.name;
    case ProjectionInput::attn_output: return lw.wo.name;
    case ProjectionInput::ffn_gate_up: return lw.w_gate.name;
    case ProjectionInput::ffn_down: return lw.w_down.name;
    case ProjectionInput::lm_head: break;
    }
    return weights_.output.name;
}

void ImportanceObserver::matmul_input(int32_t layer, ProjectionInput which, const float* x, int64_t n_rows,
                                      int64_t width) {
    const std::string& name = tensor_name(layer, which);
    accumulate(sums_.columns[name], x, n_rows, width);
    if (second_moments_ && width <= kMaxMomentWidth) accumulate_moments(sums_.moments[name], x, n_rows, width);
    if (which == ProjectionInput::lm_head) sums_.tokens += n_rows;   // every token passes the lm_head once
}

ImportanceMatrix ImportanceObserver::finish() {
    ImportanceMatrix im = std::move(sums_);
    sums_ = {};
    std::map<std::string, std::vector<float>>& acc = im.columns;
    // Matrices that read the same input share its statistics; turn sums into means.
    for (const LayerWeights& lw : weights_.layers) {
        acc[lw.wk.name] = acc[lw.wq.name];
        acc[lw.wv.name] = acc[lw.wq.name];
        acc[lw.w_up.name] = acc[lw.w_gate.name];
        if (!second_moments_) continue;
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

} // namespace tern
