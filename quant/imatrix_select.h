#pragma once
// Held-out selection for `tern quantize --calibrate`: an importance vector measured on a few
// hundred tokens can overfit (the weighted quantizer spends precision on columns that happened
// to be loud in that text), and then the weighted tensor is worse than the reference one. So the
// calibration tokens are split into two disjoint halves A and B; each tensor is quantized with
// the reference quantizer and with A's importance, and both are scored by the mean squared output
// error they cause on B's activations, E_B[(dw . x)^2] = dw^T M_B dw with M_B = mean x x^T (the
// full matrix, not the diagonal the weighting itself assumes). The weighted form is kept only where
// it wins on B. That is necessary, not sufficient: on stories260K every tensor wins here while the
// model's perplexity grows, so `tern quantize` also compares the two whole models' NLL on B
// (engine/quantize/held_out.h). tests/quant/test_quant_imatrix_select.cpp.

#include <cstdint>

#include "quant/types.h"

namespace tern {

struct CompensationFactor;

struct HeldOutErrors {
    double reference = 0.0;   // sum over the rows scored so far of dw^T M dw, dw = w - ref(w)
    double weighted = 0.0;    // the same for the quantizer weighted with the fit importance
    HeldOutErrors& operator+=(const HeldOutErrors& o) {
        reference += o.reference;
        weighted += o.weighted;
        return *this;
    }
    // Strictly smaller: a tie (e.g. an all-zero tensor) keeps the reference bytes.
    bool keep_weighted() const { return weighted < reference; }
};

// Scores one row of `width` elements (type must satisfy supports_importance): quantizes it with
// the reference quantizer and with `fit` importance (width values), and scores both errors with
// `check_moments` (width x width, row-major, symmetric).
HeldOutErrors held_out_errors(GgmlType type, const float* row, int64_t width, const float* fit,
                              const float* check_moments);

// The same for the error-compensating quantizer (quant/compensated.h; type must satisfy
// supports_compensation): `weighted` is the row quantized with the factor of the fit half's moments.
HeldOutErrors held_out_errors_compensated(GgmlType type, const float* row, const CompensationFactor& fit,
                                          const float* check_moments);

} // namespace tern
