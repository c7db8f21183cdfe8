#include "engine/cpu/kv_cache.h"

#include <cstring>
#include <string>

#include "base/error.h"
#include "engine/load_errors.h"

namespace tern {
namespace {

// Snapshot header: magic, then the shape it was taken with, all int32. "TKV2" snapshots hold each head's
// first n rows in the cache's stored row format (kv_row_bytes), which for f32/f16/bf16 is byte for byte
// what "TKV1" (before the block formats existed) held, so both load.
constexpr int32_t kSnapshotMagicV1 = 0x31564B54; // "TKV1" little-endian
constexpr int32_t kSnapshotMagic = 0x32564B54;   // "TKV2"
constexpr int kHeaderInts = 7;                   // magic, kv_type, n_layers, head_dim, head_dim_v, n_ctx, n
// Range snapshots (save_range/append) keep the same seven ints with n_ctx replaced by the first
// position: a block restores into a cache of any context size.
constexpr int32_t kRangeMagic = 0x31524B54;      // "TKR1"

} // namespace

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

KvSnapshot KvCache::save(int32_t n) const {
    if (n < 0 || n > n_past_)
        throw UsageError("kv_save: " + std::to_string(n) + " positions requested but the cache holds " +
                         std::to_string(n_past_));
    return pack(kSnapshotMagic, n_ctx_, 0, n);
}

// A snapshot of positions [begin, begin + n): the header (its sixth field is the context size for
// a whole snapshot, the first position for a range), then each layer's heads' K rows and V rows.
KvSnapshot KvCache::pack(int32_t magic, int32_t field5, int32_t begin, int32_t n) const {
    KvSnapshot s;
    s.n_past = n;
    s.kv_type = type_;
    const int32_t header[kHeaderInts] = {magic,
                                         static_cast<int32_t>(type_),
                                         static_cast<int32_t>(n_kv_heads_.size()),
                                         head_dim_,
                                         head_dim_v_,
                                         field5,
                                         n};
    const size_t k_bytes = static_cast<size_t>(n) * k_row_bytes_;
    const size_t v_bytes = static_cast<size_t>(n) * v_row_bytes_;
    size_t total = sizeof header;
    for (int32_t h : n_kv_heads_)
        total += static_cast<size_t>(h) * (k_bytes + v_bytes);
    s.bytes.resize(total);
    uint8_t* out = s.bytes.data();
    std::memcpy(out, header, sizeof header);
    out += sizeof header;
    for (size_t l = 0; l < n_kv_heads_.size(); ++l) {
        for (int32_t h = 0; h < n_kv_heads_[l]; ++h) {
            std::memcpy(out, k_[l].data() + k_offset(h, begin), k_bytes);
            out += k_bytes;
            std::memcpy(out, v_[l].data() + v_offset(h, begin), v_bytes);
            out += v_bytes;
        }
    }
    return s;
}

void KvCache::load(const KvSnapshot& s) {
    int32_t header[kHeaderInts] = {};
    if (s.bytes.size() < sizeof header) throw UsageError("kv_load: the snapshot is too short to be a KV snapshot");
    std::memcpy(header, s.bytes.data(), sizeof header);
    const int32_t n = header[6];
    const bool v1 = header[0] == kSnapshotMagicV1 &&
                    (type_ == KvType::f32 || type_ == KvType::f16 || type_ == KvType::bf16);
    if ((header[0] != kSnapshotMagic && !v1) || header[1] != static_cast<int32_t>(type_) ||
        header[2] != static_cast<int32_t>(n_kv_heads_.size()) || header[3] != head_dim_ || header[4] != head_dim_v_)
        throw UsageError("kv_load: the snapshot was taken from a different model or KV type (" +
                         std::string(kv_type_name(s.kv_type)) + ", cache is " + std::string(kv_type_name(type_)) + ")");
    if (n < 0 || n > n_ctx_)
        throw UsageError("kv_load: the snapshot holds " + std::to_string(n) + " positions but the context is " +
                         std::to_string(n_ctx_));
    unpack(s, "kv_load: the snapshot", 0, n);
}

KvSnapshot KvCache::save_range(int32_t begin, int32_t end) const {
    if (begin < 0 || end < begin || end > n_past_)
        throw UsageError("kv_save_range: positions " + std::to_string(begin) + ".." + std::to_string(end) +
                         " requested but the cache holds " + std::to_string(n_past_));
    return pack(kRangeMagic, begin, begin, end - begin);
}

void KvCache::append(const KvSnapshot& s) {
    int32_t header[kHeaderInts] = {};
    if (s.bytes.size() < sizeof header) throw UsageError("kv_append: the snapshot is too short to be a KV range");
    std::memcpy(header, s.bytes.data(), sizeof header);
    if (header[0] != kRangeMagic || header[1] != static_cast<int32_t>(type_) ||
        header[2] != static_cast<int32_t>(n_kv_heads_.size()) || header[3] != head_dim_ || header[4] != head_dim_v_)
        throw UsageError("kv_append: the range was taken from a different model or KV type (cache is " +
                         std::string(kv_type_name(type_)) + ")");
    const int32_t begin = header[5], n = header[6];
    if (begin != n_past_)
        throw UsageError("kv_append: the range starts at position " + std::to_string(begin) + " but the cache holds " +
                         std::to_string(n_past_));
    if (n < 0 || n > n_ctx_ - n_past_)
        throw UsageError("kv_append: the range holds " + std::to_string(n) + " positions but only " +
                         std::to_string(n_ctx_ - n_past_) + " are free");
    unpack(s, "kv_append: the range", begin, n);
}

// The rows of a pack()ed snapshot or range (header already checked) into positions [begin, begin + n);
// the cache then holds begin + n positions. `what` starts the error for a wrong size.
void KvCache::unpack(const KvSnapshot& s, const char* what, int32_t begin, int32_t n) {
    const size_t k_bytes = static_cast<size_t>(n) * k_row_bytes_;
    const size_t v_bytes = static_cast<size_t>(n) * v_row_bytes_;
    size_t total = kHeaderInts * sizeof(int32_t);
    for (int32_t h : n_kv_heads_)
        total += static_cast<size_t>(h) * (k_bytes + v_bytes);
    if (s.bytes.size() != total)
        throw UsageError(std::string(what) + " has " + std::to_string(s.bytes.size()) + " bytes but " +
                         std::to_string(total) + " were expected");
    const uint8_t* in = s.bytes.data() + kHeaderInts * sizeof(int32_t);
    for (size_t l = 0; l < n_kv_heads_.size(); ++l) {
        for (int32_t h = 0; h < n_kv_heads_[l]; ++h) {
            std::memcpy(k_[l].data() + k_offset(h, begin), in, k_bytes);
            in += k_bytes;
            std::memcpy(v_[l].data() + v_offset(h, begin), in, v_bytes);
            in += v_bytes;
        }
    }
    n_past_ = begin + n;
}

} // namespace tern
