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
    // With second_moments: tensor name -> mean x x^T (width x width, row-major). The diagonal
    // approximation above ignores how columns move together; the held-out check must not.
    std::map<std::string, std::vector<float>> moments;
};

// Evaluates `tokens` in independent chunks of n_ctx (each starting with `bos` when >= 0), with
// n_threads threads. Covers every matrix of the forward: attn_q/k/v/output, ffn_gate/up/down and
// output (token_embd too when the output is tied). second_moments also fills `moments`
// (width^2 floats per matrix: fine for small models, ~1 GB for a 270M one).
ImportanceMatrix collect_importance(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx, int32_t bos,
                                    int n_threads, bool second_moments = false);

// The same statistics split for a held-out check (quant/imatrix_select.h): `fit` from the even
// chunks of n_ctx tokens, `check` (with its second moments) from the odd ones (from the two halves
// when there is about one chunk), and `all` the token-weighted mean of their columns, i.e.
// collect_importance over every token.
struct SplitImportance {
    ImportanceMatrix fit, check, all;
    std::vector<int32_t> check_tokens;   // the held-out half itself, for a model-level check
    int32_t check_n_ctx = 0, bos = -1;   // how the caller evaluates check_tokens (it sets them)
};
SplitImportance collect_importance_split(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx,
                                         int32_t bos, int n_threads);

} // namespace tern
