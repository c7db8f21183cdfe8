#pragma once
// Row norms, activations, the residual add, softcap and argmax on the GPU (kernels/cuda/elementwise.cu).
// Host-callable launchers; every pointer is device memory, f32 row-major.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// y = RMSNorm(x) * w for each of `rows` rows of `width` (w null: no weight); in place when x == y.
void rmsnorm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t width, float eps,
                  cudaStream_t stream);

// rmsnorm_rows, and its output also as int8 q8 units in `q8` (quantize_activations' layout and bytes,
// kernels/cuda/matmul_q8.h: q8_column_bytes(width) a row): the int8 decode matmuls' input in the same launch.
// width a multiple of 32; x, w, y and q8 16-byte aligned (std::invalid_argument otherwise).
void rmsnorm_rows_q8(const float* x, const float* w, float* y, int64_t rows, int64_t width, float eps, void* q8,
                     cudaStream_t stream);
// Whether rmsnorm_rows_q8 takes these pointers and width.
bool rmsnorm_rows_q8_takes(const void* x, const void* w, const void* y, const void* q8, int64_t width);

// x += (w ? RMSNorm(y) * w : y) for each row: a sub-block's output joins the residual stream, through
// gemma's post-norm when w is given.
void add_residual(float* x, const float* y, const float* w, int64_t rows, int64_t width, float eps,
                  cudaStream_t stream);

// out = silu(gate) * up (SwiGLU) / gelu_tanh(gate) * up (GeGLU), n elements; out may equal gate.
void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
void geglu_tanh(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);
// out = gpt-oss's clamped SwiGLU of gate and up (activations.cuh swiglu_oai_f32), n elements; out may equal gate.
void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream);

// x = x * s, n elements in place (granite's residual and logit scales).
void scale(float* x, int64_t n, float s, cudaStream_t stream);

// x = cap * tanh(x / cap), n elements in place; cap > 0.
void softcap(float* x, int64_t n, float cap, cudaStream_t stream);

// out[r] = the index of the largest value of row r (`rows` rows of `width`, no NaN); the lowest index wins
// ties (-0.0 and +0.0 tie).
void argmax_rows(const float* x, int64_t rows, int64_t width, int32_t* out, cudaStream_t stream);

// The same answer with each row read by many blocks at once (argmax_rows reads a row with one block, one
// SM: a 262144-wide vocabulary row then takes ~10 us where the whole GPU takes ~1): the blocks' partial
// results go to `scratch`, device memory of argmax_rows_split_scratch_bytes(rows, width) bytes, 16-byte
// aligned, which a second kernel folds. rows < 65536.
int64_t argmax_rows_split_scratch_bytes(int64_t rows, int64_t width);
void argmax_rows_split(const float* x, int64_t rows, int64_t width, int32_t* out, void* scratch,
                       cudaStream_t stream);

// What each of `rows` rows of `width` floats holds, as base/finite.h scan_floats tells it on the host: the
// bits of flags[r] (device memory, one word per row, zeroed here first) say a NaN, +inf, a finite value. The
// logit guard (engine/logit_guard.h) asks it of every sampled row: the flags cross to the host, not the row.
// Each row is read by many blocks (slices of 4096 floats, as argmax_rows_split). rows < 65536.
inline constexpr uint32_t kRowHasNan = 1, kRowHasPosInf = 2, kRowHasFinite = 4;
void scan_rows(const float* x, int64_t rows, int64_t width, uint32_t* flags, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
