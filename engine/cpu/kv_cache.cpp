#include "engine/cpu/kv_cache.h"

#include <cstring>
#include <string>

#include "base/error.h"
#include "engine/load_errors.h"

namespace tern {
void KvCache::init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim, int32_t head_dim_v,
                   int32_t n_ctx) {
    const int64_t block = kv_block_elems(type);
    if (head_dim % block != 0 || head_dim_v % block != 0)
        throw KvHeadDimsUnfit(type, block, head_dim, head_dim_v);
    if (n_ctx <= 0) throw UsageError("context size must be positive, got " + std::to_string(n_ctx));
    type_ = type;
    k_row_bytes_ = kv_row_bytes(type, head_dim);
    v_row_bytes_ = kv_row_bytes(type, head_dim_v);
    head_dim_ = head_dim;
    head_dim_v_ = head_dim_v;
    n_ctx_ = n_ctx;
    n_past_ = 0;
    n_kv_heads_ = n_kv_heads_per_layer;
    k_.clear();
    v_.clear();
    k_.resize(n_kv_heads_.size());
    v_.resize(n_kv_heads_.size());
    try {
        for (size_t l = 0; l < n_kv_heads_.size(); ++l) {
            const size_t rows = static_cast<size_t>(n_kv_heads_[l]) * static_cast<size_t>(n_ctx);
            k_[l].allocate(rows * k_row_bytes_);
            v_[l].allocate(rows * v_row_bytes_);
        }
    } catch (const std::bad_alloc&) {
        throw KvAllocationFailed(n_ctx);
    }
}

size_t KvCache::total_bytes() const {
    size_t n = 0;
    for (size_t l = 0; l < k_.size(); ++l)
        n += k_[l].size() + v_[l].size();
    return n;
}

void KvCache::write(int32_t layer, int32_t pos, const float* k, const float* v) {
    const size_t l = static_cast<size_t>(layer);
    for (int32_t h = 0; h < n_kv_heads_[l]; ++h) {
        kv_store_row(type_, k + static_cast<size_t>(h) * head_dim_, k_[l].data() + k_offset(h, pos), head_dim_);
        kv_store_row(type_, v + static_cast<size_t>(h) * head_dim_v_, v_[l].data() + v_offset(h, pos), head_dim_v_);
    }
}

const void* KvCache::k_head(int32_t layer, int32_t head) const {
    return k_row(layer, head, 0);
}
const void* KvCache::v_head(int32_t layer, int32_t head) const {
    return v_row(layer, head, 0);
}

size_t KvCache::k_offset(int32_t head, int32_t pos) const {
    const size_t row = static_cast<size_t>(head) * static_cast<size_t>(n_ctx_) + static_cast<size_t>(pos);
    return row * k_row_bytes_;
}

size_t KvCache::v_offset(int32_t head, int32_t pos) const {
    const size_t row = static_cast<size_t>(head) * static_cast<size_t>(n_ctx_) + static_cast<size_t>(pos);
    return row * v_row_bytes_;
}

const void* KvCache::k_row(int32_t layer, int32_t head, int32_t pos) const {
    return k_[static_cast<size_t>(layer)].data() + k_offset(head, pos);
}

const void* KvCache::v_row(int32_t layer, int32_t head, int32_t pos) const {
    return v_[static_cast<size_t>(layer)].data() + v_offset(head, pos);
}

KvSnapshotShape KvCache::shape() const {
    return {type_, n_kv_heads_, head_dim_, head_dim_v_, n_ctx_};
}

// The snapshot format's row copies (engine/kv_snapshot.h) for this cache's host buffers.
void KvCache::copy_rows_out(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, uint8_t* bytes) const {
    if (value)
        std::memcpy(bytes, v_[layer].data() + v_offset(head, pos), static_cast<size_t>(n) * v_row_bytes_);
    else
        std::memcpy(bytes, k_[layer].data() + k_offset(head, pos), static_cast<size_t>(n) * k_row_bytes_);
}

void KvCache::copy_rows_in(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, const uint8_t* bytes) {
    if (value)
        std::memcpy(v_[layer].data() + v_offset(head, pos), bytes, static_cast<size_t>(n) * v_row_bytes_);
    else
        std::memcpy(k_[layer].data() + k_offset(head, pos), bytes, static_cast<size_t>(n) * k_row_bytes_);
}

KvSnapshot KvCache::save(int32_t n) const {
    return kv_snapshot_whole(shape(), n_past_, n,
                                     [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                         copy_rows_out(l, h, v, pos, k, b);
                                     });
}

void KvCache::load(const KvSnapshot& s) {
    n_past_ = kv_restore_whole(shape(), s, [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, const uint8_t* b) {
        copy_rows_in(l, h, v, pos, k, b);
    });
}

KvSnapshot KvCache::save_range(int32_t begin, int32_t end) const {
    return kv_snapshot_range(shape(), n_past_, begin, end,
                             [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                 copy_rows_out(l, h, v, pos, k, b);
                             });
}

void KvCache::append(const KvSnapshot& s) {
    n_past_ += kv_restore_range(shape(), n_past_, s,
                                [this](size_t l, int32_t h, bool v, int32_t pos, int32_t k, const uint8_t* b) {
                                    copy_rows_in(l, h, v, pos, k, b);
                                });
}

} // namespace tern
