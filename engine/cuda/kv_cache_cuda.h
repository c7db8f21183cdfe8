#pragma once
// The KV cache in GPU memory: a pool of page slots shared by sequences, the CPU cache's paged layout
// (engine/cpu/kv_cache.h) in any KvType. The bookkeeping is the CPU's own KvPageTable (engine/kv_pages.h: page
// tables, reference counts, fork, copy on write) on the host; the bytes live on the device, a shared page is
// copied there before a sequence writes into it, and the kernels read rows through a page table uploaded to
// the device (kernels/cuda/attention.h KvLayer::pages, KvTokenMap). Snapshots use the shared byte format
// (engine/kv_snapshot.h), so a prefix-cache file or a /save taken on the CPU restores here and the other way
// round.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/device_buffer.h"
#include "engine/kv_pages.h"
#include "engine/kv_snapshot.h"
#include "kernels/cuda/attention.h"

namespace tern {
inline namespace TERN_CUDA_ABI {

class CudaKvCache {
public:
    // A pool of n_slots pages (0: enough for n_ctx positions of one sequence) and sequence 0, empty.
    // Throws KvHeadDimsUnfit for head dims the block formats cannot hold, KvAllocationFailed when the GPU
    // memory is not there (engine/load_errors.h).
    void init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim, int32_t head_dim_v,
              int32_t n_ctx, int32_t n_slots, cudaStream_t stream);

    KvType format() const { return shape_.type; }
    int32_t n_ctx() const { return shape_.n_ctx; }   // positions one sequence may hold
    uint64_t total_bytes() const;

    // Sequences (engine/kv_pages.h), as the CPU cache's; the sequence is the last argument, 0 when left out.
    const KvPageTable& pages() const { return table_; }
    void create(int32_t seq) { table_.create(seq); }
    void free(int32_t seq) { table_.free(seq); }
    void fork(int32_t src, int32_t dst, int32_t n) { table_.fork(src, dst, n); }
    int32_t n_past(int32_t seq = 0) const { return table_.n_past(seq); }
    void set_n_past(int32_t n, int32_t seq = 0) { table_.set_n_past(seq, n); }
    // Makes positions [begin, end) of seq writable by it alone (end <= n_ctx): maps their pages, copying a page
    // shared with another sequence on the device first (in stream order). Throws KvPoolExhausted when the pool
    // lacks the pages (nothing changed). reserve(n, seq) makes [n_past, n) writable.
    void make_writable(int32_t seq, int32_t begin, int32_t end);
    void reserve(int32_t n, int32_t seq = 0) { make_writable(seq, std::min(n_past(seq), n), n); }

    // One layer's buffers for the kernels, paged by sequence 0's table on the device as of the last
    // sync_pages() (the buffer stays where it is: a captured decode step reads the table there at replay).
    const cuda::KvLayer& layer(int32_t l) const { return layers_[static_cast<size_t>(l)]; }
    // Uploads sequence 0's page table when it changed since the last upload (stream ordered).
    void sync_pages();
    // The tokens of a multi-sequence batch for the kernels: span s's tokens are at positions span_pos0[s] ..
    // of its sequence, whose pages must be mapped (reserve). Uploaded in stream order to a buffer of this cache,
    // valid until the next call.
    cuda::KvTokenMap map_tokens(std::span<const SequenceSpan> spans, std::span<const int32_t> span_pos0);

    // Snapshots of sequence 0 (engine/kv_snapshot.h).
    KvSnapshot save(int32_t n) const;
    void load(const KvSnapshot& snapshot);
    KvSnapshot save_range(int32_t begin, int32_t end, int32_t seq = 0) const;
    void append(const KvSnapshot& range, int32_t seq = 0);

private:
    size_t row_bytes(bool value) const;
    uint8_t* row(size_t layer, int32_t head, bool value, int32_t pos, int32_t seq = 0) const;
    void copy_rows_out(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, uint8_t* bytes,
                       int32_t seq = 0) const;
    void copy_rows_in(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, const uint8_t* bytes,
                      int32_t seq = 0);

    KvSnapshotShape shape_;
    cudaStream_t stream_ = nullptr;
    KvPageTable table_;
    std::vector<uint64_t> k_page_bytes_, v_page_bytes_;   // per layer: one slot's K / V bytes
    std::vector<DeviceBuffer> k_, v_;    // per layer: the slots' pages
    std::vector<cuda::KvLayer> layers_;  // views of k_ / v_ through seq0_pages_
    DeviceBuffer seq0_pages_;            // sequence 0's page table on the device ...
    std::vector<int32_t> seq0_uploaded_; // ... as last uploaded
    DeviceScratch token_map_;            // map_tokens: positions, table offsets, the tables
    std::vector<int32_t> token_map_host_;
};

} // namespace TERN_CUDA_ABI
} // namespace tern
