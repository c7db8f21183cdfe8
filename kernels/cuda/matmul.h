#pragma once
// Weight x activation products and embedding lookups on the GPU, reading the weights in their GGUF
// formats as uploaded (kernels/cuda/matmul.cu). Host-callable launchers; every pointer is device memory.
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// Whether matmul() and embed_rows() read this format: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
// Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, F8_E4M3 and MXFP4.
bool matmul_supports(GgmlType type);

// y (n_cols, n_out) = x (n_cols, n_in) W^T (+ bias (n_out) when bias is not null), f32 row-major. W is
// n_out rows of n_in elements in `type` (row_bytes(type, n_in) bytes each; n_in a multiple of the block
// size). Up to 8 columns share one pass over the weights (decode and draft verification cost about one
// read of W); more columns take ceil(n_cols / 8) passes. Accumulates in f32. w and x must be 16-byte
// aligned (cudaMalloc gives 256, GGUF tensor data 32); a format it does not read, an n_in that is not a
// multiple of the block size or a misaligned pointer throws std::invalid_argument.
void matmul(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols,
            const float* bias, float* y, cudaStream_t stream);

// ---- fused decode projections -------------------------------------------------------------------------
// A decode step's projections that read one input, in fewer launches: several matrices in one launch, and
// the work that follows a projection (the residual add, the gated activation) done by the lanes that hold
// its sums. Each gives matmul()'s bits for every matrix, then the separate kernel's bits for what follows.

// One matrix of a multi-matrix launch: n_out rows in the call's format, its bias (n_out, or null) and its
// output y (n_cols, n_out). w 16-byte aligned.
struct MatmulOutput {
    const void* w = nullptr;
    int64_t n_out = 0;
    const float* bias = nullptr;
    float* y = nullptr;
};
inline constexpr int kMaxMatmulOutputs = 3;   // q, k and v

// The activation of a gated FFN: act(gate) * up.
enum class GluActivation : uint8_t {
    silu,        // SwiGLU: elementwise.h swiglu
    gelu_tanh,   // GeGLU: elementwise.h geglu_tanh
    swiglu_oai,  // gpt-oss's clamped SwiGLU: elementwise.h swiglu_oai
};

// For each of the n_outputs (1 .. kMaxMatmulOutputs) matrices of one format that read x: y = x W^T (+ bias)
// as matmul() computes it, or with `accumulate` y = y + (x W^T (+ bias)), bit for bit matmul() into a
// scratch row then add_residual(y, scratch, nullptr, ...) (kernels/cuda/elementwise.h): the o and down
// projections adding into the residual stream. One launch per pass of up to 8 columns for all of them.
// The outputs must not overlap each other or x. Refusals as matmul()'s, and n_outputs out of range.
void matmul_outputs(GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs, const float* x,
                    int64_t n_cols, bool accumulate, cudaStream_t stream);

// y (n_cols, n_out) = act(x W_gate^T (+ b_gate)) * (x W_up^T (+ b_up)): gate and up, two matrices of one
// format and shape, read in one pass. Bit for bit matmul() of each followed by swiglu / geglu_tanh
// (kernels/cuda/elementwise.h). y must not overlap x. Refusals as matmul()'s.
void matmul_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const float* b_gate, const void* w_up,
                const float* b_up, GluActivation act, const float* x, int64_t n_cols, float* y, cudaStream_t stream);

// ---- mixture-of-experts projections ------------------------------------------------------------------
// A layer's experts are one stacked tensor: n_expert matrices of n_out rows of n_in, each right after the one
// before. A token's (token, rank) slots each run one expert; these launches read, per slot, only its expert's
// matrix, the expert ids taken from device memory (the router's output: no host round trip, so a decode step
// stays capturable in a graph). Slot s reads column s / slots_per_column of x (the token's input for gate and
// up, k slots a token; its own column for down) and writes column s of y.
struct ExpertSlots {
    const int32_t* ids = nullptr;    // device, n_slots expert ids, each naming a matrix of the stack
    int64_t n_slots = 0;             // at most 65535
    int64_t slots_per_column = 1;
};

// y (n_slots, n_out) = per slot s, x's column s / slots_per_column times the transpose of matrix ids[s] of the
// stack at w: bit for bit matmul() of that matrix and column. No bias. The stack's matrices must be 16-byte
// aligned (w is, and an expert's bytes are a multiple of 16). Refusals as matmul()'s, and a bad slot count.
void matmul_experts(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const ExpertSlots& slots,
                    const float* x, float* y, cudaStream_t stream);

// y (n_slots, n_out) = act(x W_gate[ids[s]]^T) * (x W_up[ids[s]]^T) per slot: matmul_glu() of the slot's expert,
// bit for bit.
void matmul_experts_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const void* w_up,
                        GluActivation act, const ExpertSlots& slots, const float* x, float* y, cudaStream_t stream);

// x (n, dim) = scale * row tokens[i] of `table` (rows of dim elements in `type`), tokens on the device and
// each a row of the table. Bit for bit dequantize_row (quant/reference.h) times the scale; scale 1 leaves
// the values untouched, as the CPU's embedding does. table and x 16-byte aligned, as for matmul.
void embed_rows(GgmlType type, const void* table, int64_t dim, const int32_t* tokens, int64_t n, float scale,
                float* x, cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
