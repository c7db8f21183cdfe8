#pragma once
// Scalar reference dequantize / quantize for every format tern computes with: the oracle that
// every SIMD and CUDA kernel is tested against. Bit-exact with the GGUF ecosystem
// (../shared/FORMATS.md §3-4): compiled with -ffp-contract=off, no -ffast-math.
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace tern {

// n elements (a multiple of the block size) from `src` blocks to f32.
// Throws InputError for formats with can_dequantize == false.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

// n elements (a multiple of the block size) of f32 to `dst` blocks, with the reference
// algorithm llama-quantize uses without an importance matrix. Throws for can_quantize == false.
void quantize_row(GgmlType type, const float* src, void* dst, int64_t n);

} // namespace tern
