// Weight x activation products and embedding lookups straight from the uploaded weight formats
// (kernels/cuda/matmul.h), dequantizing with kernels/cuda/dequant.cuh.
//
// matmul: one warp per output row, kRowsPerBlock rows per block. Lane l dequantizes slices l, l + 32, ...
// of the row (dequant.cuh: 8 elements each; the four lanes of a 32-element group read consecutive 4-byte
// words of its codes), so each warp instruction reads one contiguous stretch of the row and every weight
// byte is read once per pass. The 8 values meet up to 8 columns of x (two 16-byte loads per column, again
// consecutive between lanes) in f32 accumulators held in registers; a shuffle reduction that halves the
// column set at each step (transposing as it reduces: 9 shuffles for 8 columns instead of 40; in
// column_reduce.cuh) leaves each column's sum in its own lanes, which write y in parallel. More than 8 columns
// take one pass per 8 (grid dimension y), the last n_cols % 8 a pass of their own with that many accumulators.
//
// matmul_outputs and matmul_glu are the same kernels over several matrices (matmul_epilogue.cuh): blocks
// of each matrix one after the other in one grid, or, for GLU, each warp walking the gate row and the up
// row together (two sets of accumulators fed by the same slices of x), the writing lane then adding its
// sum to y or combining gate and up. matmul itself is a launch of one matrix that stores.
//
// matmul_experts and matmul_experts_glu are the same kernels again with kIndexed (matmul_epilogue.cuh): one
// column per pass, each pass a slot whose weights are its expert's matrix of the stack.
//
// Plain float rows whose length is not a multiple of 8 (only those formats allow it) take a scalar
// element-per-lane path, still one coalesced pass.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/column_passes.h"
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/format_list.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_epilogue.cuh"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace {

constexpr int kRowsPerBlock = 4;   // warps per block of the matmul
constexpr int kMaxColumns = 8;     // columns sharing one pass over the weights
constexpr int kDecodeDepth = 4;    // slices a lane has in flight in the one-column (decode) kernels
constexpr int kEmbedThreads = 128;

using matmul_epilogue::Epilogue;
using matmul_epilogue::Kind;
using matmul_epilogue::LaunchRows;
using matmul_epilogue::WarpRow;
using matmul_epilogue::finish_columns;
using matmul_epilogue::row_weights;
using matmul_epilogue::warp_row;

// acc + the dot product of 8 weights with x elements a, b (as a slice lays them out), one rounding per
// step in this order: the one sum every f32 kernel here uses, so a matrix alone and the gate and up rows of
// a GLU launch give the same bits.
__device__ __forceinline__ float dot_slice(const float (&v)[8], const float4& a, const float4& b, float acc) {
    float s = acc;
    s += v[0] * a.x;
    s += v[1] * a.y;
    s += v[2] * a.z;
    s += v[3] * a.w;
    s += v[4] * b.x;
    s += v[5] * b.y;
    s += v[6] * b.z;
    s += v[7] * b.w;
    return s;
}

// One slice q of a weight row (8 values) times NC columns of x (n_in apart) into acc; with kGlu the same
// slice of the up row into acc_up too, each column of x loaded once for both.
template <GgmlType T, int NC, bool kGlu>
__device__ __forceinline__ void accumulate_slice(const uint8_t* __restrict__ wr, const uint8_t* __restrict__ wr_up,
                                                 int q, const float* __restrict__ x, int n_in, float (&acc)[NC],
                                                 float (&acc_up)[NC]) {
    using D = dequant::Dequant<T>;
    float v[8], v_up[8];
    D::slice(wr, q, v);
    if constexpr (kGlu) D::slice(wr_up, q, v_up);
    const float* xq = x + D::first(q);
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) {
        const float4 a = *reinterpret_cast<const float4*>(xq + c * n_in);
        const float4 b = *reinterpret_cast<const float4*>(xq + c * n_in + D::kSecond);
        acc[c] = dot_slice(v, a, b, acc[c]);
        if constexpr (kGlu) acc_up[c] = dot_slice(v_up, a, b, acc_up[c]);
    }
}

// y (NC columns of n_out) = x (NC columns of n_in) W^T for the warp's matrix and row (matmul_epilogue.cuh),
// a row's slices spread over a warp, finished by the launch's epilogue; with kGlu the warp reads the gate
// and the up row together. blockIdx.y is the pass (columns kMaxColumns * blockIdx.y ..; with kIndexed the
// slot, its expert's matrix and column). Rows are warp-uniform, so a warp past its matrix's n_out leaves whole.
template <GgmlType T, int NC, Kind K, bool kIndexed>
__global__ void __launch_bounds__(kRowsPerBlock * 32, 4)
    matmul_slices(LaunchRows rows, int n_in, const float* __restrict__ x) {
    dependent_launch::wait_and_release();
    const int lane = static_cast<int>(threadIdx.x % 32);
    constexpr bool kGlu = K == Kind::glu;
    constexpr int kPassColumns = kIndexed ? 1 : kMaxColumns;
    const WarpRow r = warp_row<K, kRowsPerBlock>(rows);
    if (r.row >= r.n_out) return;
    const int64_t expert = matmul_epilogue::pass_weight_offset<kIndexed>(rows);
    const uint8_t* wr = row_weights(rows, r.m, r.row) + expert;
    const uint8_t* wr_up = kGlu ? row_weights(rows, 1, r.row) + expert : nullptr;
    x += matmul_epilogue::pass_x_column<kIndexed, kMaxColumns>(rows) * n_in;
    const int n_slices = n_in / 8;
    float acc[NC], acc_up[NC];
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) acc[c] = acc_up[c] = 0.0f;
    // Not unrolled for several columns: ptxas then hoists the loads of several iterations and the heavier
    // formats spill at 4 and more columns. One column (decode) has the registers and takes four slices (4 to
    // 16 bytes of weights per lane each) a step, their loads issued together; the sum still takes the slices
    // in order. On an H100 this took F8_E4M3 decode from 46% to 51% of the copy bandwidth and F16 from 79% to
    // 83%.
    int q = lane;
    if constexpr (NC == 1) {
        TERN_NO_UNROLL
        for (; q + 32 * (kDecodeDepth - 1) < n_slices; q += 32 * kDecodeDepth) {
            TERN_UNROLL
            for (int k = 0; k < kDecodeDepth; ++k)
                accumulate_slice<T, NC, kGlu>(wr, wr_up, q + 32 * k, x, n_in, acc, acc_up);
        }
    }
    TERN_NO_UNROLL
    for (; q < n_slices; q += 32) accumulate_slice<T, NC, kGlu>(wr, wr_up, q, x, n_in, acc, acc_up);
    finish_columns<K, NC, kRowsPerBlock, kPassColumns>(acc, acc_up, lane, rows);
}

// Element i of a plain float row times NC columns of x into acc (with kGlu: and of the up row into acc_up).
template <GgmlType T, int NC, bool kGlu>
__device__ __forceinline__ void accumulate_element(const uint8_t* __restrict__ wr, const uint8_t* __restrict__ wr_up,
                                                   int i, const float* __restrict__ x, int n_in, float (&acc)[NC],
                                                   float (&acc_up)[NC]) {
    const float wv = dequant::plain_element<T>(wr, i);
    const float wv_up = kGlu ? dequant::plain_element<T>(wr_up, i) : 0.0f;
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) {
        const float xc = x[c * n_in + i];
        acc[c] += wv * xc;
        if constexpr (kGlu) acc_up[c] += wv_up * xc;
    }
}

// The same for plain float rows of any length: lane l takes elements l, l + 32, ...
template <GgmlType T, int NC, Kind K, bool kIndexed>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    matmul_plain_ragged(LaunchRows rows, int n_in, const float* __restrict__ x) {
    dependent_launch::wait_and_release();
    const int lane = static_cast<int>(threadIdx.x % 32);
    constexpr bool kGlu = K == Kind::glu;
    constexpr int kPassColumns = kIndexed ? 1 : kMaxColumns;
    const WarpRow r = warp_row<K, kRowsPerBlock>(rows);
    if (r.row >= r.n_out) return;
    const int64_t expert = matmul_epilogue::pass_weight_offset<kIndexed>(rows);
    const uint8_t* wr = row_weights(rows, r.m, r.row) + expert;
    const uint8_t* wr_up = kGlu ? row_weights(rows, 1, r.row) + expert : nullptr;
    x += matmul_epilogue::pass_x_column<kIndexed, kMaxColumns>(rows) * n_in;
    float acc[NC], acc_up[NC];
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) acc[c] = acc_up[c] = 0.0f;
    for (int i = lane; i < n_in; i += 32) accumulate_element<T, NC, kGlu>(wr, wr_up, i, x, n_in, acc, acc_up);
    finish_columns<K, NC, kRowsPerBlock, kPassColumns>(acc, acc_up, lane, rows);
}

// x row blockIdx.x = table row tokens[blockIdx.x], one slice per thread; scale 1 multiplies nothing, as
// the CPU's embedding does.
template <GgmlType T>
__global__ void __launch_bounds__(kEmbedThreads)
    embed_slices(const uint8_t* __restrict__ table, int64_t row_bytes, int dim, const int32_t* __restrict__ tokens,
                 float scale, float* __restrict__ x) {
    dependent_launch::wait_and_release();
    using D = dequant::Dequant<T>;
    const int q = static_cast<int>(blockIdx.y * kEmbedThreads + threadIdx.x);
    if (q >= dim / 8) return;
    float v[8];
    D::slice(table + tokens[blockIdx.x] * row_bytes, q, v);
    if (scale != 1.0f) {
        TERN_UNROLL
        for (int j = 0; j < 8; ++j) v[j] = __fmul_rn(v[j], scale);
    }
    float* out = x + static_cast<int64_t>(blockIdx.x) * dim + D::first(q);
    *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(out + D::kSecond) = make_float4(v[4], v[5], v[6], v[7]);
}

// Plain float rows of any length: one element per thread.
template <GgmlType T>
__global__ void __launch_bounds__(kEmbedThreads)
    embed_plain_ragged(const uint8_t* __restrict__ table, int64_t row_bytes, int dim,
                       const int32_t* __restrict__ tokens, float scale, float* __restrict__ x) {
    dependent_launch::wait_and_release();
    const int e = static_cast<int>(blockIdx.y * kEmbedThreads + threadIdx.x);
    if (e >= dim) return;
    float v = dequant::plain_element<T>(table + tokens[blockIdx.x] * row_bytes, e);
    if (scale != 1.0f) v = __fmul_rn(v, scale);
    x[static_cast<int64_t>(blockIdx.x) * dim + e] = v;
}

// ---- host side ----------------------------------------------------------------------------------

// Whether a row of n elements is read by slices (else element by element: plain formats only).
bool by_slices(int64_t n) { return n % 8 == 0; }

// The f32 family for matmul_epilogue::launch_matmul: every format dequant.cuh reads, and its kernels.
struct F32Family {
    using Formats = FormatList<GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1,
                               GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K, GgmlType::Q3_K,
                               GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                               GgmlType::F8_E4M3, GgmlType::MXFP4>;

    // `passes` passes (grid dimension y) of NC columns each, kMaxColumns apart, from x / rows.y on (kIndexed:
    // a pass per slot).
    template <GgmlType T, int NC, Kind K, bool kIndexed = false>
    static void launch_passes(const LaunchRows& rows, unsigned blocks, int n_in, const float* x, unsigned passes,
                              cudaStream_t stream) {
        const dim3 grid(blocks, passes), block(kRowsPerBlock * 32);
        if (by_slices(n_in))
            launch_dependent(matmul_slices<T, NC, K, kIndexed>, grid, block, 0, stream, rows, n_in, x);
        else if constexpr (dequant::is_plain(T))
            launch_dependent(matmul_plain_ragged<T, NC, K, kIndexed>, grid, block, 0, stream, rows, n_in, x);
    }
};

using column_passes::check_aligned;
using column_passes::kIntMax;
using column_passes::refuse;

void check_format(const char* fn, GgmlType type, int64_t n, const char* n_name) {
    if (!matmul_supports(type)) refuse(std::string(fn) + ": format " + std::string(type_name(type)) + " is not read");
    if (n < 0 || n % block_elems(type) != 0)
        refuse(std::string(fn) + ": " + n_name + " = " + std::to_string(n) + " is not a multiple of " +
               std::string(type_name(type)) + "'s block of " + std::to_string(block_elems(type)));
}

// Every launch of matmul, matmul_outputs and matmul_glu: the format and size checks of f32 columns, then the
// launches (matmul_epilogue::launch_matmul).
void run_matmul(const char* fn, GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs, Epilogue e,
                const float* x, int64_t n_cols, cudaStream_t stream) {
    check_format(fn, type, n_in, "n_in");
    // Offsets inside the kernels are 32-bit: one pass's 8 columns of x or y must stay below 2^31 elements.
    if (n_cols < 0 || n_in * kMaxColumns > kIntMax)
        refuse(std::string(fn) + ": n_in = " + std::to_string(n_in) + ", n_cols = " + std::to_string(n_cols) +
               " out of range");
    matmul_epilogue::launch_matmul<F32Family, kRowsPerBlock, kMaxColumns>(fn, type, n_in, outputs, n_outputs, e, x, "x",
                                                                          n_in, n_cols, stream);
}

} // namespace

bool matmul_supports(GgmlType type) { return F32Family::Formats::contains(type); }

void matmul(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols,
            const float* bias, float* y, cudaStream_t stream) {
    const MatmulOutput output{w, n_out, bias, y};
    run_matmul("matmul", type, n_in, &output, 1, Epilogue::store, x, n_cols, stream);
}

void matmul_outputs(GgmlType type, int64_t n_in, const MatmulOutput* outputs, int n_outputs, const float* x,
                    int64_t n_cols, bool accumulate, cudaStream_t stream) {
    run_matmul("matmul_outputs", type, n_in, outputs, n_outputs, matmul_epilogue::outputs_epilogue(accumulate), x,
               n_cols, stream);
}

void matmul_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const float* b_gate, const void* w_up,
                const float* b_up, GluActivation act, const float* x, int64_t n_cols, float* y, cudaStream_t stream) {
    const MatmulOutput outputs[2] = {{w_gate, n_out, b_gate, y}, {w_up, n_out, b_up, nullptr}};
    run_matmul("matmul_glu", type, n_in, outputs, 2, matmul_epilogue::glu_epilogue(act), x, n_cols, stream);
}

void matmul_experts(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const ExpertSlots& slots,
                    const float* x, float* y, cudaStream_t stream) {
    check_format("matmul_experts", type, n_in, "n_in");
    const MatmulOutput output{w, n_out, nullptr, y};
    matmul_epilogue::launch_matmul_experts<F32Family, kRowsPerBlock>("matmul_experts", type, n_in, &output, 1,
                                                                     Epilogue::store, slots, x, "x", stream);
}

void matmul_experts_glu(GgmlType type, int64_t n_in, int64_t n_out, const void* w_gate, const void* w_up,
                        GluActivation act, const ExpertSlots& slots, const float* x, float* y, cudaStream_t stream) {
    check_format("matmul_experts_glu", type, n_in, "n_in");
    const MatmulOutput outputs[2] = {{w_gate, n_out, nullptr, y}, {w_up, n_out, nullptr, nullptr}};
    matmul_epilogue::launch_matmul_experts<F32Family, kRowsPerBlock>(
        "matmul_experts_glu", type, n_in, outputs, 2, matmul_epilogue::glu_epilogue(act), slots, x, "x", stream);
}

void embed_rows(GgmlType type, const void* table, int64_t dim, const int32_t* tokens, int64_t n, float scale,
                float* x, cudaStream_t stream) {
    check_format("embed_rows", type, dim, "dim");
    if (n < 0 || n > kIntMax || dim > kIntMax)
        refuse("embed_rows: n = " + std::to_string(n) + ", dim = " + std::to_string(dim) + " out of range");
    if (n == 0 || dim == 0) return;
    check_aligned("embed_rows", table, "table");
    check_aligned("embed_rows", x, "x");
    const auto* t = static_cast<const uint8_t*>(table);
    const auto rb = static_cast<int64_t>(row_bytes(type, dim));
    const int d = static_cast<int>(dim);
    F32Family::Formats::visit(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if (by_slices(dim)) {
            const int64_t slices = dim / 8;
            const dim3 grid(static_cast<unsigned>(n),
                            static_cast<unsigned>((slices + kEmbedThreads - 1) / kEmbedThreads));
            launch_dependent(embed_slices<T>, grid, dim3(kEmbedThreads), 0, stream, t, rb, d, tokens, scale, x);
        } else if constexpr (dequant::is_plain(T)) {
            const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((dim + kEmbedThreads - 1) / kEmbedThreads));
            launch_dependent(embed_plain_ragged<T>, grid, dim3(kEmbedThreads), 0, stream, t, rb, d, tokens, scale, x);
        }
    });
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
