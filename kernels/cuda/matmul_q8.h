#pragma once
// Decode matmul with int8 activations: the activations are quantized once per matrix input
// (quantize_activations) and every weight format with integer codes multiplies them with __dp4a
// (kernels/cuda/matmul_q8.cu). The f32-activation matmul (kernels/cuda/matmul.h) remains the path for the
// float formats and the reference this one is tested beside. Host-callable; every pointer is device memory.
//
// Device activation format ("q8 units"), per column of n_in elements (n_in a multiple of 32):
//   - the column starts at byte c * q8_column_bytes(n_in) = c * 3 n_in / 2 of the buffer (16-byte aligned
//     when the buffer is);
//   - bytes [0, n_in): int8 codes. Block b (elements 32b .. 32b + 31) fills bytes 32b .. 32b + 31 in UNIT
//     order: unit h (0, 1) of the block is bytes 32b + 16h .. 32b + 16h + 15 and holds elements
//     8h .. 8h + 7 then 16 + 8h .. 16 + 8h + 7 of the block. These are the 16 elements whose weight codes
//     sit in 8 consecutive bytes of every format (nibble formats keep element t and t + 16 in one byte), so
//     a lane reads one unit of codes with one 16-byte load;
//   - bytes [n_in, 3 n_in / 2): 8 bytes per unit u = 2b + h at n_in + 8u: the block's scale d as an f32,
//     then the int16 sum of the unit's first 8 codes and the int16 sum of its last 8 (the min / offset
//     terms of Q4_1, Q5_1, Q2_K, Q4_K and Q5_K are these sums times integer mins: exact, as dp2a).
//   The activation the codes stand for is d * q.
// Codes and scale are exactly those of the CPU's runtime Q8_0 / Q8_1 quantization (kernels/cpu/quantize_act.h):
// amax = max |x| over the block, d = f16(amax / 127) (stored widened to f32, the value the CPU's f16 field
// holds), q = round-half-even(x * (127 / amax)) in [-127, 127]; an all-zero block has d = 0 and zero codes.
// The CPU pairs k-quants with 256-element Q8_K blocks instead; 32-element scales here are finer, so the
// device's k-quant products are at least as close to the f32 ones.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/matmul.h"
#include "kernels/cuda/runtime.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// Elements per activation block (one f32 scale); n_in must be a multiple of it.
inline constexpr int64_t kQ8ActBlock = 32;

// Bytes of one column of quantized activations (3 n_in / 2), and of n_cols of them.
inline constexpr int64_t q8_column_bytes(int64_t n_in) { return n_in + n_in / 2; }
size_t quantized_activation_bytes(int64_t n_cols, int64_t n_in);

// out (quantized_activation_bytes(n_cols, n_in) bytes, 16-byte aligned) = x (n_cols, n_in) f32 row-major
// in the format above. n_in a multiple of kQ8ActBlock; x 16-byte aligned. Finite inputs (as on the CPU).
void quantize_activations(const float* x, int64_t n_cols, int64_t n_in, void* out, cudaStream_t stream);

// Whether matmul_q8 reads this weight format: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
// IQ4_NL, IQ4_XS and MXFP4.
bool matmul_q8_supports(GgmlType type);

// y (n_cols, n_out) = x W^T (+ bias (n_out) when bias is not null), f32 row-major, with x the n_cols columns
// of n_in quantized activations at x_q (quantize_activations' output for the same n_in and n_cols). W is
// n_out rows of n_in elements in `type` (row_bytes(type, n_in) bytes each, n_in a multiple of the block
// size), 16-byte aligned like x_q. Up to 8 columns share one pass over the weights; more columns take
// ceil(n_cols / 8) passes. Each 16-element unit is one integer dot product of the codes (exact), scaled by
// the weight's and the activation block's scales in f32 and accumulated in f32. An unsupported format, a
// bad n_in or a misaligned pointer throws std::invalid_argument.
void matmul_q8(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const void* x_q, int64_t n_cols,
               const float* bias, float* y, cudaStream_t stream);

// The fused decode projections of matmul.h (matmul_outputs, matmul_glu) on quantized activations: each gives
// matmul_q8()'s bits for every matrix, then add_residual's / swiglu's / geglu_tanh's bits for what follows
// (kernels/cuda/elementwise.h). x_q as for matmul_q8; refusals as matmul_q8()'s.
void matmul_q8_outputs(GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs, const void* x_q,
                       int64_t n_cols, bool accumulate, cudaStream_t stream);
void matmul_q8_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const float* b_gate,
                   const void* w_up, const float* b_up, GluActivation act, const void* x_q, int64_t n_cols, float* y,
                   cudaStream_t stream);

// matmul_q8_glu that also writes y as quantize_activations(y, n_cols, n_out) would, into y_q (16-byte aligned,
// quantized_activation_bytes(n_cols, n_out) bytes): the down projection's input without a launch of its own,
// the same bytes. The last warp to finish each 32-output group of a column pass quantizes it; group_done is
// matmul_q8_glu_q8_counters(n_cols, n_out) counters of device memory, zero before the launch and left zero
// (zero them once; launches on one stream may share them). Refuses, besides matmul_q8_glu's refusals, what
// matmul_q8_glu_q8_takes says no to: n_out not a multiple of kQ8ActBlock, y or y_q not 16-byte aligned.
bool matmul_q8_glu_q8_takes(int64_t n_out, const float* y, const void* y_q);
size_t matmul_q8_glu_q8_counters(int64_t n_cols, int64_t n_out);
void matmul_q8_glu_q8(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const float* b_gate,
                      const void* w_up, const float* b_up, GluActivation act, const void* x_q, int64_t n_cols, float* y,
                      void* y_q, unsigned* group_done, cudaStream_t stream);

// The expert projections of matmul.h (matmul_experts, matmul_experts_glu) on quantized activations: x_q holds
// the columns the slots read (quantize_activations' layout), each slot matmul_q8() / matmul_q8_glu() of its
// expert's matrix and column, bit for bit. Refusals as matmul_q8()'s and matmul_experts()'.
void matmul_q8_experts(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const ExpertSlots& slots,
                       const void* x_q, float* y, cudaStream_t stream);
void matmul_q8_experts_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const void* w_up,
                           GluActivation act, const ExpertSlots& slots, const void* x_q, float* y,
                           cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
