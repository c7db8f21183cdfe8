#pragma once
// Activation quantization: f32 activation rows -> the block format the weight's dot kernel consumes
// (kernels/cpu/dot.h). This is llama.cpp's *runtime* quantization on x86, not the reference quantizer
// of quant/ (../shared/FORMATS.md §4 caveat), so that tern's integer dot products see the same codes:
//
//   Q8_0 / Q8_1: amax = max|x| over 32, d = amax / 127 stored as f16, but the codes use id = 127 / amax
//     (not 1 / d) and round half to even (_mm256_round_ps(_MM_ROUND_NEAREST) in ggml's AVX path; the
//     reference quantizer uses roundf, ties away from zero). With id = 127/amax the largest element maps to
//     exactly 127 or one ulp off it, so no code leaves [-127, 127]. Q8_1 adds s = f16(d * sum(q)).
//   Q8_K: ggml's x86 build uses its reference Q8_K quantizer: the signed max M, iscale = -127 / M,
//     q = min(127, round-half-even(iscale * x)), d = 1 / iscale (negative when M > 0), bsums per 16.
//   f16 / bf16: round to nearest even (F16C's _mm256_cvtps_ph and ggml's bf16 rounding; quant/half.h).
//   f32: a copy.
// Rows are independent: n is a multiple of act_block_elems(format). Every ISA's version gives the same
// bytes as the scalar one (tests/kernels/test_kernels_dot.cpp checks that bit for bit).
#include <cstdint>

#include "kernels/cpu/dot.h"
#include "quant/blocks.h"

namespace tern {

using QuantizeActFn = void (*)(const float* x, void* dst, int64_t n);

// Scalar versions (quantize_act.cpp); SIMD versions are in dot_x86.inl (AVX2 and AVX-512 sets) / dot_neon.cpp and
// reached through the dispatch table (kernels/cpu/dispatch.h).
void quantize_act_q8_0_scalar(const float* x, void* dst, int64_t n);
void quantize_act_q8_1_scalar(const float* x, void* dst, int64_t n);
void quantize_act_q8_k_scalar(const float* x, void* dst, int64_t n);
void quantize_act_f16_scalar(const float* x, void* dst, int64_t n);
void quantize_act_bf16_scalar(const float* x, void* dst, int64_t n);
void quantize_act_f32(const float* x, void* dst, int64_t n);

// f32 activations (n_cols, n_in) -> (n_cols, act_row_bytes(f, n_in)) bytes at dst, through the dispatched
// kernels. Columns are split over n_threads when there are enough of them (kernels/cpu/ops.h
// threads_for_elems: a prefill's 512 columns were ~5% of its time on one thread; decode's one column stays
// serial). Columns are independent, so the bytes do not depend on the split.
void quantize_acts(ActFormat f, const float* x, int64_t n_in, int64_t n_cols, void* dst, int n_threads = 1);

} // namespace tern
