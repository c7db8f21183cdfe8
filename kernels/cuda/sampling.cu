// Top-k selection over a logit row after the sampler's penalties (kernels/cuda/sampling.h).
//
// Every entry becomes a 64-bit key (row_reduce.cuh argmax_key: the value's bits made monotonic in the
// high half, the complemented index in the low half), so the sampler's order is the order of the keys and
// no two entries share one; 0 is no key and marks an empty slot.
//
// A pass gives each block a chunk of 4096 keys, 16 per thread held in registers. The block then takes its
// k best by k rounds of a block-wide maximum: each thread offers its own best, the winner is broadcast,
// and only the thread that held it drops it and finds its next best among its 16. The first pass reads
// the row (penalised in shared memory); the next ones read the previous pass's k keys per block, until a
// pass has one block, which writes the (id, logit) pairs. k <= 256 keeps the candidates of a pass at most
// 1/16 of its input, so a 262144-entry row takes two passes for k = 40 and three for k = 256.
#include "kernels/cuda/sampling.h"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/row_reduce.cuh"
#include "kernels/cuda/unroll.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = 16;
constexpr int kChunk = kThreads * kPerThread;   // keys per block and pass

// The host's penalised_logit (engine/logit_candidates.h), each operation rounded on its own (no FMA).
__device__ __forceinline__ float penalised(float l, int count, float repeat, float frequency, float presence) {
    l = l > 0.0f ? __fdiv_rn(l, repeat) : __fmul_rn(l, repeat);
    return __fsub_rn(l, __fadd_rn(__fmul_rn(static_cast<float>(count), frequency), presence));
}

// The key of row entry `index`: NaN as -inf, as the sampler cleans it.
__device__ __forceinline__ uint64_t logit_key(float v, int index) {
    const float clean = v != v ? -__uint_as_float(0x7F800000u) : v;
    return argmax_key(clean, static_cast<uint32_t>(index));
}

__device__ __forceinline__ TopLogit key_logit(uint64_t key) {
    if (key == 0) return {-1, -__uint_as_float(0x7F800000u)};
    const auto ordered = static_cast<uint32_t>(key >> 32);
    const uint32_t bits = (ordered & 0x80000000u) ? (ordered & 0x7FFFFFFFu) : ~ordered;
    return {argmax_key_index(key), __uint_as_float(bits)};
}

__device__ __forceinline__ uint64_t max_key(uint64_t a, uint64_t b) { return a > b ? a : b; }

// The largest key of a full warp, in every lane.
__device__ __forceinline__ uint64_t warp_max_key(uint64_t key) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    return warp_reduce(key, MaxOp{});
#else
    // Two 32-bit reductions (one instruction each from sm_80) instead of five 64-bit shuffle steps: the
    // high halves, then the low halves of the lanes holding the highest one.
    const auto high = static_cast<uint32_t>(key >> 32);
    const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, high);
    const uint32_t low = __reduce_max_sync(0xFFFFFFFFu, high == top ? static_cast<uint32_t>(key) : 0u);
    return (static_cast<uint64_t>(top) << 32) | low;
#endif
}

// The block's k largest keys, largest first, handed to store(r, key) by thread 0 (0 for the rounds after
// the block ran out of keys, stored by several threads). keys: this thread's kPerThread keys (0: empty).
template <typename Store>
__device__ __forceinline__ void block_top_keys(uint64_t (&keys)[kPerThread], int k, Store store) {
    // Two sets of warp slots used in turn: a round's writes cannot race the reads of the round before,
    // whose readers have all passed this round's barrier, so one barrier per round suffices.
    __shared__ uint64_t slots[2][kWarps];
    uint64_t mine = 0;
    TERN_UNROLL
    for (int j = 0; j < kPerThread; ++j) mine = max_key(mine, keys[j]);
    const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
    for (int r = 0; r < k; ++r) {
        const uint64_t warp_best = warp_max_key(mine);
        if (lane == 0) slots[r & 1][warp] = warp_best;
        __syncthreads();
        uint64_t best = slots[r & 1][0];
        TERN_UNROLL
        for (int w = 1; w < kWarps; ++w) best = max_key(best, slots[r & 1][w]);
        if (best == 0) {   // the same in every thread: the block has no keys left
            for (int e = r + static_cast<int>(threadIdx.x); e < k; e += kThreads) store(e, uint64_t{0});
            return;
        }
        if (threadIdx.x == 0) store(r, best);
        if (mine == best) {   // keys are unique: one thread holds the winner
            mine = 0;
            TERN_UNROLL
            for (int j = 0; j < kPerThread; ++j) {
                if (keys[j] == best) keys[j] = 0;
                mine = max_key(mine, keys[j]);
            }
        }
    }
}

// Where a pass's block puts its k keys: `keys` (k per block) or, for the last pass (one block), `out`.
struct PassOutput {
    uint64_t* keys;
    TopLogit* out;
    int k;
    __device__ __forceinline__ void operator()(int r, uint64_t key) const {
        if (out)
            out[r] = key_logit(key);
        else
            keys[static_cast<int64_t>(blockIdx.x) * k + r] = key;
    }
};

// The first pass: the row's chunks of kChunk entries, penalised in shared memory.
__global__ void __launch_bounds__(kThreads)
    top_logits_row_kernel(const float* row, int n, TopLogitsPenalties penalties, PassOutput output) {
    __shared__ float chunk[kChunk];
    const int base = static_cast<int>(blockIdx.x) * kChunk;   // < n < 2^31
    const int count = min(kChunk, n - base);
    const float* src = row + base;
    TERN_UNROLL
    for (int j = 0; j < kPerThread; ++j) {   // every load issued before the first is needed
        const int i = static_cast<int>(threadIdx.x) + j * kThreads;
        if (i < count) chunk[i] = src[i];
    }
    if (penalties.n_pairs > 0) {
        __syncthreads();
        // Distinct ids: no two threads write one entry. Unsigned distance: ids below base wrap past count.
        for (int p = static_cast<int>(threadIdx.x); p < penalties.n_pairs; p += kThreads) {
            const PenaltyPair pair = penalties.pairs[p];
            const uint32_t at = static_cast<uint32_t>(pair.id) - static_cast<uint32_t>(base);
            if (at < static_cast<uint32_t>(count))
                chunk[at] = penalised(chunk[at], pair.count, penalties.repeat, penalties.frequency, penalties.presence);
        }
    }
    __syncthreads();
    uint64_t keys[kPerThread];
    TERN_UNROLL
    for (int j = 0; j < kPerThread; ++j) {
        const int i = static_cast<int>(threadIdx.x) + j * kThreads;
        keys[j] = i < count ? logit_key(chunk[i], base + i) : 0;
    }
    block_top_keys(keys, output.k, output);
}

// A later pass: the previous pass's m keys (0 for empty slots) in chunks of kChunk.
__global__ void __launch_bounds__(kThreads) top_logits_merge_kernel(const uint64_t* in, int m, PassOutput output) {
    const int base = static_cast<int>(blockIdx.x) * kChunk;
    const uint64_t* src = in + base;
    const int count = min(kChunk, m - base);
    uint64_t keys[kPerThread];
    TERN_UNROLL
    for (int j = 0; j < kPerThread; ++j) {
        const int i = static_cast<int>(threadIdx.x) + j * kThreads;
        keys[j] = i < count ? src[i] : 0;
    }
    block_top_keys(keys, output.k, output);
}

int64_t blocks_for(int64_t n) { return (n + kChunk - 1) / kChunk; }

void require(bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("tern::cuda top_logits: ") + what);
}

void check_shape(int64_t n, int k) {
    require(n >= 1 && n < (int64_t{1} << 31), "row length out of range (1..2^31-1)");
    require(k >= 1 && k <= kTopLogitsMax, "k out of range (1..256)");
}

} // namespace

int64_t top_logits_scratch_bytes(int64_t n, int k) {
    check_shape(n, k);
    // Passes alternate between two key buffers: the first pass's output and the second's, each pass after
    // them no larger than the one two before (see top_logits).
    const int64_t first = blocks_for(n) > 1 ? blocks_for(n) * k : 0;
    const int64_t second = blocks_for(first) > 1 ? blocks_for(first) * k : 0;
    return (first + second) * static_cast<int64_t>(sizeof(uint64_t));
}

void top_logits(const float* row, int64_t n, const TopLogitsPenalties& penalties, int k, TopLogit* out,
                void* scratch, cudaStream_t stream) {
    check_shape(n, k);
    require(penalties.n_pairs >= 0 && (penalties.n_pairs == 0 || penalties.pairs != nullptr),
            "penalty pairs missing");
    const int64_t blocks = blocks_for(n);
    uint64_t* keys = static_cast<uint64_t*>(scratch);
    uint64_t* other = blocks > 1 ? keys + blocks * k : nullptr;
    if (blocks > 1)
        require(scratch != nullptr && reinterpret_cast<uintptr_t>(scratch) % 8 == 0, "scratch missing or misaligned");
    const PassOutput first{keys, blocks > 1 ? nullptr : out, k};
    launch(top_logits_row_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, stream, row,
           static_cast<int>(n), penalties, first);
    // A pass over m keys leaves ceil(m / kChunk) * k <= m / 16 + k of them, so the passes shrink until one
    // block is left; a pass's output never exceeds that of the pass two before, whose buffer it reuses.
    int64_t pass_blocks = blocks, m = blocks * k;
    while (pass_blocks > 1) {
        pass_blocks = blocks_for(m);
        const PassOutput next{other, pass_blocks > 1 ? nullptr : out, k};
        launch(top_logits_merge_kernel, dim3(static_cast<unsigned>(pass_blocks)), dim3(kThreads), 0, stream,
               static_cast<const uint64_t*>(keys), static_cast<int>(m), next);
        m = pass_blocks * k;
        std::swap(keys, other);
    }
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
