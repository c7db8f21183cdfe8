#pragma once
// What the decode matmuls (kernels/cuda/matmul.cu, matmul_q8.cu) launch, how, and what they do with a row's sums:
// one launch covers up to kMaxMatmulOutputs matrices that read the same input (q, k and v), and the lane
// that holds a column's sum stores it, adds it to the output (the residual add) or, in a GLU launch where
// each warp reads the gate row and the up row of one output, combines the two (the gated FFN).
//
// The matrices' rows go to consecutive ranges of blocks (grid dimension x): matrix i takes blocks
// [first_block[i], first_block[i + 1]), a whole number of blocks each, so a warp's matrix and row follow from
// blockIdx.x alone and every warp of a block reads the same matrix. The kernels pick the matrix with
// comparisons and selects (an indexed kernel parameter would be copied to local memory).
//
// Expert launches (matmul_experts and matmul_q8_experts: a mixture-of-experts layer's slots) are the same
// kernels with kIndexed: each matrix is a stack of experts, pass blockIdx.y is slot p of one column, whose
// weights are the stack's matrix expert_ids[p] (read from device memory, so a captured decode step replays with
// the router's new choice) and whose input is column p / x_group of x.
//
// A quantized GLU launch may also write y as q8 units (y_q8: quantize_activations' bytes of y, the input of the
// down projection), saving that launch: quantize_finished_group below.
#include <cstdint>
#include <string>

#include "kernels/cuda/activations.cuh"
#include "kernels/cuda/column_passes.h"
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/format_list.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/q8_units.cuh"
#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace matmul_epilogue {

// What the writing lane does with its column's sum s (bias added). One kernel serves store and add (a
// uniform branch at the end); the GLU forms read two matrices per row and are kernels of their own.
enum class Epilogue : uint8_t {
    store,        // y = s
    add,          // y = y + s: add_residual's __fadd_rn(x, out) (kernels/cuda/elementwise.cu)
    swiglu,       // y = swiglu_f32(s_gate, s_up)
    geglu_tanh,   // y = geglu_tanh_f32(s_gate, s_up)
    swiglu_oai,   // y = swiglu_oai_f32(s_gate, s_up)
};
constexpr bool is_glu(Epilogue e) {
    return e == Epilogue::swiglu || e == Epilogue::geglu_tanh || e == Epilogue::swiglu_oai;
}

// The epilogues the entry points ask for: *_outputs stores or adds, *_glu combines with its activation.
constexpr Epilogue outputs_epilogue(bool accumulate) { return accumulate ? Epilogue::add : Epilogue::store; }
constexpr Epilogue glu_epilogue(GluActivation act) {
    return act == GluActivation::silu        ? Epilogue::swiglu
           : act == GluActivation::gelu_tanh ? Epilogue::geglu_tanh
                                             : Epilogue::swiglu_oai;
}

// The kernels' shapes, a template parameter: one matrix (matmul itself and the residual adds: with the
// matrix a constant the kernel takes the registers the plain matmul took), several (picked per block at run
// time, which costs registers: up to ~20 more at 8 columns), or a GLU pair.
enum class Kind : uint8_t { one, several, glu };
constexpr Kind kind_of(Epilogue e, int n_outputs) {
    return is_glu(e) ? Kind::glu : n_outputs == 1 ? Kind::one : Kind::several;
}

// A launch's matrices as its kernel reads them (a kernel parameter, by value). In a GLU launch matrix 0 is
// the gate and matrix 1 the up projection, both walked by the blocks of matrix 0, which write y[0].
struct LaunchRows {
    const uint8_t* w[kMaxMatmulOutputs];
    const float* bias[kMaxMatmulOutputs];
    float* y[kMaxMatmulOutputs];
    int n_out[kMaxMatmulOutputs];
    unsigned first_block[kMaxMatmulOutputs];   // past the last matrix: ~0u
    int64_t row_bytes;                         // every matrix has rows of n_in in one format
    Epilogue epilogue;
    // Expert launches only: the slots' experts (device memory), the bytes from one expert of a stack to the
    // next, and how many consecutive slots read one column of x.
    const int32_t* expert_ids;
    int64_t expert_bytes;
    int x_group;
    // Quantized GLU launches only (null elsewhere): y also as q8 units, and one counter per 32-row group of y
    // and pass (zero between launches) for quantize_finished_group.
    uint8_t* y_q8;
    unsigned* group_done;
};

// Matrix m's entry of one of LaunchRows' arrays, picked by selects.
template <typename T> __device__ __forceinline__ T pick(const T (&a)[kMaxMatmulOutputs], int m) {
    return m == 0 ? a[0] : m == 1 ? a[1] : a[2];
}

// The matrix and row one warp computes.
struct WarpRow {
    int m;       // the matrix (0 in a GLU launch)
    int row;
    int n_out;   // the matrix's rows; a warp with row >= n_out has nothing to do
};

template <Kind K, int kRowsPerBlock> __device__ __forceinline__ WarpRow warp_row(const LaunchRows& r) {
    const unsigned b = blockIdx.x;
    const int m = K != Kind::several ? 0 : b >= r.first_block[2] ? 2 : b >= r.first_block[1] ? 1 : 0;
    const unsigned first = m == 0 ? 0u : m == 1 ? r.first_block[1] : r.first_block[2];
    return {m, static_cast<int>((b - first) * kRowsPerBlock + threadIdx.x / 32), pick(r.n_out, m)};
}

// The row's weights in matrix m (the up projection's in a GLU launch: matrix 1).
__device__ __forceinline__ const uint8_t* row_weights(const LaunchRows& r, int m, int row) {
    return pick(r.w, m) + row * r.row_bytes;
}

// Where pass blockIdx.y starts: its first column of x (an expert launch: the slot's column, slot / x_group),
// and the offset of its weights from the stacks' first matrices (the slot's expert; 0 for a plain launch).
template <bool kIndexed, int kMaxColumns> __device__ __forceinline__ int64_t pass_x_column(const LaunchRows& r) {
    if constexpr (kIndexed) return static_cast<int64_t>(blockIdx.y / static_cast<unsigned>(r.x_group));
    return static_cast<int64_t>(blockIdx.y) * kMaxColumns;
}
template <bool kIndexed> __device__ __forceinline__ int64_t pass_weight_offset(const LaunchRows& r) {
    if constexpr (kIndexed) return static_cast<int64_t>(r.expert_ids[blockIdx.y]) * r.expert_bytes;
    return 0;
}

// Reduces the warp's column sums (acc_up: the up projection's, GLU only) and finishes each column of pass
// blockIdx.y (columns kMaxColumns * blockIdx.y ..; an expert launch passes kMaxColumns 1: y's column is the
// slot) as the launch's epilogue says. The warp's matrix and row are worked out again here from the kernel
// parameters rather than kept live through the row's loop: a few compares cost less than the registers they
// would hold (measured with ptxas -v on the q8 kernels).
template <Kind K, int NC, int kRowsPerBlock, int kMaxColumns>
__device__ __forceinline__ void finish_columns(const float (&acc)[NC], const float (&acc_up)[NC], int lane,
                                               const LaunchRows& r) {
    constexpr bool kGlu = K == Kind::glu;
    const ColumnSum s = reduce_columns<NC>(acc, lane);
    float up = 0.0f;
    if constexpr (kGlu) up = reduce_columns<NC>(acc_up, lane).sum;
    if (!s.writer) return;
    const WarpRow wr = warp_row<K, kRowsPerBlock>(r);
    const float* bias = pick(r.bias, wr.m);
    const float v = bias ? s.sum + bias[wr.row] : s.sum;   // the projection's output, as stored alone
    float* out = pick(r.y, wr.m) + (static_cast<int64_t>(blockIdx.y) * kMaxColumns + s.col) * wr.n_out + wr.row;
    if constexpr (kGlu) {
        if (r.bias[1]) up = up + r.bias[1][wr.row];
        *out = r.epilogue == Epilogue::swiglu       ? swiglu_f32(v, up)
               : r.epilogue == Epilogue::geglu_tanh ? geglu_tanh_f32(v, up)
                                                    : swiglu_oai_f32(v, up);
    } else {
        *out = r.epilogue == Epilogue::add ? __fadd_rn(*out, v) : v;
    }
}

// With r.y_q8 (a GLU launch, n_out a multiple of 32): y's 32-row groups of pass blockIdx.y also as q8 units, as
// quantize_activations writes them from y. A group's rows are 32 warps in up to 32 / kRowsPerBlock blocks; each
// warp, once its y is stored (finish_columns), counts itself on the group's counter, and the last of the 32 reads
// the group's outputs of every column back from L2 (the others' stores, fenced before their counts) and writes
// them through q8_units::write_block, which gives quantize_activations' bytes for the same floats. atomicInc
// wraps the counter back to 0 for the next launch. All 32 lanes of the warp call it.
template <int NC, int kRowsPerBlock, int kMaxColumns>
__device__ __forceinline__ void quantize_finished_group(const LaunchRows& r, int lane) {
    if (!r.y_q8) return;
    constexpr int kGroup = 32;             // outputs per activation block
    constexpr unsigned kLast = kGroup - 1;   // the count the group's last warp finds
    const int n_out = r.n_out[0];
    const int group = warp_row<Kind::glu, kRowsPerBlock>(r).row / kGroup;
    unsigned* done = r.group_done + static_cast<int64_t>(blockIdx.y) * (n_out / kGroup) + group;
    __threadfence();   // this warp's stores of y before its count
    __syncwarp();
    unsigned before = 0;
    if (lane == 0) before = atomicInc(done, kLast);
    if (__shfl_sync(0xFFFFFFFFu, before, 0) != kLast) return;
    __threadfence();   // the counted warps' stores before the reads below
    const int t = lane % q8_units::kLanesPerBlock;
    TERN_UNROLL
    for (int first = 0; first < NC; first += 32 / q8_units::kLanesPerBlock) {
        const int c = first + lane / q8_units::kLanesPerBlock;   // 4 columns at a time, 8 lanes each
        if (c >= NC) break;
        const int64_t col = static_cast<int64_t>(blockIdx.y) * kMaxColumns + c;
        const float4 v = __ldcg(reinterpret_cast<const float4*>(r.y[0] + col * n_out + kGroup * group) + t);
        q8_units::write_block(v, t, group, n_out, r.y_q8 + col * (n_out + n_out / 2));
    }
}

// ---- host side ----------------------------------------------------------------------------------------

// The launch's matrices for `outputs` (GLU: gate and up as outputs 0 and 1, n_outputs 2) and the blocks
// (of rows_per_block rows) that cover them, checked: n_outputs in range, every n_out small enough for the
// kernels' 32-bit offsets (one pass's max_columns columns of y below 2^31), y present.
inline LaunchRows launch_rows(const char* fn, const MatmulOutput* outputs, int n_outputs, int64_t row_bytes,
                              Epilogue e, int rows_per_block, int max_columns, unsigned* blocks) {
    using column_passes::refuse;
    if (!outputs || n_outputs < 1 || n_outputs > kMaxMatmulOutputs || (is_glu(e) && n_outputs != 2))
        refuse(std::string(fn) + ": " + std::to_string(n_outputs) + " outputs");
    LaunchRows r{};
    r.row_bytes = row_bytes;
    r.epilogue = e;
    int64_t total = 0;
    for (int i = 0; i < kMaxMatmulOutputs; ++i) {
        r.first_block[i] = ~0u;
        if (i >= n_outputs) continue;
        const MatmulOutput& o = outputs[i];
        if (o.n_out < 0 || o.n_out * max_columns > column_passes::kIntMax)
            refuse(std::string(fn) + ": n_out = " + std::to_string(o.n_out) + " out of range");
        if (is_glu(e) && o.n_out != outputs[0].n_out) refuse(std::string(fn) + ": gate and up differ in n_out");
        if (!o.y && !(is_glu(e) && i == 1)) refuse(std::string(fn) + ": an output without y");
        r.w[i] = static_cast<const uint8_t*>(o.w);
        r.bias[i] = o.bias;
        r.y[i] = o.y;
        r.n_out[i] = static_cast<int>(o.n_out);
        if (is_glu(e) && i == 1) continue;   // the up rows ride along with the gate's blocks
        r.first_block[i] = static_cast<unsigned>(total);
        total += (o.n_out + rows_per_block - 1) / rows_per_block;
    }
    if (total > column_passes::kIntMax) refuse(std::string(fn) + ": too many rows for one launch");
    *blocks = static_cast<unsigned>(total);
    return r;
}

// Refuses a matrix of `outputs` that is not 16-byte aligned (the dequantizers' widest loads).
inline void check_weights_aligned(const char* fn, const MatmulOutput* outputs, int n_outputs) {
    for (int i = 0; i < n_outputs; ++i)
        if (outputs[i].n_out > 0) column_passes::check_aligned(fn, outputs[i].w, "w");
}

// The same launch from column `first` (a multiple of max_columns) on: every output moved by `first` of its
// columns, the q8 output and its group counters too.
inline LaunchRows from_column(LaunchRows r, int64_t first, int max_columns) {
    for (int i = 0; i < kMaxMatmulOutputs; ++i)
        if (r.y[i]) r.y[i] += first * r.n_out[i];
    if (r.y_q8) {
        r.y_q8 += first * (r.n_out[0] + r.n_out[0] / 2);
        r.group_done += first / max_columns * (r.n_out[0] / 32);
    }
    return r;
}

// Every launch of a decode matmul family (matmul.cu reads f32 columns of x, matmul_q8.cu quantized ones) once
// the family has checked the format and n_in its own way: the matrices (launch_rows, with their checks) and
// the alignment of the weights and of x, then, per group of column passes (column_passes::for_each_launch),
// Family::launch_passes<T, NC, K>(rows, blocks, n_in, x from the pass's first column, passes, stream) for the
// format, the pass's column count and the kernel shape. Family::Formats is the family's FormatList;
// x_column_stride counts the X elements from one column of x to the next. y_q8 and group_done: a GLU launch's
// q8 output and its counters (LaunchRows), checked by the caller.
template <class Family, int kRowsPerBlock, int kMaxColumns, class X>
void launch_matmul(const char* fn, GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs,
                   Epilogue e, const X* x, const char* x_name, int64_t x_column_stride, int64_t n_cols,
                   cudaStream_t stream, uint8_t* y_q8 = nullptr, unsigned* group_done = nullptr) {
    unsigned blocks = 0;
    const auto rb = static_cast<int64_t>(row_bytes(type, n_in));
    LaunchRows rows = launch_rows(fn, outputs, n_outputs, rb, e, kRowsPerBlock, kMaxColumns, &blocks);
    rows.y_q8 = y_q8;
    rows.group_done = group_done;
    if (blocks == 0 || n_cols == 0) return;
    check_weights_aligned(fn, outputs, n_outputs);
    column_passes::check_aligned(fn, x, x_name);
    const int n = static_cast<int>(n_in);
    Family::Formats::visit(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        column_passes::for_each_launch<kMaxColumns>(n_cols, [&](auto nc, int64_t first, unsigned passes) {
            constexpr int NC = decltype(nc)::value;
            const LaunchRows at = from_column(rows, first, kMaxColumns);
            const X* xc = x + first * x_column_stride;
            switch (kind_of(e, n_outputs)) {
            case Kind::one: Family::template launch_passes<T, NC, Kind::one>(at, blocks, n, xc, passes, stream); break;
            case Kind::several:
                Family::template launch_passes<T, NC, Kind::several>(at, blocks, n, xc, passes, stream);
                break;
            case Kind::glu: Family::template launch_passes<T, NC, Kind::glu>(at, blocks, n, xc, passes, stream); break;
            }
        });
    });
}

// The expert launches (matmul_experts, matmul_q8_experts and their GLU forms): the same matrices and checks as
// launch_matmul, each `outputs[i].w` the first matrix of a stack of experts (expert_bytes apart), then one
// launch of slots.n_slots passes of one column each: Family::launch_passes<T, 1, K, true>.
template <class Family, int kRowsPerBlock, class X>
void launch_matmul_experts(const char* fn, GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs,
                           Epilogue e, const ExpertSlots& slots, const X* x, const char* x_name, cudaStream_t stream) {
    using column_passes::refuse;
    if (is_glu(e) ? n_outputs != 2 : n_outputs != 1) refuse(std::string(fn) + ": one matrix or a GLU pair");
    if (slots.n_slots < 0 || slots.n_slots > column_passes::kMaxGridY || slots.slots_per_column < 1 ||
        slots.slots_per_column > column_passes::kIntMax)
        refuse(std::string(fn) + ": n_slots = " + std::to_string(slots.n_slots) + ", slots_per_column = " +
               std::to_string(slots.slots_per_column) + " out of range");
    if (slots.n_slots > 0 && !slots.ids) refuse(std::string(fn) + ": no expert ids");
    unsigned blocks = 0;
    const auto rb = static_cast<int64_t>(row_bytes(type, n_in));
    LaunchRows rows = launch_rows(fn, outputs, n_outputs, rb, e, kRowsPerBlock, 1, &blocks);
    if (blocks == 0 || slots.n_slots == 0) return;
    rows.expert_ids = slots.ids;
    rows.expert_bytes = rb * outputs[0].n_out;
    rows.x_group = static_cast<int>(slots.slots_per_column);
    // Every expert of a stack starts 16-byte aligned when the first does.
    if (rows.expert_bytes % 16 != 0) refuse(std::string(fn) + ": an expert's bytes are not a multiple of 16");
    check_weights_aligned(fn, outputs, n_outputs);
    column_passes::check_aligned(fn, x, x_name);
    const int n = static_cast<int>(n_in);
    const auto passes = static_cast<unsigned>(slots.n_slots);
    Family::Formats::visit(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if (is_glu(e))
            Family::template launch_passes<T, 1, Kind::glu, true>(rows, blocks, n, x, passes, stream);
        else
            Family::template launch_passes<T, 1, Kind::one, true>(rows, blocks, n, x, passes, stream);
    });
}

} // namespace matmul_epilogue
} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
