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

} // namespace

HeldOutErrors held_out_errors(GgmlType type, const float* row, int64_t width, const float* fit,
                              const float* check_moments) {
    std::vector<uint8_t> q(row_bytes(type, width));
    std::vector<float> back(static_cast<size_t>(width));
    HeldOutErrors e;
    quantize_row(type, row, q.data(), width);
    e.reference = output_error(type, row, q, width, check_moments, back);
    quantize_row_importance(type, row, q.data(), width, fit);
    e.weighted = output_error(type, row, q, width, check_moments, back);
    return e;
}

HeldOutErrors held_out_errors_compensated(GgmlType type, const float* row, const CompensationFactor& fit,
                                          const float* check_moments) {
    const int64_t width = fit.width;
    std::vector<uint8_t> q(row_bytes(type, width));
    std::vector<float> back(static_cast<size_t>(width));
    HeldOutErrors e;
    quantize_row(type, row, q.data(), width);
    e.reference = output_error(type, row, q, width, check_moments, back);
    quantize_row_compensated(type, row, q.data(), fit);
    e.weighted = output_error(type, row, q, width, check_moments, back);
    return e;
}

} // namespace tern
