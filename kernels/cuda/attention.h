#pragma once
// The KV cache on the GPU and attention over it (kernels/cuda/attention.cu, kv_cache.cu).
// Host-callable launchers; every pointer is device memory.
#include <cstdint>

#include "kernels/cuda/rope.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kv_format.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// One layer's cache, laid out as the CPU's (engine/cpu/kv_cache.h): K is n_kv_heads blocks of n_ctx
// rows of kv_row_bytes(type, head_dim) bytes, V likewise with head_dim_v; row `pos` of head h starts at
// (h * n_ctx + pos) * row_bytes. Rows hold the formats of kernels/kv_format.h. k and v are 16-byte
// aligned (cudaMalloc's are). head_dim and head_dim_v (independently) must be at most 256 and multiples of
// 4 from 4 for f32 / f16 / bf16 (8 and 16 as small models have, 40, 80, ...; where one is not a multiple
// of 32, kv_write stores the rows element by element), of 32 from 32 for q8_0 / f8_e4m3 (whole blocks);
// the launchers throw std::invalid_argument otherwise.
//
// Paged (pages set): the buffers are a pool of page slots, as the CPU's (engine/cpu/kv_cache.h). A slot holds
// K (n_kv_heads, kKvPagePositions, head_dim) rows, V likewise; pages is one sequence's page table (device
// memory): position pos is row pos % kKvPagePositions of its head's run in slot pages[pos / kKvPagePositions].
// n_ctx is then the most positions the sequence may hold. The kernels' arithmetic does not depend on where
// the rows are: the two layouts give the same bits.
struct KvLayer {
    KvType type = KvType::f16;
    void* k = nullptr;
    void* v = nullptr;
    int32_t n_kv_heads = 0, head_dim = 0, head_dim_v = 0, n_ctx = 0;
    const int32_t* pages = nullptr;
};

// The tokens of a batch of several sequences over one paged pool (device memory, one entry per token): token
// i is at position pos[i] of the sequence whose page table starts at tables + table[i] (the batch's page
// tables, concatenated). The layer's own `pages` is then unused.
struct KvTokenMap {
    const int32_t* pos = nullptr;
    const int32_t* table = nullptr;
    const int32_t* tables = nullptr;
};

// Stores k (n, n_kv_heads, head_dim) and v (n, n_kv_heads, head_dim_v), f32, at positions pos0 ..
// pos0 + n - 1, encoded bit for bit as the CPU's kv_store_row (kernels/cpu/attention.h).
// With pos0_device set, the kernels read pos0 there instead (device memory: a decode step captured once
// as a CUDA graph and replayed at later positions); pos0 must still be the value it will hold, or one
// with the same attention_plan(), since the launch's shape is chosen from it.
void kv_write(const KvLayer& layer, const float* k, const float* v, int64_t n, int32_t pos0, cudaStream_t stream,
              const int32_t* pos0_device = nullptr);

// qk_norm_rope (kernels/cuda/rope.h) of q (n, n_heads, head_dim) and k (n, n_kv_heads, head_dim) then
// kv_write of the rotated k and of v into `layer`, in one launch and bit for bit those two: q and k are
// rotated in place as qk_norm_rope leaves them, the cache rows as kv_write stores them. The head shape
// (n_kv_heads, head_dim, head_dim_v) is the layer's; pos0 / pos0_device as both. Refusals as both.
void qk_norm_rope_kv_write(const KvLayer& layer, float* q, float* k, const float* v, int64_t n, int32_t n_heads,
                           const float* q_norm, const float* k_norm, float eps, const RopeParams& rope, int32_t pos0,
                           cudaStream_t stream, const int32_t* pos0_device = nullptr);

// qk_norm_rope_kv_write for the tokens of several sequences: token i rotated at its own position map.pos[i]
// and its K/V rows stored through its own sequence's page table (KvTokenMap). The same bits per token as
// qk_norm_rope_kv_write of that token alone at that position.
void qk_norm_rope_kv_write_tokens(const KvLayer& layer, float* q, float* k, const float* v, int64_t n,
                                  int32_t n_heads, const float* q_norm, const float* k_norm, float eps,
                                  const RopeParams& rope, const KvTokenMap& map, cudaStream_t stream);

// att (n, n_heads, head_dim_v) for q (n, n_heads, head_dim): token i, at position pos0 + i, attends to
// the cached positions [lo, pos0 + i], lo = pos0 + i - sliding_window + 1 (at least 0) when
// sliding_window > 0, else 0. Query head h reads KV head h / (n_heads / n_kv_heads). Scores are
// (q . k) * scale, then softcap * tanh(score / softcap) when softcap > 0. q and att are 16-byte aligned.
// f32 throughout with an online softmax: close to the CPU's attend_tokens, not bit-identical. The group
// n_heads / n_kv_heads may be up to min(64, 4096 / max(head_dim, head_dim_v)): 16 at head dim 256, 32 at
// 128, 64 at head dims up to 64 (the small ones included: the cap of 64 rows a block binds there).
// A split KV range keeps its partial states in one device buffer of this module: attention() launches
// must not overlap each other (issue them on one stream, or order the streams).
// sinks (gpt-oss's attention sinks, or null): n_heads logits, one per query head, each joining its head's softmax
// denominator as exp(sinks[h]) with no value row (the CPU's AttnParams::sinks).
// With `prefill` mma, the shapes attention_mma_fits takes (kernels/cuda/attention_mma.h: prefill-sized n, f16
// cache, head dims 64 / 128 / 256, compute capability 8.0+, no sinks) run on f16 tensor cores instead, within a
// tolerance of this f32 kernel; everything else, decode and draft verification included, stays here.
enum class PrefillAttention { f32, mma };
void attention(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t pos0, int32_t sliding_window,
               float scale, float softcap, float* att, cudaStream_t stream, const int32_t* pos0_device = nullptr,
               const float* sinks = nullptr, PrefillAttention prefill = PrefillAttention::f32);

// attention() for the tokens of several sequences (KvTokenMap): token i at position map.pos[i] attends to its
// own sequence's positions [lo, map.pos[i]] (lo as above). Batch invariant by construction: one token per
// block (its group of query heads), and its visible key range cut into splits of kTokenKeysPerSplit keys from
// its first visible key, so the blocks that see a token's keys, and every operation on them, depend on that
// token's position only, never on which or how many other tokens share the launch. max_pos (host) is the
// largest position in map.pos, which sizes the launch. sinks as attention()'s.
inline constexpr int32_t kTokenKeysPerSplit = 256;
void attention_tokens(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t sliding_window,
                      float scale, float softcap, float* att, const KvTokenMap& map, int32_t max_pos,
                      cudaStream_t stream, const float* sinks = nullptr);

// How attention() shares out the work for these arguments (for tests and tuning): blocks of
// tokens_per_block query tokens (each with all query heads of one KV head), query_tiles of them per KV
// head, and the visible key range split over `splits` blocks whose partial softmax states the last to
// finish merges (flash-decoding; more splits when there are fewer (tile, KV head) items than the GPU
// has room for).
struct AttentionPlan {
    int32_t tokens_per_block = 0;
    int32_t query_tiles = 0;
    int32_t splits = 0;
};
AttentionPlan attention_plan(const KvLayer& layer, int64_t n, int32_t n_heads, int32_t pos0, int32_t sliding_window);

// Decode (blocks of up to 8 query rows) with the previous kernel and split rule (true) instead of the
// streaming one (false, the default), to time one against the other on a GPU (TERN_CUDA_ATTN=old, read
// into CudaOptions::old_decode_attention). Process-wide: attention_plan() follows it too, so set it before
// planning or capturing anything. Both give results within attention()'s tolerance.
void set_old_decode_attention(bool old);

// The context shift: removes positions [begin, end) of the n_past cached ones. Rows after `end` move
// down by end - begin; their K rows are turned back by as many positions with `rope` (decoded to f32,
// rotated, re-encoded in the cache's format), V rows move as bytes. The rotation's cos/sin are computed
// on the host exactly as the CPU's rope_rotation, so the result is the CPU's KvCache::erase bit for bit;
// with freq_factors that means reading them back first (a stream synchronisation).
void kv_erase(const KvLayer& layer, int32_t begin, int32_t end, int32_t n_past, const RopeParams& rope,
              cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
