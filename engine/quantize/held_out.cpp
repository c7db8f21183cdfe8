#include "engine/quantize/held_out.h"

#include <algorithm>
#include <memory>
#include <string>

#include "base/error.h"
#include "engine/open_model.h"
#include "engine/tools/perplexity.h"
#include "quant/compensated.h"
#include "quant/imatrix.h"
#include "quant/imatrix_select.h"
#include "quant/reference.h"

namespace tern {
namespace {

const std::vector<float>* find_importance(const ImportanceMatrix& im, const PlannedTensor& t) {
    const auto it = im.columns.find(t.name);
    if (it == im.columns.end() || static_cast<int64_t>(it->second.size()) != t.ne[0]) return nullptr;
    return &it->second;
}

const std::vector<float>* find_moments(const ImportanceMatrix& im, const PlannedTensor& t) {
    const std::vector<float>* m = im.moments_of(t.name);
    return m && static_cast<int64_t>(m->size()) == t.ne[0] * t.ne[0] ? m : nullptr;
}

// Does quantizing with what the fit half measured give a smaller output error on the check half's
// activations than the reference quantizer? score_row(row) gives both errors of one row.
template <class ScoreRow>
bool calibration_wins_held_out(const GgufTensor& src, const PlannedTensor& t, int n_threads, const ScoreRow& score_row) {
    const int64_t width = t.ne[0], rows = src.n_rows();
    const size_t in_row = src.row_size();
    std::vector<HeldOutErrors> per_row(static_cast<size_t>(rows));
    std::string error;
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(n_threads, rows)))
    {
        std::vector<float> buf(static_cast<size_t>(width));
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < rows; ++r) {
            try {
                dequantize_row(src.type, src.data + static_cast<size_t>(r) * in_row, buf.data(), width);
                per_row[static_cast<size_t>(r)] = score_row(buf.data());
            } catch (const std::exception& e) {
#pragma omp critical(tern_quantize_error)
                if (error.empty()) error = "tensor " + t.name + ", row " + std::to_string(r) + ": " + e.what();
            }
        }
    }
    if (!error.empty()) throw InputError(error);
    HeldOutErrors sum;
    for (const HeldOutErrors& e : per_row) sum += e;
    return sum.keep_weighted();
}

// The mean NLL of the model file at `path` on `tokens`.
PerplexityResult score_file(const std::string& path, const std::vector<int32_t>& tokens, int32_t n_ctx, int32_t bos,
                            int n_threads, const std::atomic<bool>* cancel) {
    OpenRequest request;
    request.path = path;
    request.n_ctx = n_ctx;
    request.kv_type = KvType::f16;
    request.device = "cpu";
    request.cpu.n_threads = n_threads;
    const OpenedModel opened = open_model(request);
    Backend* backend = opened.backend.get();
    PerplexityOptions po;
    po.n_ctx = n_ctx;
    po.n_batch = 512;
    po.bos = bos;
    po.cancel = cancel;
    return compute_perplexity(*backend, tokens, po);
}

} // namespace

bool weighted_wins_held_out(const GgufTensor& src, const PlannedTensor& t, const std::vector<float>& fit,
                            const std::vector<float>& check_moments, int n_threads) {
    return calibration_wins_held_out(src, t, n_threads, [&](const float* row) {
        return held_out_errors(t.to, row, t.ne[0], fit.data(), check_moments.data());
    });
}

bool compensated_wins_held_out(const GgufTensor& src, const PlannedTensor& t, const std::vector<float>& fit_moments,
                               const std::vector<float>& check_moments, int n_threads) {
    const CompensationFactor factor = compensation_factor(fit_moments.data(), t.ne[0]);
    return calibration_wins_held_out(src, t, n_threads, [&](const float* row) {
        return held_out_errors_compensated(t.to, row, factor, check_moments.data());
    });
}

CalibrationSelection select_calibrated_tensors(const GgufFile& in, const QuantPlan& plan, const SplitImportance& im,
                                               int n_threads, const std::atomic<bool>* cancel) {
    CalibrationSelection s;
    s.fit.resize(plan.tensors.size());
    s.all.resize(plan.tensors.size());
    for (size_t i = 0; i < plan.tensors.size(); ++i) {
        if (cancel && cancel->load()) throw_quantize_interrupted();
        const PlannedTensor& t = plan.tensors[i];
        if (!t.converted()) continue;
        const GgufTensor& src = in.tensors()[t.source_index];
        const std::vector<float>* check = find_moments(im.check, t);
        if (supports_importance(t.to)) {
            const std::vector<float>* fit = find_importance(im.fit, t);
            if (!fit) continue;
            ++s.n_candidates;
            if (check && !weighted_wins_held_out(src, t, *fit, *check, n_threads)) continue;
            s.fit[i].importance = fit;
            s.all[i].importance = find_importance(im.all, t);
        } else if (supports_compensation(t.to)) {
            const std::vector<float>* fit = find_moments(im.fit, t);
            if (!fit || !check) continue;
            ++s.n_candidates;
            if (!compensated_wins_held_out(src, t, *fit, *check, n_threads)) continue;
            s.fit[i].moments = fit;
            s.all[i].moments = find_moments(im.all, t);
        } else {
            continue;
        }
        ++s.n_selected;
    }
    return s;
}

HeldOutCheck held_out_check(const std::string& calibrated_path, const std::string& reference_path,
                            const std::vector<int32_t>& tokens, int32_t n_ctx, int32_t bos, int n_threads,
                            const std::atomic<bool>* cancel) {
    HeldOutCheck c;
    const PerplexityResult calibrated = score_file(calibrated_path, tokens, n_ctx, bos, n_threads, cancel);
    const PerplexityResult reference = score_file(reference_path, tokens, n_ctx, bos, n_threads, cancel);
    c.nll_calibrated = calibrated.nll_mean;
    c.nll_reference = reference.nll_mean;
    c.tokens_scored = reference.tokens_scored;
    return c;
}

} // namespace tern
