#pragma once
// The held-out checks of `tern quantize --calibrate`. Statistics measured on a few hundred tokens can
// overfit, so calibration must win on the half of the text it was not fitted on, twice over:
// per tensor (quant/imatrix_select.h: the output error on the check half's activations) and for the
// model as a whole (the mean NLL of the check half's tokens), because each tensor's output error
// can shrink while the model's perplexity grows (stories260K).
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/quantize/calibration.h"
#include "engine/quantize/convert.h"
#include "formats/gguf.h"
#include "quant/plan.h"

namespace tern {

// Per plan tensor, how the candidate files are quantized.
struct CalibrationSelection {
    std::vector<TensorCalibration> fit;   // the statistics of the fit half, for the model-level check
    std::vector<TensorCalibration> all;   // the same tensors with the statistics of the whole text
    size_t n_candidates = 0;   // converted tensors calibration could apply to
    size_t n_selected = 0;     // those where it won the per-tensor check
};

// Runs the per-tensor check on every converted tensor of `plan` whose target format takes importance
// weights (judged on the check half's second moments; an input wider than kMaxMomentWidth has none
// and skips this check) or error compensation (needs the moments, so wider inputs keep the reference
// quantizer). Per-row errors are added in row order, so the choice is the same for every thread count.
// Throws the interruption error (convert.h) when cancel is raised between tensors.
CalibrationSelection select_calibrated_tensors(const GgufFile& in, const QuantPlan& plan, const SplitImportance& im,
                                               int n_threads, const std::atomic<bool>* cancel);

// Whether one tensor's calibrated form has the smaller output error on the check activations.
bool weighted_wins_held_out(const GgufTensor& src, const PlannedTensor& t, const std::vector<float>& fit,
                            const std::vector<float>& check_moments, int n_threads);
bool compensated_wins_held_out(const GgufTensor& src, const PlannedTensor& t, const std::vector<float>& fit_moments,
                               const std::vector<float>& check_moments, int n_threads);

struct HeldOutCheck {
    double nll_calibrated = 0, nll_reference = 0;
    int64_t tokens_scored = 0;
    // Strictly lower: a tie writes the default bytes.
    bool calibrated_wins() const { return nll_calibrated < nll_reference; }
};

// The mean NLL of both written candidate files on the held-out tokens (engine/tools/perplexity.h's
// method, chunks of n_ctx, the same for both, so the difference is paired), each run on the CPU with an
// f16 KV cache. Throws RuntimeFailure when a model does not fit in memory.
HeldOutCheck held_out_check(const std::string& calibrated_path, const std::string& reference_path,
                            const std::vector<int32_t>& tokens, int32_t n_ctx, int32_t bos, int n_threads,
                            const std::atomic<bool>* cancel);

} // namespace tern
