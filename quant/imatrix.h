#pragma once
// Importance-weighted quantizers for the low-bit types (`tern quantize --calibrate`). An
// importance vector holds, per input column c of a weight matrix, the mean of x_c^2 over the
// calibration activations: the output error of a row, E[(sum_c (w_c - q_c) x_c)^2], is close to
// sum_c (w_c - q_c)^2 E[x_c^2] when the columns are weakly correlated, so the searches weight each
// element's error by imp_c (Q3_K: imp_c alone, its 6-bit sub-block scales fitted with the same
// weights; Q2_K: imp_c times the reference's sqrt(sigma^2 + x^2); Q4_0, the width fallback of the
// low-bit k-quants: imp_c alone, one f16 scale per 32). tests/quant/test_quant_imatrix.cpp
// holds them to a smaller weighted error than the reference quantizers.
#include <cstdint>

#include "quant/types.h"

namespace tern {

// Q2_K, Q3_K, and Q4_0 (the fallback of q2_k / q3_k_* for widths off 256); the others are
// accurate enough.
bool supports_importance(GgmlType type);

// n elements (a multiple of 256; of 32 for Q4_0) of one row with its n importance values (>= 0) to `dst` blocks.
// Throws InputError for a type without an importance-aware quantizer or a non-finite value.
void quantize_row_importance(GgmlType type, const float* src, void* dst, int64_t n, const float* importance);

} // namespace tern
