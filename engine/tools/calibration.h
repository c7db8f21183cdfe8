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
    // Only inputs up to kMaxMomentWidth wide get one (width^2 floats and width^2 multiply-adds per token:
    // 8192-wide inputs would cost 256 MB and hours each); matrices that read the same input (attn_k/v,
    // ffn_up) are not stored again but named in moment_owner.
    std::map<std::string, std::vector<float>> moments;
    std::map<std::string, std::string> moment_owner;      // tensor name -> the name its moments are under
    const std::vector<float>* moments_of(const std::string& tensor) const;
};

inline constexpr int64_t kMaxMomentWidth = 2048;

// Evaluates `tokens` in independent chunks of n_ctx (each starting with `bos` when >= 0), with
// n_threads threads. Covers every matrix of the forward: attn_q/k/v/output, ffn_gate/up/down and
// output (token_embd too when the output is tied). second_moments also fills `moments` (16 MB per
// distinct input of width 2048; inputs wider than kMaxMomentWidth get none).
ImportanceMatrix collect_importance(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx, int32_t bos,
                                    int n_threads, bool second_moments = false);

// The same statistics split for a held-out check (quant/imatrix_select.h): `fit` from the even
// chunks of n_ctx tokens, `check` (with its second moments) from the odd ones (from the two halves
// when there is about one chunk), and `all` the token-weighted mean of their columns, i.e.
// collect_importance over every token. fit_moments: `fit` and `all` get second moments too (the
// error-compensating quantizer of quant/compensated.h is built from them).
struct SplitImportance {
    ImportanceMatrix fit, check, all;
    std::vector<int32_t> check_tokens;   // the held-out half itself, for a model-level check
    int32_t check_n_ctx = 0, bos = -1;   // how the caller evaluates check_tokens (it sets them)
};
SplitImportance collect_importance_split(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx,
                                         int32_t bos, int n_threads, bool fit_moments = false);

} // namespace tern
