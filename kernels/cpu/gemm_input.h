#pragma once
// Matmul inputs made in one pass: RMSNorm of each row straight into the quantized activations the next
// matmuls read (kernels/cpu/quantize_act.h), while the normed row is still in L1. The f32 normed rows are
// written too (other consumers, e.g. a weight without a dot kernel, read them), but the quantizer never
// re-reads them from memory. Bit-identical to rmsnorm_f32 per row followed by quantize_acts.
#include <cstdint>

#include "kernels/cpu/dot.h"

namespace tern {

// xn (n_rows, width) = rmsnorm(x) * w (w may be nullptr); q (n_rows, act_row_bytes(f, width)) = its
// quantized form in format f. width must be a multiple of act_block_elems(f) (std::invalid_argument).
// Rows are split over n_threads when there are enough of them (kernels/cpu/ops.h threads_for_elems); each
// row is computed the same way on any thread, so the split changes no bit.
void rmsnorm_quantize_rows(const float* x, const float* w, float eps, int64_t n_rows, int64_t width, ActFormat f,
                           float* xn, void* q, int n_threads = 1);

} // namespace tern
