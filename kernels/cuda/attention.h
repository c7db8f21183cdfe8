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
// (h * n_ctx + pos) * row_bytes. Rows hold the formats of kernels/kv_format.h.
struct KvLayer {
    KvType type = KvType::f16;
    void* k = nullptr;
    void* v = nullptr;
    int32_t n_kv_heads = 0, head_dim = 0, head_dim_v = 0, n_ctx = 0;
};

// Stores k (n, n_kv_heads, head_dim) and v (n, n_kv_heads, head_dim_v), f32, at positions pos0 ..
// pos0 + n - 1, encoded bit for bit as the CPU's kv_store_row (kernels/cpu/attention.h).
void kv_write(const KvLayer& layer, const float* k, const float* v, int64_t n, int32_t pos0, cudaStream_t stream);

// att (n, n_heads, head_dim_v) for q (n, n_heads, head_dim): token i, at position pos0 + i, attends to
// the cached positions [lo, pos0 + i], lo = pos0 + i - sliding_window + 1 (at least 0) when
// sliding_window > 0, else 0. Query head h reads KV head h / (n_heads / n_kv_heads). Scores are
// (q . k) * scale, then softcap * tanh(score / softcap) when softcap > 0.
void attention(const KvLayer& layer, const float* q, int64_t n, int32_t n_heads, int32_t pos0, int32_t sliding_window,
               float scale, float softcap, float* att, cudaStream_t stream);

// The context shift: removes positions [begin, end) of the n_past cached ones. Rows after `end` move
// down by end - begin; their K rows are turned back by as many positions with `rope` (decoded to f32,
// rotated, re-encoded in the cache's format), V rows move as bytes.
void kv_erase(const KvLayer& layer, int32_t begin, int32_t end, int32_t n_past, const RopeParams& rope,
              cudaStream_t stream);

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
