// Row norms, the residual add, the gated activations, softcap and argmax (kernels/cuda/elementwise.h).
//
// Row kernels (rmsnorm_rows, add_residual with a norm, argmax_rows) give each row one block and reduce
// it with a block reduction; elementwise kernels (swiglu, geglu_tanh, softcap, the plain residual add)
// are grid-stride loops. Both read float4 words when every pointer is 16-byte aligned (and, for rows, the
// width is a multiple of 4 so that every row stays aligned), single floats otherwise: ragged sizes are legal.
#include "kernels/cuda/elementwise.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/activations.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/q8_units.cuh"
#include "kernels/cuda/row_reduce.cuh"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace {

bool aligned16(const void* p) {
    return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Threads for a pass over `units` loads of a row: about `per_thread` loads each, a multiple of the warp
// size (the block reductions need whole warps), at most 1024.
int row_threads(int64_t units, int64_t per_thread) {
    const int64_t want = (units + per_thread - 1) / per_thread;
    return static_cast<int>(std::clamp<int64_t>((want + 31) / 32 * 32, 32, 1024));
}

void require(bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("tern::cuda elementwise: ") + what);
}

// ---- RMSNorm ------------------------------------------------------------------------------------------
//
// The CPU's rmsnorm_f32 (kernels/cpu/ops.cpp) sums the squares in double, rounds the mean to float and
// scales with float operations. Here too: the square of a float is exact in double, so the sum differs
// from the CPU's only by double roundings in another order and the float mean is almost always the same
// float; the scale and the products are the same IEEE float operations. The conversion and double add
// per element cost nothing on H100/H200 and about keep pace with memory where FP64 runs at 1/64 rate.

// y = norm(x) * w; x += norm(y) * w (add_residual); or y = norm(x) * w and y also as q8 units (the input of
// the int8 decode matmuls, written by the lanes that computed it: one launch instead of two).
enum class NormOut { store, add, store_q8 };

template <int VEC> struct Vec;
template <> struct Vec<1> {
    using type = float;
    static __device__ __forceinline__ float get(const float& v, int) { return v; }
    static __device__ __forceinline__ void set(float& v, int, float f) { v = f; }
};
template <> struct Vec<4> {
    using type = float4;
    static __device__ __forceinline__ float get(const float4& v, int j) {
        return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
    }
    static __device__ __forceinline__ void set(float4& v, int j, float f) {
        if (j == 0) v.x = f;
        else if (j == 1) v.y = f;
        else if (j == 2) v.z = f;
        else v.w = f;
    }
};

// One block per row of `width` floats (VEC | width). `src` is the row that is normed; with NormOut::store
// the result goes to dst (which may be src), with NormOut::add it is added to dst. w may be null. With
// NormOut::store_q8 (VEC 4, width a multiple of 32, a multiple of 32 threads: the 8 lanes of a 32-element
// block are always active together) row r is also written as q8 units at q8 + r * q8_column_bytes(width).
template <int VEC, NormOut MODE>
__global__ void rmsnorm_rows_kernel(const float* src, const float* w, float* dst, int width, float eps, uint8_t* q8) {
    dependent_launch::wait_and_release();
    using V = Vec<VEC>;
    using T = typename V::type;
    const int64_t row_offset = static_cast<int64_t>(blockIdx.x) * width;
    const T* s = reinterpret_cast<const T*>(src + row_offset);
    T* d = reinterpret_cast<T*>(dst + row_offset);
    const T* wv = reinterpret_cast<const T*>(w);
    const int units = width / VEC;

    double sum = 0.0;
    for (int i = threadIdx.x; i < units; i += blockDim.x) {
        const T v = s[i];
        for (int j = 0; j < VEC; ++j) {
            const double e = V::get(v, j);
            sum += e * e;
        }
    }
    __shared__ double partial[32];
    sum = block_reduce(sum, SumOp{}, partial); // its barrier also orders every read above before the writes below
    const float mean = static_cast<float>(sum / static_cast<double>(width));
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));

    for (int i = threadIdx.x; i < units; i += blockDim.x) {
        const T v = s[i];
        T out{};
        if constexpr (MODE == NormOut::add) out = d[i];
        const T wi = w ? wv[i] : T{};
        for (int j = 0; j < VEC; ++j) {
            float y = __fmul_rn(V::get(v, j), scale);
            if (w) y = __fmul_rn(y, V::get(wi, j));
            V::set(out, j, MODE == NormOut::add ? __fadd_rn(V::get(out, j), y) : y);
        }
        d[i] = out;
        if constexpr (MODE == NormOut::store_q8) {
            static_assert(VEC == 4, "q8 units take four elements a lane");
            q8_units::write_block(out, i % q8_units::kLanesPerBlock, i / q8_units::kLanesPerBlock, width,
                                  q8 + static_cast<int64_t>(blockIdx.x) * (width + width / 2));
        }
    }
}

template <NormOut MODE>
void launch_rmsnorm_rows(const float* src, const float* w, float* dst, int64_t rows, int64_t width, float eps,
                         cudaStream_t stream, uint8_t* q8 = nullptr) {
    require(rows >= 0 && width >= 0, "negative rows or width");
    require(width <= (int64_t{1} << 30) && rows < (int64_t{1} << 31), "rows or width too large");
    if (rows == 0 || width == 0) return;
    const dim3 grid(static_cast<unsigned>(rows));
    const bool vec4 = width % 4 == 0 && aligned16(src) && aligned16(w) && aligned16(dst);
    if constexpr (MODE == NormOut::store_q8) {
        require(rmsnorm_rows_q8_takes(src, w, dst, q8, width),
                "q8 output needs a width of whole 32-element blocks and 16-byte alignment");
        launch_dependent(rmsnorm_rows_kernel<4, MODE>, grid, dim3(row_threads(width / 4, 4)), 0, stream, src, w, dst,
                         static_cast<int>(width), eps, q8);
    } else if (vec4) {
        launch_dependent(rmsnorm_rows_kernel<4, MODE>, grid, dim3(row_threads(width / 4, 4)), 0, stream, src, w, dst,
                         static_cast<int>(width), eps, q8);
    } else {
        launch_dependent(rmsnorm_rows_kernel<1, MODE>, grid, dim3(row_threads(width, 16)), 0, stream, src, w, dst,
                         static_cast<int>(width), eps, q8);
    }
}

// ---- Elementwise maps ---------------------------------------------------------------------------------

struct SwigluOp {
    __device__ __forceinline__ float operator()(float g, float u) const { return swiglu_f32(g, u); }
};
struct GegluTanhOp {
    __device__ __forceinline__ float operator()(float g, float u) const { return geglu_tanh_f32(g, u); }
};
struct SwigluOaiOp {
    __device__ __forceinline__ float operator()(float g, float u) const { return swiglu_oai_f32(g, u); }
};
struct ScaleOp {
    float s;
    __device__ __forceinline__ float operator()(float x, float) const { return __fmul_rn(x, s); }
};
struct SoftcapOp {
    float cap;
    __device__ __forceinline__ float operator()(float x, float) const { return softcap_f32(x, cap); }
};
struct AddOp {
    __device__ __forceinline__ float operator()(float x, float y) const { return __fadd_rn(x, y); }
};

// out[i] = op(a[i], b[i]) for i < n (b null: op(a[i], 0)); out may be a or b. A grid-stride loop over float4
// words when VEC is 4 (a, b, out 16-byte aligned); the n % 4 last floats then go to the grid's first threads.
template <int VEC, typename Op> __global__ void map_kernel(Op op, const float* a, const float* b, float* out, int n) {
    dependent_launch::wait_and_release();
    using V = Vec<VEC>;
    using T = typename V::type;
    const int units = n / VEC;
    const int stride = static_cast<int>(blockDim.x * gridDim.x);
    const int first = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    const T* av = reinterpret_cast<const T*>(a);
    const T* bv = reinterpret_cast<const T*>(b);
    T* ov = reinterpret_cast<T*>(out);
    for (int i = first; i < units; i += stride) {
        const T x = av[i];
        const T y = b ? bv[i] : T{};
        T r;
        for (int j = 0; j < VEC; ++j) V::set(r, j, op(V::get(x, j), V::get(y, j)));
        ov[i] = r;
    }
    const int tail = units * VEC + first;
    if (VEC > 1 && tail < n) out[tail] = op(a[tail], b ? b[tail] : 0.0f);
}

template <typename Op> void launch_map(Op op, const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
    require(n >= 0, "negative element count");
    constexpr int64_t chunk = int64_t{1} << 30; // int indices inside the kernel
    constexpr int threads = 256;
    constexpr int64_t max_blocks = 8192;        // the loop strides over the rest
    for (int64_t begin = 0; begin < n; begin += chunk) {
        const int count = static_cast<int>(std::min(chunk, n - begin));
        const float* ab = a + begin;
        const float* bb = b ? b + begin : nullptr;
        float* ob = out + begin;
        const bool vec = aligned16(ab) && aligned16(bb) && aligned16(ob);
        const int64_t units = vec ? count / 4 : count;
        const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>((units + threads - 1) / threads, 1, max_blocks)));
        if (vec)
            launch_dependent(map_kernel<4, Op>, grid, dim3(threads), 0, stream, op, ab, bb, ob, count);
        else
            launch_dependent(map_kernel<1, Op>, grid, dim3(threads), 0, stream, op, ab, bb, ob, count);
    }
}

// ---- Argmax -------------------------------------------------------------------------------------------
//
// Each thread keeps the first largest value it sees (its indices only grow), then the block takes the
// largest argmax_key (row_reduce.cuh): the largest value at its lowest index, exact whatever the split.

// The key of row[begin, end) (VEC | begin, VEC | end), the same in every thread of the block.
template <int VEC> __device__ uint64_t block_argmax_key(const float* row, int begin, int end) {
    using V = Vec<VEC>;
    using T = typename V::type;
    const T* r = reinterpret_cast<const T*>(row + begin);
    const int units = (end - begin) / VEC;
    float best = 0.0f;
    int best_index = -1;
    auto consider = [&](const T& v, int unit) {
        for (int j = 0; j < VEC; ++j) {
            if (best_index < 0 || V::get(v, j) > best) { // strict: the first of equal values stays
                best = V::get(v, j);
                best_index = unit * VEC + j;
            }
        }
    };
    // Two loads in flight per iteration: a row is read by one block, so its memory parallelism is all there is.
    const int threads = static_cast<int>(blockDim.x);
    int i = static_cast<int>(threadIdx.x);
    for (; i + threads < units; i += 2 * threads) {
        const T v0 = r[i], v1 = r[i + threads];
        consider(v0, i);
        consider(v1, i + threads);
    }
    if (i < units) consider(r[i], i);
    __shared__ uint64_t partial[32];
    const uint64_t key = best_index < 0 ? 0 : argmax_key(best, static_cast<uint32_t>(begin + best_index));
    return block_reduce(key, MaxOp{}, partial);
}

// One block per row: out[row] = the argmax of the row.
template <int VEC> __global__ void argmax_rows_kernel(const float* x, int width, int32_t* out) {
    const uint64_t key = block_argmax_key<VEC>(x + static_cast<int64_t>(blockIdx.x) * width, 0, width);
    if (threadIdx.x == 0) out[blockIdx.x] = argmax_key_index(key);
}

// blockIdx.y is the row, blockIdx.x one of its `chunk`-float slices (VEC | chunk): keys[row * gridDim.x + slice].
template <int VEC> __global__ void argmax_slices_kernel(const float* x, int width, int chunk, uint64_t* keys) {
    const int begin = static_cast<int>(blockIdx.x) * chunk;
    const int end = min(begin + chunk, width);
    const uint64_t key = block_argmax_key<VEC>(x + static_cast<int64_t>(blockIdx.y) * width, begin, end);
    if (threadIdx.x == 0) keys[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = key;
}

struct OrOp {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a | b; }
};

// blockIdx.y is the row, blockIdx.x one of its `chunk`-float slices: the slice's kinds ORed into flags[row]. A
// sound slice costs one compare per value and one atomic per block.
__global__ void scan_slices_kernel(const float* x, int width, int chunk, uint32_t* flags) {
    const int begin = static_cast<int>(blockIdx.x) * chunk;
    const int end = min(begin + chunk, width);
    const float* r = x + static_cast<int64_t>(blockIdx.y) * width;
    uint32_t mine = 0;
    for (int i = begin + static_cast<int>(threadIdx.x); i < end; i += static_cast<int>(blockDim.x)) {
        const uint32_t u = __float_as_uint(r[i]);
        const uint32_t magnitude = u & 0x7FFFFFFFu;
        if (magnitude > 0x7F800000u)
            mine |= kRowHasNan;
        else if (u == 0x7F800000u)
            mine |= kRowHasPosInf;
        else if (u != 0xFF800000u)
            mine |= kRowHasFinite;
    }
    __shared__ uint32_t partial[32];
    const uint32_t block = block_reduce(mine, OrOp{}, partial);
    if (threadIdx.x == 0 && block != 0) atomicOr(&flags[blockIdx.y], block);
}

// One warp per row folds the slices' keys: out[row].
__global__ void argmax_fold_kernel(const uint64_t* keys, int slices, int32_t* out) {
    const uint64_t* k = keys + static_cast<int64_t>(blockIdx.x) * slices;
    uint64_t key = 0;
    for (int i = threadIdx.x; i < slices; i += 32) key = key > k[i] ? key : k[i];
    key = warp_reduce(key, MaxOp{});
    if (threadIdx.x == 0) out[blockIdx.x] = argmax_key_index(key);
}

constexpr int kArgmaxSliceFloats = 4096;    // per block of argmax_rows_split: 16 KiB, 16 floats per thread
constexpr int kArgmaxSliceThreads = 256;

void check_argmax_shape(int64_t rows, int64_t width) {
    require(rows >= 0 && rows < (int64_t{1} << 31), "argmax rows out of range");
    require(width >= 1 && width <= (int64_t{1} << 30), "argmax width out of range (1..2^30)");
}

} // namespace

void rmsnorm_rows(const float* x, const float* w, float* y, int64_t rows, int64_t width, float eps,
                  cudaStream_t stream) {
    launch_rmsnorm_rows<NormOut::store>(x, w, y, rows, width, eps, stream);
}

void rmsnorm_rows_q8(const float* x, const float* w, float* y, int64_t rows, int64_t width, float eps, void* q8,
                     cudaStream_t stream) {
    launch_rmsnorm_rows<NormOut::store_q8>(x, w, y, rows, width, eps, stream, static_cast<uint8_t*>(q8));
}

bool rmsnorm_rows_q8_takes(const void* x, const void* w, const void* y, const void* q8, int64_t width) {
    return width > 0 && width % 32 == 0 && aligned16(x) && aligned16(w) && aligned16(y) && aligned16(q8) &&
           x != nullptr && y != nullptr && q8 != nullptr;
}

void add_residual(float* x, const float* y, const float* w, int64_t rows, int64_t width, float eps,
                  cudaStream_t stream) {
    if (w)
        launch_rmsnorm_rows<NormOut::add>(y, w, x, rows, width, eps, stream);
    else
        launch_map(AddOp{}, x, y, x, rows * width, stream);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
    launch_map(SwigluOp{}, gate, up, out, n, stream);
}

void geglu_tanh(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
    launch_map(GegluTanhOp{}, gate, up, out, n, stream);
}

void swiglu_oai(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
    launch_map(SwigluOaiOp{}, gate, up, out, n, stream);
}

void scale(float* x, int64_t n, float s, cudaStream_t stream) { launch_map(ScaleOp{s}, x, nullptr, x, n, stream); }

void softcap(float* x, int64_t n, float cap, cudaStream_t stream) {
    require(cap > 0.0f, "softcap needs a positive cap");
    launch_map(SoftcapOp{cap}, x, nullptr, x, n, stream);
}

void argmax_rows(const float* x, int64_t rows, int64_t width, int32_t* out, cudaStream_t stream) {
    check_argmax_shape(rows, width);
    if (rows == 0) return;
    const dim3 grid(static_cast<unsigned>(rows));
    if (width % 4 == 0 && aligned16(x))
        launch(argmax_rows_kernel<4>, grid, dim3(row_threads(width / 4, 16)), 0, stream, x, static_cast<int>(width),
               out);
    else
        launch(argmax_rows_kernel<1>, grid, dim3(row_threads(width, 64)), 0, stream, x, static_cast<int>(width), out);
}

int64_t argmax_rows_split_scratch_bytes(int64_t rows, int64_t width) {
    check_argmax_shape(rows, width);
    return rows * ((width + kArgmaxSliceFloats - 1) / kArgmaxSliceFloats) * static_cast<int64_t>(sizeof(uint64_t));
}

void argmax_rows_split(const float* x, int64_t rows, int64_t width, int32_t* out, void* scratch,
                       cudaStream_t stream) {
    check_argmax_shape(rows, width);
    if (rows == 0) return;
    require(rows < 65536, "argmax_rows_split takes at most 65535 rows");
    require(aligned16(scratch), "argmax_rows_split scratch must be 16-byte aligned");
    const int slices = static_cast<int>((width + kArgmaxSliceFloats - 1) / kArgmaxSliceFloats);
    auto* keys = static_cast<uint64_t*>(scratch);
    const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(rows));
    if (width % 4 == 0 && aligned16(x))
        launch(argmax_slices_kernel<4>, grid, dim3(kArgmaxSliceThreads), 0, stream, x, static_cast<int>(width),
               kArgmaxSliceFloats, keys);
    else
        launch(argmax_slices_kernel<1>, grid, dim3(kArgmaxSliceThreads), 0, stream, x, static_cast<int>(width),
               kArgmaxSliceFloats, keys);
    launch(argmax_fold_kernel, dim3(static_cast<unsigned>(rows)), dim3(32), 0, stream, keys, slices, out);
}

void scan_rows(const float* x, int64_t rows, int64_t width, uint32_t* flags, cudaStream_t stream) {
    check_argmax_shape(rows, width);
    if (rows == 0) return;
    require(rows < 65536, "scan_rows takes at most 65535 rows");
    check(cudaMemsetAsync(flags, 0, static_cast<size_t>(rows) * sizeof(uint32_t), stream), "zeroing the row flags");
    const int slices = static_cast<int>((width + kArgmaxSliceFloats - 1) / kArgmaxSliceFloats);
    const dim3 grid(static_cast<unsigned>(slices), static_cast<unsigned>(rows));
    launch(scan_slices_kernel, grid, dim3(kArgmaxSliceThreads), 0, stream, x, static_cast<int>(width),
           kArgmaxSliceFloats, flags);
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
