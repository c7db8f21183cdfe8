#include "engine/cuda/kv_cache_cuda.h"

#include <string>

#include "base/error.h"
#include "engine/load_errors.h"

namespace tern {
inline namespace TERN_CUDA_ABI {

void CudaKvCache::init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim,
                       int32_t head_dim_v, int32_t n_ctx, cudaStream_t stream) {
    const int64_t block = kv_block_elems(type);
    if (head_dim % block != 0 || head_dim_v % block != 0) throw KvHeadDimsUnfit(type, block, head_dim, head_dim_v);
    if (n_ctx <= 0) throw UsageError("context size must be positive, got " + std::to_string(n_ctx));
    k_.clear();
    v_.clear();
    layers_.clear();
    shape_ = {type, n_kv_heads_per_layer, head_dim, head_dim_v, n_ctx};
    n_past_ = 0;
    stream_ = stream;
    try {
        for (int32_t heads : n_kv_heads_per_layer) {
            const size_t rows = static_cast<size_t>(heads) * static_cast<size_t>(n_ctx);
            k_.emplace_back(rows * kv_row_bytes(type, head_dim), "the KV cache");
            v_.emplace_back(rows * kv_row_bytes(type, head_dim_v), "the KV cache");
            cuda::KvLayer view;
            view.type = type;
            view.k = k_.back().get();
            view.v = v_.back().get();
            view.n_kv_heads = heads;
            view.head_dim = head_dim;
            view.head_dim_v = head_dim_v;
            view.n_ctx = n_ctx;
            layers_.push_back(view);
        }
    } catch (const RuntimeFailure&) {
        k_.clear();
        v_.clear();
        layers_.clear();
        throw KvAllocationFailed(n_ctx);
    }
}

uint64_t CudaKvCache::total_bytes() const {
    uint64_t n = 0;
    for (size_t l = 0; l < k_.size(); ++l)
        n += k_[l].size() + v_[l].size();
    return n;
}

size_t CudaKvCache::row_bytes(bool value) const {
    return kv_row_bytes(shape_.type, value ? shape_.head_dim_v : shape_.head_dim);
}

uint8_t* CudaKvCache::rows(size_t layer, int32_t head, bool value, int32_t pos) const {
    const size_t row = static_cast<size_t>(head) * static_cast<size_t>(shape_.n_ctx) + static_cast<size_t>(pos);
    return (value ? v_[layer] : k_[layer]).bytes() + row * row_bytes(value);
}

// One head's run of rows is contiguous on both sides: one copy each. The copies are synchronous with
// respect to the stream's earlier work (the forward that wrote the rows).
void CudaKvCache::copy_rows_out(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, uint8_t* bytes) const {
    cuda_call(cudaMemcpyAsync(bytes, rows(layer, head, value, pos), static_cast<size_t>(n) * row_bytes(value),
                              cudaMemcpyDeviceToHost, stream_),
              "copying KV rows to the host");
}

void CudaKvCache::copy_rows_in(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, const uint8_t* bytes) {
    cuda_call(cudaMemcpyAsync(rows(layer, head, value, pos), bytes, static_cast<size_t>(n) * row_bytes(value),
                              cudaMemcpyHostToDevice, stream_),
              "copying KV rows to the GPU");
}

KvSnapshot CudaKvCache::save(int32_t n) const {
    KvSnapshot s = kv_snapshot_whole(shape_, n_past_, n,
                                     [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                         copy_rows_out(l, h, v, pos, k, b);
                                     });
    cuda_call(cudaStreamSynchronize(stream_), "saving the KV cache");
    return s;
}

void CudaKvCache::load(const KvSnapshot& s) {
    n_past_ = kv_restore_whole(shape_, s, [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, const uint8_t* b) {
        copy_rows_in(l, h, v, pos, k, b);
    });
    cuda_call(cudaStreamSynchronize(stream_), "loading the KV cache");   // the snapshot's bytes may go now
}

KvSnapshot CudaKvCache::save_range(int32_t begin, int32_t end) const {
    KvSnapshot s = kv_snapshot_range(shape_, n_past_, begin, end,
                                     [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                         copy_rows_out(l, h, v, pos, k, b);
                                     });
    cuda_call(cudaStreamSynchronize(stream_), "saving KV rows");
    return s;
}

void CudaKvCache::append(const KvSnapshot& s) {
    n_past_ += kv_restore_range(shape_, n_past_, s,
                                [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, const uint8_t* b) {
                                    copy_rows_in(l, h, v, pos, k, b);
                                });
    cuda_call(cudaStreamSynchronize(stream_), "restoring KV rows");
}

} // namespace TERN_CUDA_ABI
} // namespace tern
