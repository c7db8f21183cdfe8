// Activation quantization to q8 units and the integer-dot decode matmul (kernels/cuda/matmul_q8.h), the
// per-format unit decoding in kernels/cuda/q8_dot.cuh.
//
// quantize_activations: 8 threads per 32-element block, 4 elements each (one 16-byte load; a warp reads 512
// consecutive bytes); the block's max |x| and the 8-element sums meet through shuffles inside the 8 lanes,
// and each thread writes its 4 codes as one word at its place in unit order.
//
// matmul_q8: one warp per output row, kRowsPerBlock rows per block, as matmul.cu. Lane l takes units l,
// l + 32, ... of the row: one unit is 8 consecutive bytes of codes per field, so the lanes of a warp read
// consecutive stretches of the row and every weight byte is read once per pass. The unit's codes are decoded
// once (q8_dot.cuh) and meet up to 8 columns of activations: per column one 16-byte load of codes and one
// 8-byte load of scale and sums (both consecutive between lanes), 4 dp4a (and a dp2a for the offset
// formats), an exact int -> float conversion and two or three f32 operations into a register accumulator.
// The warp's column sums are reduced and finished (stored, added to y, or gate and up combined) as
// matmul_epilogue.cuh says; matmul_q8_outputs and matmul_q8_glu are the same kernel over several matrices,
// as matmul.cu describes for the f32 path, and matmul_q8_experts(_glu) the kernel with kIndexed (a pass per
// mixture-of-experts slot, its weights the slot's expert's matrix).
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/column_passes.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul_epilogue.cuh"
#include "kernels/cuda/matmul_q8.h"
#include "kernels/cuda/q8_dot.cuh"
#include "kernels/cuda/q8_units.cuh"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace {

constexpr int kRowsPerBlock = 4;       // warps per block of the matmul
constexpr int kMaxColumns = 8;         // columns sharing one pass over the weights
constexpr int kDecodeDepth = 4;        // units a lane has in flight in the one-column (decode) kernels
constexpr int kQuantizeThreads = 256;  // 32 activation blocks per thread block
constexpr int kThreadsPerActBlock = q8_units::kLanesPerBlock;

using matmul_epilogue::Epilogue;
using matmul_epilogue::Kind;
using matmul_epilogue::LaunchRows;
using matmul_epilogue::WarpRow;
using matmul_epilogue::finish_columns;
using matmul_epilogue::row_weights;
using matmul_epilogue::warp_row;

// ---- quantize_activations -----------------------------------------------------------------------

// Thread t (0..7) of activation block g (of all columns, in order) quantizes elements 4t .. 4t + 3: piece
// p = t / 2 (elements 8p .. 8p + 7) is the first (p < 2) or last half of unit p % 2.
__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_q8_units(const float* __restrict__ x, int64_t n_blocks, int blocks_per_column, int column_bytes,
                      uint8_t* __restrict__ out) {
    dependent_launch::wait_and_release();
    const int64_t g = static_cast<int64_t>(blockIdx.x) * (kQuantizeThreads / kThreadsPerActBlock) +
                      threadIdx.x / kThreadsPerActBlock;
    if (g >= n_blocks) return;   // the 8 threads of a block leave together
    const int t = static_cast<int>(threadIdx.x % kThreadsPerActBlock);
    const float4 v = reinterpret_cast<const float4*>(x)[g * kThreadsPerActBlock + t];
    q8_units::write_block(v, t, static_cast<int>(g % blocks_per_column), blocks_per_column * 32,
                          out + (g / blocks_per_column) * column_bytes);
}

// ---- matmul_q8 -----------------------------------------------------------------------------------

// Unit u of a weight row, decoded once, times NC columns of quantized activations (column_bytes apart) into
// acc; with kGlu the same unit of the up row into acc_up too, column by column after the gate's (the same
// activation loads, which L1 serves; taking gate and up column by column together made ptxas spill a register
// in a few variants). q8dot::accumulate is the one sum, so a matrix alone and the gate and up rows of a GLU
// launch give the same bits.
template <GgmlType T, int NC, bool kGlu>
__device__ __forceinline__ void accumulate_unit(const uint8_t* __restrict__ wr, const uint8_t* __restrict__ wr_up,
                                                int u, const uint8_t* __restrict__ xq, int n_in, int column_bytes,
                                                float (&acc)[NC], float (&acc_up)[NC]) {
    q8dot::WeightUnit wu, wu_up;
    q8dot::Q8Unit<T>::load(wr, u, wu);
    if constexpr (kGlu) q8dot::Q8Unit<T>::load(wr_up, u, wu_up);
    const uint8_t* meta = xq + n_in;
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) {
        const int4 a = *reinterpret_cast<const int4*>(xq + c * column_bytes + 16 * u);
        const uint2 m = *reinterpret_cast<const uint2*>(meta + c * column_bytes + 8 * u);
        acc[c] = q8dot::accumulate<T>(wu, a, m, acc[c]);
    }
    if constexpr (kGlu) {
        TERN_UNROLL
        for (int c = 0; c < NC; ++c) {
            const int4 a = *reinterpret_cast<const int4*>(xq + c * column_bytes + 16 * u);
            const uint2 m = *reinterpret_cast<const uint2*>(meta + c * column_bytes + 8 * u);
            acc_up[c] = q8dot::accumulate<T>(wu_up, a, m, acc_up[c]);
        }
    }
}

// y (NC columns of n_out) = x (NC columns of quantized activations) W^T for the warp's matrix and row
// (matmul_epilogue.cuh), a row's units spread over a warp, finished by the launch's epilogue; with kGlu the
// warp reads the gate and the up row together. blockIdx.y is the pass (columns kMaxColumns * blockIdx.y ..).
// Rows are warp-uniform, so a warp past its matrix's n_out leaves whole.
//
// Launch bounds: 128 threads, and a least number of blocks per SM (0 means unsaid) that decides how many
// registers ptxas may take. Decode's one-matrix and GLU kernels (one column) leave ptxas its own target (lean,
// no spills: ptxas -v on sm_75 .. sm_120). Left to themselves, ptxas aims some of the others a few bytes short
// and spills (since the Q4_K head is one 16-byte load: Q4_K at 3 columns on sm_90, Q5_K's q/k/v launch on
// sm_120), so the other one-matrix and one-column kernels say 4 blocks (up to 128 registers) and the wider
// multi-matrix and GLU kernels 1 (more registers for more loads in flight). The expert launches (kIndexed, one
// column) say 8 (up to 64 registers, where the plain one-column kernels settle at 32 to 48): left to itself
// ptxas gave the Q4_K expert GLU kernel 40 registers and spilled (sm_90, sm_120), and with room to spare (4 or
// 3 blocks) it hoisted loads up to 127 / 168 registers and still spilled in the Q3_K one (sm_90).
template <Kind K, int NC, bool kIndexed> constexpr int min_blocks_per_sm() {
    if (kIndexed) return 8;
    if (NC == 1 && K != Kind::several) return 0;
    return K == Kind::one || NC == 1 ? 4 : 1;
}
template <GgmlType T, int NC, Kind K, bool kIndexed>
__global__ void __launch_bounds__(kRowsPerBlock * 32, min_blocks_per_sm<K, NC, kIndexed>())
    matmul_q8_units(LaunchRows rows, int n_in, const uint8_t* __restrict__ xq) {
    dependent_launch::wait_and_release();
    const int lane = static_cast<int>(threadIdx.x % 32);
    constexpr bool kGlu = K == Kind::glu;
    constexpr int kPassColumns = kIndexed ? 1 : kMaxColumns;
    const WarpRow r = warp_row<K, kRowsPerBlock>(rows);
    if (r.row >= r.n_out) return;
    const int64_t expert = matmul_epilogue::pass_weight_offset<kIndexed>(rows);
    const uint8_t* wr = row_weights(rows, r.m, r.row) + expert;
    const uint8_t* wr_up = kGlu ? row_weights(rows, 1, r.row) + expert : nullptr;
    const int column_bytes = n_in + n_in / 2;
    xq += matmul_epilogue::pass_x_column<kIndexed, kMaxColumns>(rows) * column_bytes;
    const int n_units = n_in / 16;
    float acc[NC], acc_up[NC];
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) acc[c] = acc_up[c] = 0.0f;
    int u = lane;
    if constexpr (NC == 1) {
        // Decode: one unit is 8 to 18 bytes of weights per lane. Four units a step, their loads issued
        // together before the first is used; the sum still takes the units in order. (On an H100 this moved
        // Q4_K_M decode by under 2%: a launch's fixed cost, not its loads in flight, limits these kernels.)
        TERN_NO_UNROLL
        for (; u + 32 * (kDecodeDepth - 1) < n_units; u += 32 * kDecodeDepth) {
            TERN_UNROLL
            for (int k = 0; k < kDecodeDepth; ++k)
                accumulate_unit<T, NC, kGlu>(wr, wr_up, u + 32 * k, xq, n_in, column_bytes, acc, acc_up);
        }
    }
    TERN_NO_UNROLL
    for (; u < n_units; u += 32)
        accumulate_unit<T, NC, kGlu>(wr, wr_up, u, xq, n_in, column_bytes, acc, acc_up);
    finish_columns<K, NC, kRowsPerBlock, kPassColumns>(acc, acc_up, lane, rows);
    if constexpr (kGlu && !kIndexed)
        matmul_epilogue::quantize_finished_group<NC, kRowsPerBlock, kMaxColumns>(rows, lane);
}

// ---- host side ----------------------------------------------------------------------------------

// The quantized family for matmul_epilogue::launch_matmul: the formats q8_dot.cuh decodes, and its kernel.
struct Q8Family {
    using Formats = q8dot::Formats;

    // `passes` passes (grid dimension y) of NC columns each, kMaxColumns apart, from x / rows.y on (kIndexed:
    // a pass per slot).
    template <GgmlType T, int NC, Kind K, bool kIndexed = false>
    static void launch_passes(const LaunchRows& rows, unsigned blocks, int n_in, const uint8_t* x, unsigned passes,
                              cudaStream_t stream) {
        launch_dependent(matmul_q8_units<T, NC, K, kIndexed>, dim3(blocks, passes), dim3(kRowsPerBlock * 32), 0, stream,
                         rows, n_in, x);
    }
};

using column_passes::check_aligned;
using column_passes::kIntMax;
using column_passes::refuse;

// n_in a multiple of `block` and small enough that the kernels' 32-bit offsets hold: one pass's 8 columns
// of quantized activations (12 n_in bytes) stay below 2^31.
void check_n_in(const char* fn, int64_t n_in, int64_t block, const std::string& block_name) {
    if (n_in < 0 || n_in % block != 0)
        refuse(std::string(fn) + ": n_in = " + std::to_string(n_in) + " is not a multiple of " + block_name + " (" +
               std::to_string(block) + ")");
    if (q8_column_bytes(n_in) * kMaxColumns > kIntMax)
        refuse(std::string(fn) + ": n_in = " + std::to_string(n_in) + " out of range");
}

// The format and n_in checks of every quantized-column launch.
void check_q8_format(const char* fn, GgmlType type, int64_t n_in) {
    if (!Q8Family::Formats::contains(type))
        refuse(std::string(fn) + ": format " + std::string(type_name(type)) + " is not read");
    check_n_in(fn, n_in, block_elems(type), std::string(type_name(type)) + "'s block");
}

// Every launch of matmul_q8, matmul_q8_outputs and matmul_q8_glu: the format and size checks of quantized
// columns, then the launches (matmul_epilogue::launch_matmul).
void run_matmul_q8(const char* fn, GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs,
                   Epilogue e, const void* x_q, int64_t n_cols, cudaStream_t stream) {
    check_q8_format(fn, type, n_in);
    if (n_cols < 0) refuse(std::string(fn) + ": n_cols = " + std::to_string(n_cols) + " out of range");
    matmul_epilogue::launch_matmul<Q8Family, kRowsPerBlock, kMaxColumns>(fn, type, n_in, outputs, n_outputs, e,
                                                                         static_cast<const uint8_t*>(x_q), "x_q",
                                                                         q8_column_bytes(n_in), n_cols, stream);
}

} // namespace

size_t quantized_activation_bytes(int64_t n_cols, int64_t n_in) {
    return static_cast<size_t>(n_cols) * static_cast<size_t>(q8_column_bytes(n_in));
}

void quantize_activations(const float* x, int64_t n_cols, int64_t n_in, void* out, cudaStream_t stream) {
    check_n_in("quantize_activations", n_in, kQ8ActBlock, "the activation block");
    const int64_t n_blocks = n_cols * (n_in / kQ8ActBlock);
    constexpr int64_t kBlocksPerLaunchBlock = kQuantizeThreads / kThreadsPerActBlock;
    if (n_cols < 0 || (n_blocks + kBlocksPerLaunchBlock - 1) / kBlocksPerLaunchBlock > kIntMax)
        refuse("quantize_activations: n_cols = " + std::to_string(n_cols) + " out of range");
    if (n_blocks == 0) return;
    check_aligned("quantize_activations", x, "x");
    check_aligned("quantize_activations", out, "out");
    const dim3 grid(static_cast<unsigned>((n_blocks + kBlocksPerLaunchBlock - 1) / kBlocksPerLaunchBlock));
    launch_dependent(quantize_q8_units, grid, dim3(kQuantizeThreads), 0, stream, x, n_blocks,
                     static_cast<int>(n_in / kQ8ActBlock), static_cast<int>(q8_column_bytes(n_in)),
                     static_cast<uint8_t*>(out));
}

bool matmul_q8_supports(GgmlType type) { return Q8Family::Formats::contains(type); }

void matmul_q8(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const void* x_q, int64_t n_cols,
               const float* bias, float* y, cudaStream_t stream) {
    const MatmulOutput output{w, n_out, bias, y};
    run_matmul_q8("matmul_q8", type, n_in, &output, 1, Epilogue::store, x_q, n_cols, stream);
}

void matmul_q8_outputs(GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs, const void* x_q,
                       int64_t n_cols, bool accumulate, cudaStream_t stream) {
    run_matmul_q8("matmul_q8_outputs", type, n_in, outputs, n_outputs, matmul_epilogue::outputs_epilogue(accumulate),
                  x_q, n_cols, stream);
}

void matmul_q8_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const float* b_gate,
                   const void* w_up, const float* b_up, GluActivation act, const void* x_q, int64_t n_cols, float* y,
                   cudaStream_t stream) {
    const MatmulOutput outputs[2] = {{w_gate, n_out, b_gate, y}, {w_up, n_out, b_up, nullptr}};
    run_matmul_q8("matmul_q8_glu", type, n_in, outputs, 2, matmul_epilogue::glu_epilogue(act), x_q, n_cols, stream);
}

bool matmul_q8_glu_q8_takes(int64_t n_out, const float* y, const void* y_q) {
    const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return n_out > 0 && n_out % kQ8ActBlock == 0 && aligned(y) && aligned(y_q);
}

size_t matmul_q8_glu_q8_counters(int64_t n_cols, int64_t n_out) {
    return static_cast<size_t>((n_cols + kMaxColumns - 1) / kMaxColumns) * static_cast<size_t>(n_out / kQ8ActBlock);
}

void matmul_q8_glu_q8(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const float* b_gate,
                      const void* w_up, const float* b_up, GluActivation act, const void* x_q, int64_t n_cols, float* y,
                      void* y_q, unsigned* group_done, cudaStream_t stream) {
    const char* fn = "matmul_q8_glu_q8";
    if (!matmul_q8_glu_q8_takes(n_out, y, y_q))
        refuse(std::string(fn) + ": n_out = " + std::to_string(n_out) +
               " is not a multiple of the activation block, or y / y_q is not 16-byte aligned");
    if (n_cols > 0 && !group_done) refuse(std::string(fn) + ": no group counters");
    check_q8_format(fn, type, n_in);
    if (n_cols < 0) refuse(std::string(fn) + ": n_cols = " + std::to_string(n_cols) + " out of range");
    const MatmulOutput outputs[2] = {{w_gate, n_out, b_gate, y}, {w_up, n_out, b_up, nullptr}};
    matmul_epilogue::launch_matmul<Q8Family, kRowsPerBlock, kMaxColumns>(
        fn, type, n_in, outputs, 2, matmul_epilogue::glu_epilogue(act), static_cast<const uint8_t*>(x_q), "x_q",
        q8_column_bytes(n_in), n_cols, stream, static_cast<uint8_t*>(y_q), group_done);
}

void matmul_q8_experts(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const ExpertSlots& slots,
                       const void* x_q, float* y, cudaStream_t stream) {
    check_q8_format("matmul_q8_experts", type, n_in);
    const MatmulOutput output{w, n_out, nullptr, y};
    matmul_epilogue::launch_matmul_experts<Q8Family, kRowsPerBlock>("matmul_q8_experts", type, n_in, &output, 1,
                                                                    Epilogue::store, slots,
                                                                    static_cast<const uint8_t*>(x_q), "x_q", stream);
}

void matmul_q8_experts_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const void* w_up,
                           GluActivation act, const ExpertSlots& slots, const void* x_q, float* y,
                           cudaStream_t stream) {
    check_q8_format("matmul_q8_experts_glu", type, n_in);
    const MatmulOutput outputs[2] = {{w_gate, n_out, nullptr, y}, {w_up, n_out, nullptr, nullptr}};
    matmul_epilogue::launch_matmul_experts<Q8Family, kRowsPerBlock>(
        "matmul_q8_experts_glu", type, n_in, outputs, 2, matmul_epilogue::glu_epilogue(act), slots,
        static_cast<const uint8_t*>(x_q), "x_q", stream);
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
