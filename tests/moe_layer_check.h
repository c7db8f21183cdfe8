#pragma once
// The mixture-of-experts FFN of every layer of a model against a scalar reference, shared by the MoE families'
// suites (test_moe: qwen3moe, Mixtral; test_gpt_oss): each layer runs alone on the CPU backend as a one-layer slice
// from a random residual stream (the model's attention output zeroed beforehand, so the layer adds only its FFN),
// in exact mode (f32 over the dequantized weights) and the default one (quantized activations), and each token's
// output is compared with `reference` (the residual plus the FFN, in double).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "engine/cpu/backend_cpu.h"
#include "engine/model.h"

namespace tern::test {

// The reference output of one token (x: its residual stream); near_tie set where the router's choice is too
// close to call, so that the token is skipped.
using FfnReference =
    std::function<std::vector<double>(const ModelConfig&, const LayerWeights&, const float* x, bool& near_tie)>;

inline void check_moe_layers(const Model& m, uint32_t seed, const FfnReference& reference) {
    for (int32_t layer = 0; layer < m.config.n_layers; ++layer) {
        CAPTURE(layer);
        ModelConfig c = m.config;
        c.n_layers = 1;
        c.layers = {m.config.layers[size_t(layer)]};
        ModelWeights w;
        w.output_norm = m.weights.output_norm;
        w.layers = {m.weights.layers[size_t(layer)]};
        const int64_t n = 13, dim = c.dim;
        std::mt19937 rng(seed + static_cast<uint32_t>(layer));
        std::normal_distribution<float> dist(0.0f, 1.0f);
        std::vector<float> x(size_t(n * dim));
        for (float& v : x) v = dist(rng);
        const std::vector<int32_t> tokens(size_t(n), 0);
        for (const bool exact : {true, false}) {
            CAPTURE(exact);
            CpuOptions o;
            o.n_threads = 2;
            o.exact_matmul = exact;
            CpuBackend b(o);
            b.load(c, w, RunOptions{64, KvType::f32});
            std::vector<float> y(size_t(n * dim));
            ForwardBatch batch;
            batch.tokens = tokens;
            batch.hidden_in = x.data();
            batch.hidden_out = y.data();
            b.forward(batch);
            int checked = 0;
            for (int64_t i = 0; i < n; ++i) {
                bool near_tie = false;
                const std::vector<double> ref = reference(c, w.layers[0], x.data() + i * dim, near_tie);
                if (near_tie) continue;
                ++checked;
                double err = 0, mag = 0;
                for (int64_t d = 0; d < dim; ++d) {
                    err = std::max(err, std::abs(double(y[size_t(i * dim + d)]) - ref[size_t(d)]));
                    mag = std::max(mag, std::abs(ref[size_t(d)] - x[size_t(i * dim + d)]));   // the FFN's output
                }
                CAPTURE(i);
                // exact: f32 arithmetic over the same dequantized weights; default: quantized activations.
                CHECK(err <= (exact ? 1e-4 : 3e-2) * std::max(mag, 1.0));
            }
            CHECK(checked >= n - 3);
        }
    }
}

} // namespace tern::test
