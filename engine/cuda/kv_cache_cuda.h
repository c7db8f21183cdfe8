#pragma once
// The KV cache in GPU memory, in the CPU cache's layout (engine/cpu/kv_cache.h): per layer K (n_kv_heads,
// n_ctx) rows and V likewise, in any KvType. Snapshots use the shared byte format (engine/kv_snapshot.h),
// so a prefix-cache file or a /save taken on the CPU restores here and the other way round.
#include <cstdint>
#include <vector>

#include "engine/backend.h"
#include "engine/cuda/device_buffer.h"
#include "engine/kv_snapshot.h"
#include "kernels/cuda/attention.h"

namespace tern {
inline namespace TERN_CUDA_ABI {

class CudaKvCache {
public:
    // Throws KvHeadDimsUnfit for head dims the block formats cannot hold, KvAllocationFailed when the GPU
    // memory is not there (engine/load_errors.h).
    void init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim, int32_t head_dim_v,
              int32_t n_ctx, cudaStream_t stream);

    KvType format() const { return shape_.type; }
    int32_t n_ctx() const { return shape_.n_ctx; }
    int32_t n_past() const { return n_past_; }
    void set_n_past(int32_t n) { n_past_ = n; }
    uint64_t total_bytes() const;
    // One layer's buffers for the kernels (kernels/cuda/attention.h).
    const cuda::KvLayer& layer(int32_t l) const { return layers_[static_cast<size_t>(l)]; }

    KvSnapshot save(int32_t n) const;
    void load(const KvSnapshot& snapshot);
    KvSnapshot save_range(int32_t begin, int32_t end) const;
    void append(const KvSnapshot& range);

private:
    size_t row_bytes(bool value) const;
    uint8_t* rows(size_t layer, int32_t head, bool value, int32_t pos) const;
    void copy_rows_out(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, uint8_t* bytes) const;
    void copy_rows_in(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, const uint8_t* bytes);

    KvSnapshotShape shape_;
    int32_t n_past_ = 0;
    cudaStream_t stream_ = nullptr;
    std::vector<DeviceBuffer> k_, v_;    // per layer
    std::vector<cuda::KvLayer> layers_;  // views of k_ / v_
};

} // namespace TERN_CUDA_ABI
} // namespace tern
