#pragma once
// Error-compensating quantization for `tern quantize --calibrate` (the method of GPTQ, Frantar et
// al. 2022, written from the paper): a row's output error over the calibration activations is
// E[((w - q) . x)^2] = (w - q)^T H (w - q), H = E[x x^T]. Rounding the elements one at a time and
// moving each rounding error onto the elements not yet rounded, in the proportions H says cancel
// it best, lowers that error well below rounding every element on its own. With U the upper
// Cholesky factor of H^-1 (U^T U = H^-1), element j's error e_j = (w_j - q_j) / U_jj is taken out
// of every later element k as w_k -= e_j U_jk.
//
// Used for F8_E4M3, whose 3 mantissa bits leave ~1.8% relative error on every weight however the
// block scale is chosen (models.md): the scale search cannot do better, the order of rounding can.
// Each 32-value block's scale is chosen by the reference search on the block's values as they
// stand when the block is reached (earlier blocks' errors already moved in), then its codes are
// rounded with that scale one by one. With a diagonal H nothing moves and the bytes are exactly
// the reference quantizer's. tests/quant/test_quant_compensated.cpp.
#include <cstdint>
#include <vector>

#include "quant/types.h"

namespace tern {

// F8_E4M3 only so far.
bool supports_compensation(GgmlType type);

struct CompensationFactor {
    int64_t width = 0;
    std::vector<float> u;   // width x width, row-major, upper triangular: U^T U = (H + damp I)^-1
};

// From the second moments H (width x width, row-major, symmetric) of one matrix's inputs. H is damped
// by 1% of its mean diagonal (GPTQ's choice), which also makes columns that never fire harmless;
// the damping grows tenfold while rounding still breaks the factorization. Throws InputError for a
// non-finite moment.
CompensationFactor compensation_factor(const float* moments, int64_t width);

// One row of f.width elements (a multiple of the type's block) to `dst` blocks.
// Throws InputError for a type without support or a non-finite value.
void quantize_row_compensated(GgmlType type, const float* src, void* dst, const CompensationFactor& f);

} // namespace tern
