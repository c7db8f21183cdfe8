#include "engine/cpu/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "base/error.h"
#include "engine/load_errors.h"

namespace tern {
void KvCache::init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim, int32_t head_dim_v,
                   int32_t n_ctx, int32_t n_slots) {
    const size_t n = n_kv_heads_per_layer.size();
    init(type, n_kv_heads_per_layer, std::vector<int32_t>(n, head_dim), std::vector<int32_t>(n, head_dim_v), n_ctx,
         n_slots);
}

void KvCache::init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, const std::vector<int32_t>& head_dims,
                   const std::vector<int32_t>& head_dims_v, int32_t n_ctx, int32_t n_slots) {
    const size_t n_layers = n_kv_heads_per_layer.size();
    if (head_dims.size() != n_layers || head_dims_v.size() != n_layers)
        throw std::invalid_argument("KvCache::init: one head size per layer expected");
    for (size_t l = 0; l < n_layers; ++l) require_kv_head_dims(type, head_dims[l], head_dims_v[l]);
    if (n_ctx <= 0) throw UsageError("context size must be positive, got " + std::to_string(n_ctx));
    type_ = type;
    head_dim_ = head_dims;
    head_dim_v_ = head_dims_v;
    k_row_bytes_.assign(n_layers, 0);
    v_row_bytes_.assign(n_layers, 0);
    for (size_t l = 0; l < n_layers; ++l) {
        k_row_bytes_[l] = kv_row_bytes(type, head_dims[l]);
        v_row_bytes_[l] = kv_row_bytes(type, head_dims_v[l]);
    }
    n_ctx_ = n_ctx;
    n_kv_heads_ = n_kv_heads_per_layer;
    if (n_slots <= 0) n_slots = static_cast<int32_t>(kv_pages_for(n_ctx));
    table_ = KvPageTable(n_slots);
    k_.clear();
    v_.clear();
    k_.resize(n_kv_heads_.size());
    v_.resize(n_kv_heads_.size());
    k_page_bytes_.assign(n_kv_heads_.size(), 0);
    v_page_bytes_.assign(n_kv_heads_.size(), 0);
    try {
        for (size_t l = 0; l < n_kv_heads_.size(); ++l) {
            const size_t rows = static_cast<size_t>(n_kv_heads_[l]) * static_cast<size_t>(kKvPagePositions);
            k_page_bytes_[l] = rows * k_row_bytes_[l];
            v_page_bytes_[l] = rows * v_row_bytes_[l];
            k_[l].allocate(static_cast<size_t>(n_slots) * k_page_bytes_[l]);
            v_[l].allocate(static_cast<size_t>(n_slots) * v_page_bytes_[l]);
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

void KvCache::make_writable(int32_t seq, int32_t begin, int32_t end) {
    if (end > n_ctx_)
        throw UsageError("KvCache: " + std::to_string(end) + " positions requested, a sequence holds at most " +
                         std::to_string(n_ctx_));
    for (const KvSlotCopy& c : table_.prepare_write(seq, begin, end))
        for (size_t l = 0; l < k_.size(); ++l) {
            std::memcpy(k_[l].data() + page_offset(l, c.to, false), k_[l].data() + page_offset(l, c.from, false),
                        k_page_bytes_[l]);
            std::memcpy(v_[l].data() + page_offset(l, c.to, true), v_[l].data() + page_offset(l, c.from, true),
                        v_page_bytes_[l]);
        }
}

void KvCache::reserve(int32_t n, int32_t seq) {
    make_writable(seq, std::min(table_.n_past(seq), n), n);
}

void KvCache::write(int32_t layer, int32_t pos, const float* k, const float* v, int32_t seq) {
    if (pos >= table_.mapped(seq)) make_writable(seq, pos, pos + 1);
    const size_t l = static_cast<size_t>(layer);
    const int32_t hd = head_dim_[l], hd_v = head_dim_v_[l];
    for (int32_t h = 0; h < n_kv_heads_[l]; ++h) {
        kv_store_row(type_, k + static_cast<size_t>(h) * hd, k_[l].data() + k_offset(seq, l, h, pos), hd);
        kv_store_row(type_, v + static_cast<size_t>(h) * hd_v, v_[l].data() + v_offset(seq, l, h, pos), hd_v);
    }
}

// Row `pos` of head h of a layer: its page's slot, the head's run inside the slot, the row inside the run.
size_t KvCache::row_offset(int32_t seq, size_t layer, int32_t head, int32_t pos, bool value) const {
    const KvPageSpot at = table_.locate(seq, pos);
    const size_t row = static_cast<size_t>(head) * kKvPagePositions + static_cast<size_t>(at.row);
    return page_offset(layer, at.slot, value) + row * (value ? v_row_bytes_ : k_row_bytes_)[layer];
}

const void* KvCache::k_row(int32_t layer, int32_t head, int32_t pos, int32_t seq) const {
    const auto l = static_cast<size_t>(layer);
    return k_[l].data() + k_offset(seq, l, head, pos);
}

const void* KvCache::v_row(int32_t layer, int32_t head, int32_t pos, int32_t seq) const {
    const auto l = static_cast<size_t>(layer);
    return v_[l].data() + v_offset(seq, l, head, pos);
}

KvPagesView KvCache::pages_view(int32_t layer, int32_t seq) const {
    const auto l = static_cast<size_t>(layer);
    KvPagesView view;
    view.k = k_[l].data();
    view.v = v_[l].data();
    view.pages = table_.pages(seq).data();
    view.k_page_stride = k_page_bytes_[l];
    view.v_page_stride = v_page_bytes_[l];
    view.k_head_stride = static_cast<size_t>(kKvPagePositions) * k_row_bytes_[l];
    view.v_head_stride = static_cast<size_t>(kKvPagePositions) * v_row_bytes_[l];
    return view;
}

KvSnapshotShape KvCache::shape() const {
    KvSnapshotShape s{type_, n_kv_heads_, head_dim_.empty() ? 0 : head_dim_.front(),
                      head_dim_v_.empty() ? 0 : head_dim_v_.front(), n_ctx_};
    // The header's head sizes: the largest (the global layers'); each layer's own when they differ.
    for (size_t l = 0; l < head_dim_.size(); ++l) {
        s.head_dim = std::max(s.head_dim, head_dim_[l]);
        s.head_dim_v = std::max(s.head_dim_v, head_dim_v_[l]);
    }
    for (size_t l = 0; l < head_dim_.size(); ++l)
        if (head_dim_[l] != s.head_dim || head_dim_v_[l] != s.head_dim_v) {
            s.head_dims = head_dim_;
            s.head_dims_v = head_dim_v_;
            break;
        }
    return s;
}

template <class Run>
void KvCache::for_each_run(int32_t seq, size_t layer, int32_t head, bool value, int32_t pos, int32_t n, Run run) const {
    for_each_page_run(pos, n, [&](int32_t p, int32_t rows) { run(row_offset(seq, layer, head, p, value), rows); });
}

// The snapshot format's row copies (engine/kv_snapshot.h) for this cache's host buffers: n rows from
// position pos, one memcpy per page they touch.
void KvCache::copy_rows_out(int32_t seq, size_t layer, int32_t head, bool value, int32_t pos, int32_t n,
                            uint8_t* bytes) const {
    const size_t row_bytes = (value ? v_row_bytes_ : k_row_bytes_)[layer];
    const uint8_t* base = value ? v_[layer].data() : k_[layer].data();
    for_each_run(seq, layer, head, value, pos, n, [&](size_t offset, int32_t rows) {
        std::memcpy(bytes, base + offset, static_cast<size_t>(rows) * row_bytes);
        bytes += static_cast<size_t>(rows) * row_bytes;
    });
}

void KvCache::copy_rows_in(int32_t seq, size_t layer, int32_t head, bool value, int32_t pos, int32_t n,
                           const uint8_t* bytes) {
    // A restore makes its positions writable as it fills them (after the snapshot was checked).
    if (pos + n > table_.mapped(seq) || (layer == 0 && head == 0 && !value)) make_writable(seq, pos, pos + n);
    const size_t row_bytes = (value ? v_row_bytes_ : k_row_bytes_)[layer];
    uint8_t* base = value ? v_[layer].data() : k_[layer].data();
    for_each_run(seq, layer, head, value, pos, n, [&](size_t offset, int32_t rows) {
        std::memcpy(base + offset, bytes, static_cast<size_t>(rows) * row_bytes);
        bytes += static_cast<size_t>(rows) * row_bytes;
    });
}

KvSnapshot KvCache::save(int32_t n, int32_t seq) const {
    return kv_snapshot_whole(shape(), table_.n_past(seq), n,
                             [this, seq](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                 copy_rows_out(seq, l, h, v, pos, k, b);
                             });
}

void KvCache::load(const KvSnapshot& s, int32_t seq) {
    const int32_t n = kv_restore_whole(shape(), s, [this, seq](size_t l, int32_t h, bool v, int32_t pos, int32_t k,
                                                               const uint8_t* b) {
        copy_rows_in(seq, l, h, v, pos, k, b);
    });
    table_.set_n_past(seq, n);
}

KvSnapshot KvCache::save_range(int32_t begin, int32_t end, int32_t seq) const {
    return kv_snapshot_range(shape(), table_.n_past(seq), begin, end,
                             [this, seq](size_t l, int32_t h, bool v, int32_t pos, int32_t k, uint8_t* b) {
                                 copy_rows_out(seq, l, h, v, pos, k, b);
                             });
}

void KvCache::append(const KvSnapshot& s, int32_t seq) {
    const int32_t n = kv_restore_range(shape(), table_.n_past(seq), s,
                                       [this, seq](size_t l, int32_t h, bool v, int32_t pos, int32_t k,
                                                   const uint8_t* b) { copy_rows_in(seq, l, h, v, pos, k, b); });
    table_.set_n_past(seq, table_.n_past(seq) + n);
}

} // namespace tern
