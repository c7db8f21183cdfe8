#pragma once
// Calibration for `tern quantize --calibrate`: run a model through the ordinary CPU backend over a
// text, with an ImportanceObserver (importance.h) watching every projection's input. The forward
// runs with dequantized f32 matmuls and an f32 KV cache, so the statistics are those of the model's
// own weights, unrounded activations included.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/quantize/importance.h"

namespace tern {

struct Model;

// Evaluates `tokens` in independent chunks of n_ctx (each starting with `bos` when >= 0; a last chunk of
// one token is skipped), with n_threads threads. Covers every matrix of the forward: attn_q/k/v/output,
// ffn_gate/up/down and output (token_embd too when the output is tied). second_moments also fills
// `moments` (16 MB per distinct input of width 2048; inputs wider than kMaxMomentWidth get none).
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
    int32_t check_n_ctx = 0, bos = -1;   // how the model-level check evaluates check_tokens
};
SplitImportance collect_importance_split(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx,
                                         int32_t bos, int n_threads, bool fit_moments = false);

// What calibrate_model measured and how.
struct Calibration {
    SplitImportance importance;
    int32_t n_ctx = 0;      // chunk length: the model's training context, at most 512
    double seconds = 0.0;   // spent in the forwards
};

// The whole calibration of the model file at model_path on `text`: tokenized with the model's own
// vocabulary (BOS as it asks), cut to at most 64 chunks, split for the held-out check, with the model-level
// check's chunk length chosen so the held-out half gives perplexity two chunks. Throws InputError naming
// `text_name` when the text has under 16 tokens.
Calibration calibrate_model(const std::string& model_path, const std::string& text, const std::string& text_name,
                            int n_threads, bool fit_moments);

} // namespace tern
