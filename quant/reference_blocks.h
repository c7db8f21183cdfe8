#pragma once
// Per-block scalar reference dequantizers and quantizers (../shared/FORMATS.md §3-4), one overload
// per block type of quant/blocks.h. dequantize_row / quantize_row (quant/reference.h) loop over
// these; SIMD and CUDA kernels use them as their scalar twins in tests.
// `y` / `x` point at as many floats as the block has elements (QK4_0, QK_K, ...).
#include "quant/blocks.h"

namespace tern {

void dequantize_block(const BlockQ4_0& b, float* y);
void dequantize_block(const BlockQ4_1& b, float* y);
void dequantize_block(const BlockQ5_0& b, float* y);
void dequantize_block(const BlockQ5_1& b, float* y);
void dequantize_block(const BlockQ8_0& b, float* y);
void dequantize_block(const BlockQ8_1& b, float* y);
void dequantize_block(const BlockQ2_K& b, float* y);
void dequantize_block(const BlockQ3_K& b, float* y);
void dequantize_block(const BlockQ4_K& b, float* y);
void dequantize_block(const BlockQ5_K& b, float* y);
void dequantize_block(const BlockQ6_K& b, float* y);
void dequantize_block(const BlockQ8_K& b, float* y);
void dequantize_block(const BlockIQ4_NL& b, float* y);
void dequantize_block(const BlockIQ4_XS& b, float* y);
void dequantize_block(const BlockF8_E4M3& b, float* y);
void dequantize_block(const BlockMXFP4& b, float* y);

void quantize_block(const float* x, BlockQ4_0& b);
void quantize_block(const float* x, BlockQ4_1& b);
void quantize_block(const float* x, BlockQ5_0& b);
void quantize_block(const float* x, BlockQ5_1& b);
void quantize_block(const float* x, BlockQ8_0& b);
void quantize_block(const float* x, BlockQ8_1& b);
void quantize_block(const float* x, BlockQ2_K& b);
void quantize_block(const float* x, BlockQ3_K& b);
void quantize_block(const float* x, BlockQ4_K& b);
void quantize_block(const float* x, BlockQ5_K& b);
void quantize_block(const float* x, BlockQ6_K& b);
void quantize_block(const float* x, BlockQ8_K& b);
void quantize_block(const float* x, BlockIQ4_NL& b);
void quantize_block(const float* x, BlockIQ4_XS& b);
void quantize_block(const float* x, BlockF8_E4M3& b);
void quantize_block(const float* x, BlockMXFP4& b);

} // namespace tern
