// The KV cache's writes on the GPU (kernels/cuda/attention.h): kv_write encodes new K/V rows bit for bit
// as the CPU's kv_store_row, kv_erase is the context shift of engine/cpu/kv_cache_erase.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/kv_codec.cuh"
#include "kernels/cuda/kv_rows.cuh"
#include "kernels/cuda/launch.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace {

constexpr int kWriteThreads = 128;
constexpr int kWriteWarps = kWriteThreads / 32;

// One block per (token, KV head): its K and V rows are split into 32-element segments (the blocks of
// the block formats), one warp per segment. Every format at head dims that are multiples of 32.
template <KvType F>
__global__ void __launch_bounds__(kWriteThreads)
    kv_write_kernel(KvRows k_cache, KvRows v_cache, const int32_t* pages, const float* k, const float* v,
                    int32_t n_kv_heads, int32_t head_dim, int32_t head_dim_v, int32_t pos0, const int32_t* pos0_device) {
    if (pos0_device) pos0 = *pos0_device;
    __shared__ float scratch[kWriteWarps][kv_codec::kF8ScratchFloats];
    const int token = static_cast<int>(blockIdx.x), head = static_cast<int>(blockIdx.y);
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int k_segments = head_dim / 32, segments = k_segments + head_dim_v / 32;
    const float* k_src = k + (static_cast<int64_t>(token) * n_kv_heads + head) * head_dim;
    const float* v_src = v + (static_cast<int64_t>(token) * n_kv_heads + head) * head_dim_v;
    uint8_t* k_dst = kv_row(k_cache, pages, head, pos0 + token);
    uint8_t* v_dst = kv_row(v_cache, pages, head, pos0 + token);
    for (int s = warp; s < segments; s += kWriteWarps) {
        const bool is_k = s < k_segments;
        const int seg = is_k ? s : s - k_segments;
        kv_codec::store_segment<F>((is_k ? k_src : v_src) + seg * 32,
                                   (is_k ? k_dst : v_dst) + seg * kv_codec::segment_bytes<F>(), lane, scratch[warp]);
    }
}

// Float formats at head dims that are not multiples of 32 (small models: 8, 16, 40, ...): element by
// element, block (token, y) taking elements [y * kWriteThreads, ...) of the token's K rows followed by its
// V rows (n_kv_heads * (head_dim + head_dim_v) elements: consecutive threads read consecutive floats and
// write consecutive elements of a row).
template <KvType F>
__global__ void __launch_bounds__(kWriteThreads)
    kv_write_elements_kernel(KvRows k_cache, KvRows v_cache, const int32_t* pages, const float* k, const float* v,
                             int32_t n_kv_heads, int32_t head_dim, int32_t head_dim_v, int32_t pos0,
                             const int32_t* pos0_device) {
    if (pos0_device) pos0 = *pos0_device;
    const int token = static_cast<int>(blockIdx.x);
    const int k_elems = n_kv_heads * head_dim;
    int e = static_cast<int>(blockIdx.y * kWriteThreads + threadIdx.x);
    if (e >= k_elems + n_kv_heads * head_dim_v) return;
    const bool is_k = e < k_elems;
    if (!is_k) e -= k_elems;
    const int dim = is_k ? head_dim : head_dim_v;
    const int head = e / dim, i = e - head * dim;
    const float x = is_k ? k[static_cast<int64_t>(token) * k_elems + e]
                         : v[static_cast<int64_t>(token) * n_kv_heads * head_dim_v + e];
    kv_codec::store_float<F>(x, kv_row(is_k ? k_cache : v_cache, pages, head, pos0 + token), i);
}

// ---- kv_erase -------------------------------------------------------------------------------------------

// A move of `moved` rows down by `removed` (the rows at end + i go to begin + i, removed = end - begin)
// is cut into steps. A step of rows [first, first + count) with count <= removed reads no row it writes
// (its sources start at end + first, its destinations end below begin + first + count <= end + first),
// so any number of blocks may share it: a "wave". The stream orders the waves. A move that would take
// more than kMaxWaves waves (a small gap before a long tail) is instead one step walked in order by one
// block per head, in passes that read all their rows before writing any (a barrier between): a pass's
// stores land below every row a later pass reads.
constexpr int kMaxWaves = 16;

struct MoveStep {
    int32_t first, count, rows_per_block;
};

std::vector<MoveStep> move_steps(int32_t removed, int32_t moved, int32_t rows_per_block) {
    std::vector<MoveStep> steps;
    if ((moved + removed - 1) / removed > kMaxWaves) {
        steps.push_back({0, moved, moved});
        return steps;
    }
    for (int32_t first = 0; first < moved; first += removed)
        steps.push_back({first, std::min(removed, moved - first), rows_per_block});
    return steps;
}

dim3 step_grid(const MoveStep& s, int32_t n_heads) {
    return dim3(static_cast<unsigned>((s.count + s.rows_per_block - 1) / s.rows_per_block),
                static_cast<unsigned>(n_heads));
}

constexpr int kMoveThreads = 256;
constexpr int64_t kMoveBlockBytes = 32 * 1024; // bytes per block in a wave

// Unit i of the rows [from, ...) of a head: row from + i / units_per_row (through the page table when paged).
template <typename Unit>
__device__ __forceinline__ Unit* unit_at(const KvRows& rows, const int32_t* pages, int head, int32_t from,
                                         int32_t units_per_row, int64_t i) {
    const auto r = static_cast<int32_t>(i / units_per_row);
    return reinterpret_cast<Unit*>(kv_row(rows, pages, head, from + r)) + (i - int64_t{r} * units_per_row);
}

// Rows of a move step as bytes: block (x, head) copies rows [first + x * rows_per_block, ...) of its head, in
// passes of kMoveThreads * kUnitsPerThread units that read all their units before writing any.
template <typename Unit, int kUnitsPerThread>
__global__ void __launch_bounds__(kMoveThreads)
    move_rows_kernel(KvRows heads, const int32_t* pages, int32_t begin, int32_t end, MoveStep step) {
    const int32_t r0 = step.first + static_cast<int32_t>(blockIdx.x) * step.rows_per_block;
    const int32_t rows = min(step.rows_per_block, step.first + step.count - r0);
    const int head = static_cast<int>(blockIdx.y);
    const auto units_per_row = static_cast<int32_t>(heads.row_bytes / static_cast<int32_t>(sizeof(Unit)));
    const int64_t units = int64_t{rows} * units_per_row;
    constexpr int64_t kPass = static_cast<int64_t>(kMoveThreads) * kUnitsPerThread;
    for (int64_t p = 0; p < units; p += kPass) {
        Unit r[kUnitsPerThread] = {};
        TERN_UNROLL
        for (int u = 0; u < kUnitsPerThread; ++u) {
            const int64_t i = p + u * kMoveThreads + threadIdx.x;
            if (i < units) r[u] = *unit_at<Unit>(heads, pages, head, end + r0, units_per_row, i);
        }
        __syncthreads();
        TERN_UNROLL
        for (int u = 0; u < kUnitsPerThread; ++u) {
            const int64_t i = p + u * kMoveThreads + threadIdx.x;
            if (i < units) *unit_at<Unit>(heads, pages, head, begin + r0, units_per_row, i) = r[u];
        }
    }
}

// The rotation by delta positions as the CPU's rope_rotation (kernels/cpu/rope_shift.cpp) computes it,
// passed by value (at most 128 pairs: head dims are at most 256).
struct KRotation {
    float cos[128];
    float sin[128];
    int32_t n_rot;
    int32_t neox;
};

constexpr int kRotateThreads = 256;
constexpr int kRotateWarps = kRotateThreads / 32;
constexpr int kRotateRows = 16; // rows decoded, rotated and re-encoded per pass (16 KiB of f32 at 256)

// K rows of a move step decoded to f32, rotated and encoded at their new positions, as the CPU's
// KvCache::erase does for stored formats (and, with the same arithmetic, for f32 rows). Block (x, head)
// takes rows [first + x * rows_per_block, ...) in passes of kRotateRows, each read whole before its
// stores (a barrier between).
template <KvType F>
__global__ void __launch_bounds__(kRotateThreads)
    rotate_k_kernel(KvRows k_cache, const int32_t* pages, int32_t head_dim, int32_t begin, int32_t end, MoveStep step,
                    KRotation rot) {
    __shared__ float scratch[kRotateWarps][kv_codec::kF8ScratchFloats];
    float* rows = dynamic_shared<float>(); // kRotateRows x head_dim
    const int head = static_cast<int>(blockIdx.y);
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int half = rot.n_rot / 2;
    const int32_t r0 = step.first + static_cast<int32_t>(blockIdx.x) * step.rows_per_block;
    const int32_t r1 = min(r0 + step.rows_per_block, step.first + step.count);
    for (int32_t p = r0; p < r1; p += kRotateRows) {
        const int n = min(kRotateRows, r1 - p);
        for (int r = warp; r < n; r += kRotateWarps)
            kv_codec::load_row_warp<F>(kv_row(k_cache, pages, head, end + p + r), rows + r * head_dim, head_dim, lane);
        __syncthreads();
        // rope_rotate_rows: pairs (i, i + n_rot/2) for neox, else (2i, 2i + 1); dims n_rot.. pass through.
        for (int t = static_cast<int>(threadIdx.x); t < n * half; t += kRotateThreads) {
            const int r = t / half, i = t - r * half;
            float* row = rows + r * head_dim;
            const int a = rot.neox ? i : 2 * i, b = rot.neox ? i + half : 2 * i + 1;
            const float x0 = row[a], x1 = row[b], c = rot.cos[i], s = rot.sin[i];
            row[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
            row[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
        }
        __syncthreads();
        for (int r = warp; r < n; r += kRotateWarps)
            kv_codec::store_row_warp<F>(rows + r * head_dim, kv_row(k_cache, pages, head, begin + p + r), head_dim, lane,
                                        scratch[warp]);
        __syncthreads(); // the next pass decodes into `rows`
    }
}

// The angle of pair i at position pos: the twin of rope_theta (kernels/cpu/ops.cpp), in double with the
// same operations, so the cos/sin rounded to float are the CPU's.
// With YaRN (RopeParams' yarn_* fields) pair i's multiplier is rope_pair_scale's mix of freq_scale and 1; the
// shift leaves mscale out, as the CPU's rotation does (the cached key carries it once already).
double rope_angle(int64_t i, int64_t n_rot, int32_t pos, const RopeParams& rope, const float* freq_factors) {
    double scale = static_cast<double>(rope.freq_scale);
    if (rope.yarn_ext_factor != 0.0f) {
        const float y = (static_cast<float>(i) - rope.yarn_corr_low) /
                        std::max(0.001f, rope.yarn_corr_high - rope.yarn_corr_low);
        const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * rope.yarn_ext_factor;
        const double r = static_cast<double>(ramp);
        scale = scale * (1.0 - r) + r;
    }
    const float base = rope.base;
    double theta = static_cast<double>(pos) * scale *
                   std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    if (freq_factors) theta /= static_cast<double>(freq_factors[i]);
    return theta;
}

// Moves the rows of every head as bytes, in the widest unit that divides the row size (rows of every head
// start at multiples of it).
void move_rows(const KvRows& heads, const int32_t* pages, int32_t n_heads, int32_t begin, int32_t end, int32_t moved,
               cudaStream_t stream) {
    const int64_t row_bytes = heads.row_bytes;
    const auto rows_per_block = static_cast<int32_t>(std::max<int64_t>(1, kMoveBlockBytes / row_bytes));
    for (const MoveStep& step : move_steps(end - begin, moved, rows_per_block)) {
        const dim3 grid = step_grid(step, n_heads), block(kMoveThreads);
        if (row_bytes % 16 == 0)
            launch(move_rows_kernel<uint4, 4>, grid, block, 0, stream, heads, pages, begin, end, step);
        else if (row_bytes % 4 == 0)
            launch(move_rows_kernel<uint32_t, 8>, grid, block, 0, stream, heads, pages, begin, end, step);
        else
            launch(move_rows_kernel<uint16_t, 8>, grid, block, 0, stream, heads, pages, begin, end, step);
    }
}

template <KvType F>
void launch_write(const KvLayer& l, const float* k, const float* v, int64_t n, int32_t pos0, cudaStream_t stream,
                  const int32_t* pos0_device) {
    if constexpr (kv_codec::is_float_format(F)) {
        if (l.head_dim % 32 != 0 || l.head_dim_v % 32 != 0) {
            const int64_t elems = int64_t{l.n_kv_heads} * (l.head_dim + l.head_dim_v);
            launch(kv_write_elements_kernel<F>,
                   dim3(static_cast<unsigned>(n), static_cast<unsigned>((elems + kWriteThreads - 1) / kWriteThreads)),
                   dim3(kWriteThreads), 0, stream, kv_rows_of(l, false), kv_rows_of(l, true), l.pages, k, v,
                   l.n_kv_heads, l.head_dim, l.head_dim_v, pos0, pos0_device);
            return;
        }
    }
    launch(kv_write_kernel<F>, dim3(static_cast<unsigned>(n), static_cast<unsigned>(l.n_kv_heads)), dim3(kWriteThreads),
           0, stream, kv_rows_of(l, false), kv_rows_of(l, true), l.pages, k, v, l.n_kv_heads, l.head_dim,
           l.head_dim_v, pos0, pos0_device);
}

template <KvType F>
void launch_rotate(const KvLayer& l, int32_t begin, int32_t end, int32_t moved, const KRotation& rot,
                   cudaStream_t stream) {
    for (const MoveStep& step : move_steps(end - begin, moved, kRotateRows))
        launch(rotate_k_kernel<F>, step_grid(step, l.n_kv_heads), dim3(kRotateThreads),
               sizeof(float) * kRotateRows * static_cast<size_t>(l.head_dim), stream, kv_rows_of(l, false), l.pages,
               l.head_dim, begin, end, step, rot);
}

void check_layer(const KvLayer& l, const char* what) {
    kv_codec::check_kv_shape(l.type, l.head_dim, l.head_dim_v, l.n_kv_heads, l.n_ctx, what);
    if (!l.k || !l.v) throw std::invalid_argument(std::string(what) + ": the layer has no K or V buffer");
}

} // namespace

void kv_write(const KvLayer& layer, const float* k, const float* v, int64_t n, int32_t pos0, cudaStream_t stream,
              const int32_t* pos0_device) {
    check_layer(layer, "kv_write");
    if (n < 0 || pos0 < 0 || pos0 + n > layer.n_ctx)
        throw std::invalid_argument("kv_write: positions " + std::to_string(pos0) + " + " + std::to_string(n) +
                                    " outside the cache's " + std::to_string(layer.n_ctx));
    if (n == 0) return;
    switch (layer.type) {
    case KvType::f32:
        launch_write<KvType::f32>(layer, k, v, n, pos0, stream, pos0_device);
        return;
    case KvType::f16:
        launch_write<KvType::f16>(layer, k, v, n, pos0, stream, pos0_device);
        return;
    case KvType::bf16:
        launch_write<KvType::bf16>(layer, k, v, n, pos0, stream, pos0_device);
        return;
    case KvType::q8_0:
        launch_write<KvType::q8_0>(layer, k, v, n, pos0, stream, pos0_device);
        return;
    case KvType::f8_e4m3:
        launch_write<KvType::f8_e4m3>(layer, k, v, n, pos0, stream, pos0_device);
        return;
    }
    throw std::invalid_argument("kv_write: unknown KV type");
}

void kv_erase(const KvLayer& layer, int32_t begin, int32_t end, int32_t n_past, const RopeParams& rope,
              cudaStream_t stream) {
    check_layer(layer, "kv_erase");
    if (begin < 0 || end < begin || end > n_past || n_past > layer.n_ctx)
        throw std::invalid_argument("kv_erase: positions " + std::to_string(begin) + ".." + std::to_string(end) +
                                    " of " + std::to_string(n_past) + " cached (" + std::to_string(layer.n_ctx) +
                                    " in the cache)");
    const int32_t removed = end - begin, moved = n_past - end;
    if (removed == 0 || moved == 0) return;
    if (rope.n_rot < 0 || rope.n_rot % 2 != 0 || rope.n_rot > layer.head_dim)
        throw std::invalid_argument("kv_erase: n_rot " + std::to_string(rope.n_rot) + " for head dim " +
                                    std::to_string(layer.head_dim));

    move_rows(kv_rows_of(layer, true), layer.pages, layer.n_kv_heads, begin, end, moved, stream);
    if (rope.n_rot == 0) {
        move_rows(kv_rows_of(layer, false), layer.pages, layer.n_kv_heads, begin, end, moved, stream);
        return;
    }

    // The keys turn back by `removed` positions: the CPU's rope_rotation(delta = begin - end), computed
    // here on the host in double like it. The frequency factors live on the device: fetched first.
    const int32_t half = rope.n_rot / 2;
    std::vector<float> factors;
    if (rope.freq_factors) {
        factors.resize(static_cast<size_t>(half));
        check(cudaMemcpyAsync(factors.data(), rope.freq_factors, sizeof(float) * factors.size(), cudaMemcpyDeviceToHost,
                              stream),
              "kv_erase: reading the rope frequency factors");
        check(cudaStreamSynchronize(stream), "kv_erase: reading the rope frequency factors");
    }
    KRotation rot{};
    rot.n_rot = rope.n_rot;
    rot.neox = rope.neox ? 1 : 0;
    for (int32_t i = 0; i < half; ++i) {
        const double theta = rope_angle(i, rope.n_rot, begin - end, rope, factors.empty() ? nullptr : factors.data());
        rot.cos[i] = static_cast<float>(std::cos(theta));
        rot.sin[i] = static_cast<float>(std::sin(theta));
    }
    switch (layer.type) {
    case KvType::f32:
        launch_rotate<KvType::f32>(layer, begin, end, moved, rot, stream);
        return;
    case KvType::f16:
        launch_rotate<KvType::f16>(layer, begin, end, moved, rot, stream);
        return;
    case KvType::bf16:
        launch_rotate<KvType::bf16>(layer, begin, end, moved, rot, stream);
        return;
    case KvType::q8_0:
        launch_rotate<KvType::q8_0>(layer, begin, end, moved, rot, stream);
        return;
    case KvType::f8_e4m3:
        launch_rotate<KvType::f8_e4m3>(layer, begin, end, moved, rot, stream);
        return;
    }
    throw std::invalid_argument("kv_erase: unknown KV type");
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
