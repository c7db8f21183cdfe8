// Held-out scoring of the importance-weighted quantizers (see imatrix_select.h).
#include "quant/imatrix_select.h"

#include <vector>

#include "quant/compensated.h"
#include "quant/imatrix.h"
#include "quant/reference.h"

namespace tern {
namespace {

// dw^T M dw for dw = row - dequantized q.
double output_error(GgmlType type, const float* row, const std::vector<uint8_t>& q, int64_t width, const float* m,
                    std::vector<float>& back) {
    dequantize_row(type, q.data(), back.data(), width);
    for (int64_t i = 0; i < width; ++i) back[static_cast<size_t>(i)] = row[i] - back[static_cast<size_t>(i)];
    double e = 0.0;
    for (int64_t i = 0; i < width; ++i) {
        const float* mi = m + i * width;
        double s = 0.0;
        for (int64_t j = 0; j < width; ++j) s += static_cast<double>(mi[j]) * back[static_cast<size_t>(j)];
        e += s * back[static_cast<size_t>(i)];
    }
    return e;
}

// Both errors of one row: the reference quantizer's, and quantize_candidate(q)'s, which writes the
// row's blocks to q.
template <class QuantizeCandidate>
HeldOutErrors score_against_reference(GgmlType type, const float* row, int64_t width, const float* check_moments,
                                      const QuantizeCandidate& quantize_candidate) {
    std::vector<uint8_t> q(row_bytes(type, width));
    std::vector<float> back(static_cast<size_t>(width));
    HeldOutErrors e;
    quantize_row(type, row, q.data(), width);
    e.reference = output_error(type, row, q, width, check_moments, back);
    quantize_candidate(q.data());
    e.weighted = output_error(type, row, q, width, check_moments, back);
    return e;
}

} // namespace

HeldOutErrors held_out_errors(GgmlType type, const float* row, int64_t width, const float* fit,
                              const float* check_moments) {
    return score_against_reference(type, row, width, check_moments,
                                   [&](uint8_t* q) { quantize_row_importance(type, row, q, width, fit); });
}

HeldOutErrors held_out_errors_compensated(GgmlType type, const float* row, const CompensationFactor& fit,
                                          const float* check_moments) {
    return score_against_reference(type, row, fit.width, check_moments,
                                   [&](uint8_t* q) { quantize_row_compensated(type, row, q, fit); });
}

} // namespace tern
