#include "engine/cuda/kv_cache_cuda.h"

#include <algorithm>
#include <string>

#include "base/error.h"
#include "engine/load_errors.h"

namespace tern {
inline namespace TERN_CUDA_ABI {

void CudaKvCache::init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim,
                       int32_t head_dim_v, int32_t n_ctx, int32_t n_slots, cudaStream_t stream) {
    require_kv_head_dims(type, head_dim, head_dim_v);
    if (n_ctx <= 0) throw UsageError("context size must be positive, got " + std::to_string(n_ctx));
    if (n_slots <= 0) n_slots = static_cast<int32_t>(kv_pages_for(n_ctx));
    k_.clear();
    v_.clear();
    layers_.clear();
    k_page_bytes_.clear();
    v_page_bytes_.clear();
    shape_ = {type, n_kv_heads_per_layer, head_dim, head_dim_v, n_ctx};
    stream_ = stream;
    table_ = KvPageTable(n_slots);
    seq0_uploaded_.clear();
    try {
        seq0_pages_ = DeviceBuffer(static_cast<size_t>(kv_pages_for(n_ctx)) * sizeof(int32_t), "the KV page table");
        for (int32_t heads : n_kv_heads_per_layer) {
            const uint64_t rows = static_cast<uint64_t>(heads) * kKvPagePositions;
            k_page_bytes_.push_back(rows * kv_row_bytes(type, head_dim));
            v_page_bytes_.push_back(rows * kv_row_bytes(type, head_dim_v));
            k_.emplace_back(k_page_bytes_.back() * static_cast<uint64_t>(n_slots), "the KV cache");
            v_.emplace_back(v_page_bytes_.back() * static_cast<uint64_t>(n_slots), "the KV cache");
            cuda::KvLayer view;
            view.type = type;
            view.k = k_.back().get();
            view.v = v_.back().get();
            view.n_kv_heads = heads;
            view.head_dim = head_dim;
            view.head_dim_v = head_dim_v;
            view.n_ctx = n_ctx;
            view.pages = seq0_pages_.as<int32_t>();
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

void CudaKvCache::make_writable(int32_t seq, int32_t begin, int32_t end) {
    if (end > shape_.n_ctx)
        throw UsageError("KV cache: " + std::to_string(end) + " positions requested, a sequence holds at most " +
                         std::to_string(shape_.n_ctx));
    for (const KvSlotCopy& c : table_.prepare_write(seq, begin, end))
        for (size_t l = 0; l < k_.size(); ++l)
            for (auto [buffer, page] : {std::pair{&k_[l], k_page_bytes_[l]}, std::pair{&v_[l], v_page_bytes_[l]}})
                cuda_call(cudaMemcpyAsync(buffer->bytes() + static_cast<uint64_t>(c.to) * page,
                                          buffer->bytes() + static_cast<uint64_t>(c.from) * page, page,
                                          cudaMemcpyDeviceToDevice, stream_),
                          "copying a shared KV page");
}

void CudaKvCache::sync_pages() {
    const std::vector<int32_t>& pages = table_.pages(0);
    if (pages == seq0_uploaded_) return;
    seq0_uploaded_ = pages;
    if (pages.empty()) return;
    // From pageable memory: the call returns once the bytes are staged, so seq0_uploaded_ may change after it.
    cuda_call(cudaMemcpyAsync(seq0_pages_.get(), seq0_uploaded_.data(), pages.size() * sizeof(int32_t),
                              cudaMemcpyHostToDevice, stream_),
              "uploading the KV page table");
}

cuda::KvTokenMap CudaKvCache::map_tokens(std::span<const SequenceSpan> spans, std::span<const int32_t> span_pos0) {
    // One buffer: per token its position, per token the offset of its sequence's table, then the tables.
    int64_t n = 0;
    for (const SequenceSpan& s : spans) n += s.n_tokens;
    std::vector<int32_t>& h = token_map_host_;
    h.assign(static_cast<size_t>(2 * n), 0);
    size_t token = 0;
    for (size_t s = 0; s < spans.size(); ++s) {
        const auto offset = static_cast<int32_t>(h.size() - static_cast<size_t>(2 * n));
        const std::vector<int32_t>& pages = table_.pages(spans[s].seq);
        h.insert(h.end(), pages.begin(), pages.end());
        for (int32_t i = 0; i < spans[s].n_tokens; ++i, ++token) {
            h[token] = span_pos0[s] + i;
            h[static_cast<size_t>(n) + token] = offset;
        }
    }
    auto* device = static_cast<int32_t*>(token_map_.reserve(h.size() * sizeof(int32_t), "the batch's KV map"));
    cuda_call(cudaMemcpyAsync(device, h.data(), h.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "uploading the batch's KV map");
    return {device, device + n, device + 2 * n};
}

size_t CudaKvCache::row_bytes(bool value) const {
    return kv_row_bytes(shape_.type, value ? shape_.head_dim_v : shape_.head_dim);
}

uint8_t* CudaKvCache::row(size_t layer, int32_t head, bool value, int32_t pos, int32_t seq) const {
    const KvPageSpot at = table_.locate(seq, pos);
    const auto slot = static_cast<uint64_t>(at.slot);
    const uint64_t r = static_cast<uint64_t>(head) * kKvPagePositions + static_cast<uint64_t>(at.row);
    const uint64_t page = value ? v_page_bytes_[layer] : k_page_bytes_[layer];
    return (value ? v_[layer] : k_[layer]).bytes() + slot * page + r * row_bytes(value);
}

// A head's rows are contiguous within a page: one copy per page the rows touch. The copies are synchronous
// with respect to the stream's earlier work (the forward that wrote the rows).
void CudaKvCache::copy_rows_out(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, uint8_t* bytes,
                                int32_t seq) const {
    for_each_page_run(pos, n, [&](int32_t p, int32_t run) {
        const size_t size = static_cast<size_t>(run) * row_bytes(value);
        cuda_call(cudaMemcpyAsync(bytes, row(layer, head, value, p, seq), size, cudaMemcpyDeviceToHost, stream_),
                  "copying KV rows to the host");
        bytes += size;
    });
}

void CudaKvCache::copy_rows_in(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, const uint8_t* bytes,
                               int32_t seq) {
    // A restore makes its positions writable as it fills them (after the snapshot was checked).
    if (pos + n > table_.mapped(seq) || (layer == 0 && head == 0 && !value)) make_writable(seq, pos, pos + n);
    for_each_page_run(pos, n, [&](int32_t p, int32_t run) {
        const size_t size = static_cast<size_t>(run) * row_bytes(value);
        cuda_call(cudaMemcpyAsync(row(layer, head, value, p, seq), bytes, size, cudaMemcpyHostToDevice, stream_),
                  "copying KV rows to the GPU");
        bytes += size;
    });
}

KvSnapshot CudaKvCache::save(int32_t n) const {
    KvSnapshot s = kv_snapshot_whole(shape_, n_past(), n,
                                     [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                         copy_rows_out(l, h, v, pos, k, b);
                                     });
    cuda_call(cudaStreamSynchronize(stream_), "saving the KV cache");
    return s;
}

void CudaKvCache::load(const KvSnapshot& s) {
    const int32_t n = kv_restore_whole(shape_, s, [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k,
                                                         const uint8_t* b) { copy_rows_in(l, h, v, pos, k, b); });
    table_.set_n_past(0, n);
    cuda_call(cudaStreamSynchronize(stream_), "loading the KV cache");   // the snapshot's bytes may go now
}

KvSnapshot CudaKvCache::save_range(int32_t begin, int32_t end, int32_t seq) const {
    KvSnapshot s = kv_snapshot_range(shape_, n_past(seq), begin, end,
                                     [this, seq](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                         copy_rows_out(l, h, v, pos, k, b, seq);
                                     });
    cuda_call(cudaStreamSynchronize(stream_), "saving KV rows");
    return s;
}

void CudaKvCache::append(const KvSnapshot& s, int32_t seq) {
    const int32_t n = kv_restore_range(shape_, n_past(seq), s,
                                       [this, seq](size_t l, int32_t h, bool v, int32_t pos, int32_t k,
                                                   const uint8_t* b) { copy_rows_in(l, h, v, pos, k, b, seq); });
    table_.set_n_past(seq, n_past(seq) + n);
    cuda_call(cudaStreamSynchronize(stream_), "restoring KV rows");
}

} // namespace TERN_CUDA_ABI
} // namespace tern
