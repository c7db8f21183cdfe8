#pragma once
// Where a KV row is on the device (kernels/cuda/attention.h KvLayer): the contiguous layout of one sequence
// (per head n_ctx consecutive rows), or the paged pool (engine/cuda/kv_cache_cuda.h), where position pos of a
// sequence is in the page slot its page table names for pos / kKvPagePositions, a slot holding n_kv_heads
// runs of kKvPagePositions rows. Shared by kv_cache.cu, rope.cu and attention.cu, which all read or write
// rows through kv_row().
#include <cstdint>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/runtime.h"
#include "kernels/kv_format.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

// The K or the V buffer of a layer: its bytes, the bytes of one page slot (unused when contiguous), the rows
// of one head's run (kKvPagePositions when paged, n_ctx when contiguous) and the bytes of one row.
struct KvRows {
    uint8_t* base;
    int64_t page_bytes;
    int32_t head_rows;
    int32_t row_bytes;
};

inline KvRows kv_rows_of(const KvLayer& layer, bool value) {
    KvRows r{};
    r.base = static_cast<uint8_t*>(value ? layer.v : layer.k);
    r.row_bytes = static_cast<int32_t>(kv_row_bytes(layer.type, value ? layer.head_dim_v : layer.head_dim));
    r.head_rows = layer.pages ? kKvPagePositions : layer.n_ctx;
    r.page_bytes = int64_t{layer.n_kv_heads} * r.head_rows * r.row_bytes;
    return r;
}

// Row `pos` of head `head`: through `pages` (a sequence's page table, device memory) when it is set, else in
// the contiguous layout. The page arithmetic divides by a power-of-two constant: shifts and masks.
__device__ __forceinline__ uint8_t* kv_row(const KvRows& r, const int32_t* pages, int head, int pos) {
    if (!pages) return r.base + (static_cast<int64_t>(head) * r.head_rows + pos) * r.row_bytes;
    return r.base + static_cast<int64_t>(pages[pos / kKvPagePositions]) * r.page_bytes +
           (static_cast<int64_t>(head) * kKvPagePositions + pos % kKvPagePositions) * r.row_bytes;
}

// Rows of a run that starts at position pos and stays in one page (or the contiguous layout): how many of
// `count` rows follow pos there before the page ends.
__device__ __forceinline__ int kv_rows_in_page(const KvRows& r, const int32_t* pages, int pos, int count) {
    const int left = pages ? kKvPagePositions - pos % kKvPagePositions : r.head_rows - pos;
    return left < count ? left : count;
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
