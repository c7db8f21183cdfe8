#pragma once
// Calibration for `tern quantize --calibrate`: run a model (CPU, f32) over a text and collect, for
// every weight matrix, the mean squared activation of each input column (an "importance matrix").
// The quantizers of quant/imatrix.h use it to weight their error.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace tern {

struct Model;

struct ImportanceMatrix {
    std::map<std::string, std::vector<float>> columns;   // tensor name -> mean x_c^2 per input column
    int64_t tokens = 0;                                   // activations averaged over
};

// Evaluates `tokens` in independent chunks of n_ctx (each starting with `bos` when >= 0), with
// n_threads threads. Covers every matrix of the forward: attn_q/k/v/output, ffn_gate/up/down and
// output (token_embd too when the output is tied).
ImportanceMatrix collect_importance(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx, int32_t bos,
                                    int n_threads);

} // namespace tern
