#pragma once
// Quantized dot products of one weight row with one activation row, the inner loop of every CPU matmul.
//
// Weights stay in their file format; activations are quantized once per column (kernels/cpu/quantize_act.h)
// into the format ggml's CPU backend pairs with that weight format, and the blocks are multiplied in
// integers, so tern's logits track llama.cpp's (../shared/FORMATS.md §4 caveat):
//   Q4_0 Q5_0 Q8_0 IQ4_NL MXFP4 F8_E4M3 x Q8_0      Q4_1 Q5_1 x Q8_1
//   Q2_K .. Q6_K IQ4_XS            x Q8_K       F32 x f32
//   F16 x f16, BF16 x bf16: ggml converts the activations to the weight's 16-bit type too. Keeping that
//   pairing costs one rounding of the activations (2^-11 relative for f16) but gives llama.cpp's numbers,
//   and the 2-byte activations halve what a prefill tile re-reads per weight row.
//
// Every kernel has the same shape: vec_dot_<w>_<act>_<isa>(n, w_row, act_row) with n elements (a multiple
// of the weight's block size), rows aligned only to their block struct (2 bytes; 4 for f32 and Q8_K; 1 for
// MXFP4): a row of 18-byte Q4_0 blocks inside a tensor is never 16-byte aligned, so every vector load is
// unaligned. Per-ISA kernels live in dot_scalar.cpp (the oracle: integer
// sums per block, one float multiply-add per block in a fixed order), dot_avx2.cpp, dot_avx512.cpp and
// dot_neon.cpp; kernels/cpu/dispatch.h picks one set at run time.
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace tern {

// What an activation row is quantized to before the dot product.
enum class ActFormat : uint8_t { f32, f16, bf16, q8_0, q8_1, q8_k };

using VecDotFn = float (*)(int64_t n, const void* w_row, const void* act_row);

// One weight row against n_cols = 1..kDotCols activation columns: out[c * out_stride] = the format's VecDotFn of
// (w_row, act + c * act_stride), each column by that kernel's very instructions in its order, so a column's bits
// do not depend on the others (a sequence's logits are the same alone or in a batch). The weight blocks are
// unpacked once for all the columns: what a step decoding several sequences saves. Formats whose unpacking is
// a large share of the dot have one (CpuKernels::find_dot_cols); the others loop over the columns.
inline constexpr int kDotCols = 4;
using VecDotColsFn = void (*)(int64_t n, const void* w_row, const void* act, size_t act_stride, int n_cols, float* out,
                              size_t out_stride);

// The activation format ggml (and therefore tern) pairs with weight format `w`. Throws InputError for a
// weight format without a dot kernel.
ActFormat act_format_for(GgmlType w);
// Elements per activation block (1, 32 or 256) and bytes of n activation elements.
int64_t act_block_elems(ActFormat f);
size_t act_row_bytes(ActFormat f, int64_t n);
const char* act_format_name(ActFormat f);

// Scalar twins (dot_scalar.cpp). Declared here because the tests and the dispatch table name them.
float vec_dot_q4_0_q8_0_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q4_1_q8_1_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q5_0_q8_0_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q5_1_q8_1_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q8_0_q8_0_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q2_k_q8_k_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q3_k_q8_k_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q4_k_q8_k_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q5_k_q8_k_scalar(int64_t n, const void* w, const void* x);
float vec_dot_q6_k_q8_k_scalar(int64_t n, const void* w, const void* x);
float vec_dot_iq4_nl_q8_0_scalar(int64_t n, const void* w, const void* x);
float vec_dot_iq4_xs_q8_k_scalar(int64_t n, const void* w, const void* x);
float vec_dot_f8_e4m3_q8_0_scalar(int64_t n, const void* w, const void* x);
float vec_dot_mxfp4_q8_0_scalar(int64_t n, const void* w, const void* x);
float vec_dot_f16_f16_scalar(int64_t n, const void* w, const void* x);
float vec_dot_bf16_bf16_scalar(int64_t n, const void* w, const void* x);
float vec_dot_f32_f32_scalar(int64_t n, const void* w, const void* x);

} // namespace tern
