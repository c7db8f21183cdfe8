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
// Plain float rows whose length is not a multiple of 8 (only those formats allow it) take a scalar
// element-per-lane path, still one coalesced pass.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cuda/column_passes.h"
#include "kernels/cuda/column_reduce.cuh"
#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/matmul.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// The formats both entry points read, in one list for matmul_supports and the dispatch.
#define TERN_MATMUL_FORMATS(X)                                                                                         \
    X(F32) X(F16) X(BF16) X(Q4_0) X(Q4_1) X(Q5_0) X(Q5_1) X(Q8_0) X(Q2_K) X(Q3_K) X(Q4_K) X(Q5_K) X(Q6_K) X(IQ4_NL)  \
        X(IQ4_XS) X(F8_E4M3)

namespace {

constexpr int kRowsPerBlock = 4;   // warps per block of the matmul
constexpr int kMaxColumns = 8;     // columns sharing one pass over the weights
constexpr int kEmbedThreads = 128;

// y (NC columns of n_out) = x (NC columns of n_in) W^T, a row's slices spread over a warp; blockIdx.y is the
// pass (columns kMaxColumns * blockIdx.y ..). Rows are warp-uniform, so a warp past n_out leaves whole.
template <GgmlType T, int NC>
__global__ void __launch_bounds__(kRowsPerBlock * 32, 4)
    matmul_slices(const uint8_t* __restrict__ w, int64_t row_bytes, int n_out, int n_in, const float* __restrict__ x,
                  const float* __restrict__ bias, float* __restrict__ y) {
    using D = dequant::Dequant<T>;
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int row = static_cast<int>(blockIdx.x * kRowsPerBlock + threadIdx.x / 32);
    if (row >= n_out) return;
    x += static_cast<int64_t>(blockIdx.y) * kMaxColumns * n_in;
    y += static_cast<int64_t>(blockIdx.y) * kMaxColumns * n_out;
    const uint8_t* wr = w + row * row_bytes;
    const int n_slices = n_in / 8;
    float acc[NC];
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    // Not unrolled: ptxas then hoists the loads of several iterations and the heavier formats spill at 4 and
    // more columns; one iteration already has all of its loads in flight.
    TERN_NO_UNROLL
    for (int q = lane; q < n_slices; q += 32) {
        float v[8];
        D::slice(wr, q, v);
        const float* xq = x + D::first(q);
        TERN_UNROLL
        for (int c = 0; c < NC; ++c) {
            const float4 a = *reinterpret_cast<const float4*>(xq + c * n_in);
            const float4 b = *reinterpret_cast<const float4*>(xq + c * n_in + D::kSecond);
            float s = acc[c];
            s += v[0] * a.x;
            s += v[1] * a.y;
            s += v[2] * a.z;
            s += v[3] * a.w;
            s += v[4] * b.x;
            s += v[5] * b.y;
            s += v[6] * b.z;
            s += v[7] * b.w;
            acc[c] = s;
        }
    }
    reduce_columns_and_store<NC>(acc, lane, row, n_out, bias, y);
}

// The same for plain float rows of any length: lane l takes elements l, l + 32, ...
template <GgmlType T, int NC>
__global__ void __launch_bounds__(kRowsPerBlock * 32)
    matmul_plain_ragged(const uint8_t* __restrict__ w, int64_t row_bytes, int n_out, int n_in,
                        const float* __restrict__ x, const float* __restrict__ bias, float* __restrict__ y) {
    const int lane = static_cast<int>(threadIdx.x % 32);
    const int row = static_cast<int>(blockIdx.x * kRowsPerBlock + threadIdx.x / 32);
    if (row >= n_out) return;
    x += static_cast<int64_t>(blockIdx.y) * kMaxColumns * n_in;
    y += static_cast<int64_t>(blockIdx.y) * kMaxColumns * n_out;
    const uint8_t* wr = w + row * row_bytes;
    float acc[NC];
    TERN_UNROLL
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    for (int i = lane; i < n_in; i += 32) {
        const float wv = dequant::plain_element<T>(wr, i);
        TERN_UNROLL
        for (int c = 0; c < NC; ++c) acc[c] += wv * x[c * n_in + i];
    }
    reduce_columns_and_store<NC>(acc, lane, row, n_out, bias, y);
}

// x row blockIdx.x = table row tokens[blockIdx.x], one slice per thread; scale 1 multiplies nothing, as
// the CPU's embedding does.
template <GgmlType T>
__global__ void __launch_bounds__(kEmbedThreads)
    embed_slices(const uint8_t* __restrict__ table, int64_t row_bytes, int dim, const int32_t* __restrict__ tokens,
                 float scale, float* __restrict__ x) {
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
    const int e = static_cast<int>(blockIdx.y * kEmbedThreads + threadIdx.x);
    if (e >= dim) return;
    float v = dequant::plain_element<T>(table + tokens[blockIdx.x] * row_bytes, e);
    if (scale != 1.0f) v = __fmul_rn(v, scale);
    x[static_cast<int64_t>(blockIdx.x) * dim + e] = v;
}

// ---- host side ----------------------------------------------------------------------------------

template <GgmlType T> using FormatTag = std::integral_constant<GgmlType, T>;

// Calls f(FormatTag<type>{}) for a supported format; false for the others.
template <class F> bool visit_format(GgmlType type, F&& f) {
    switch (type) {
#define TERN_VISIT(name)                                                                                               \
    case GgmlType::name:                                                                                               \
        f(FormatTag<GgmlType::name>{});                                                                                \
        return true;
        TERN_MATMUL_FORMATS(TERN_VISIT)
#undef TERN_VISIT
    default:
        return false;
    }
}

// Whether a row of n elements is read by slices (else element by element: plain formats only).
bool by_slices(int64_t n) { return n % 8 == 0; }

struct MatmulShape {
    const uint8_t* w;
    int64_t row_bytes;
    int n_in, n_out;
    const float* bias;
    cudaStream_t stream;
};

// `passes` passes (grid dimension y) of NC columns each, kMaxColumns apart, from x / y on.
template <GgmlType T, int NC>
void launch_passes(const MatmulShape& s, const float* x, float* y, unsigned passes) {
    const dim3 grid(static_cast<unsigned>((s.n_out + kRowsPerBlock - 1) / kRowsPerBlock), passes);
    const dim3 block(kRowsPerBlock * 32);
    if (by_slices(s.n_in))
        launch(matmul_slices<T, NC>, grid, block, 0, s.stream, s.w, s.row_bytes, s.n_out, s.n_in, x, s.bias, y);
    else if constexpr (dequant::is_plain(T))
        launch(matmul_plain_ragged<T, NC>, grid, block, 0, s.stream, s.w, s.row_bytes, s.n_out, s.n_in, x, s.bias, y);
}

using column_passes::check_aligned;
using column_passes::kIntMax;
using column_passes::refuse;

void check_format(const char* fn, GgmlType type, int64_t n, const char* n_name) {
    if (!matmul_supports(type)) refuse(std::string(fn) + ": format " + std::string(type_name(type)) + " is not read");
    if (n < 0 || n % block_elems(type) != 0)
        refuse(std::string(fn) + ": " + n_name + " = " + std::to_string(n) + " is not a multiple of " +
               std::string(type_name(type)) + "'s block of " + std::to_string(block_elems(type)));
}

} // namespace

bool matmul_supports(GgmlType type) {
    return visit_format(type, [](auto) {});
}

void matmul(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols,
            const float* bias, float* y, cudaStream_t stream) {
    check_format("matmul", type, n_in, "n_in");
    // Offsets inside the kernels are 32-bit: one pass's 8 columns of x or y must stay below 2^31 elements.
    if (n_out < 0 || n_cols < 0 || n_in * kMaxColumns > kIntMax || n_out * kMaxColumns > kIntMax)
        refuse("matmul: n_in = " + std::to_string(n_in) + ", n_out = " + std::to_string(n_out) + ", n_cols = " +
               std::to_string(n_cols) + " out of range");
    if (n_out == 0 || n_cols == 0) return;
    check_aligned("matmul", w, "w");
    check_aligned("matmul", x, "x");
    const MatmulShape shape{static_cast<const uint8_t*>(w), static_cast<int64_t>(row_bytes(type, n_in)),
                            static_cast<int>(n_in), static_cast<int>(n_out), bias, stream};
    visit_format(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        column_passes::for_each_launch<kMaxColumns>(n_cols, [&](auto nc, int64_t first, unsigned passes) {
            launch_passes<T, decltype(nc)::value>(shape, x + first * n_in, y + first * n_out, passes);
        });
    });
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
    visit_format(type, [&](auto tag) {
        constexpr GgmlType T = decltype(tag)::value;
        if (by_slices(dim)) {
            const int64_t slices = dim / 8;
            const dim3 grid(static_cast<unsigned>(n),
                            static_cast<unsigned>((slices + kEmbedThreads - 1) / kEmbedThreads));
            launch(embed_slices<T>, grid, dim3(kEmbedThreads), 0, stream, t, rb, d, tokens, scale, x);
        } else if constexpr (dequant::is_plain(T)) {
            const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>((dim + kEmbedThreads - 1) / kEmbedThreads));
            launch(embed_plain_ragged<T>, grid, dim3(kEmbedThreads), 0, stream, t, rb, d, tokens, scale, x);
        }
    });
}

#undef TERN_MATMUL_FORMATS

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
