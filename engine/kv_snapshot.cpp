#include "engine/kv_snapshot.h"

#include <cstring>
#include <string>

#include "base/error.h"

namespace tern {
namespace {

// "TKV2" snapshots hold each head's first n rows in the cache's stored row format (kv_row_bytes), which
// for f32/f16/bf16 is byte for byte what "TKV1" (before the block formats existed) held, so both load.
constexpr int32_t kSnapshotMagicV1 = 0x31564B54; // "TKV1" little-endian
constexpr int32_t kSnapshotMagic = 0x32564B54;   // "TKV2"
constexpr int kHeaderInts = 7;                   // magic, kv_type, n_layers, head_dim, head_dim_v, n_ctx, n
// Range snapshots keep the same seven ints with n_ctx replaced by the first position: a block restores
// into a cache of any context size.
constexpr int32_t kRangeMagic = 0x31524B54;      // "TKR1"

size_t k_rows_bytes(const KvSnapshotShape& s, int32_t n, size_t layer = 0) {
    return static_cast<size_t>(n) * kv_row_bytes(s.type, s.head_dims.empty() ? s.head_dim : s.head_dims[layer]);
}
size_t v_rows_bytes(const KvSnapshotShape& s, int32_t n, size_t layer = 0) {
    return static_cast<size_t>(n) * kv_row_bytes(s.type, s.head_dims_v.empty() ? s.head_dim_v : s.head_dims_v[layer]);
}

KvSnapshot pack(const KvSnapshotShape& s, int32_t magic, int32_t field5, int32_t begin, int32_t n,
                const KvRowsOut& out) {
    KvSnapshot snap;
    snap.n_past = n;
    snap.kv_type = s.type;
    const int32_t header[kHeaderInts] = {magic,      static_cast<int32_t>(s.type), static_cast<int32_t>(s.n_kv_heads.size()),
                                         s.head_dim, s.head_dim_v,                 field5,
                                         n};
    size_t total = sizeof header;
    for (size_t l = 0; l < s.n_kv_heads.size(); ++l)
        total += static_cast<size_t>(s.n_kv_heads[l]) * (k_rows_bytes(s, n, l) + v_rows_bytes(s, n, l));
    snap.bytes.resize(total);
    uint8_t* dst = snap.bytes.data();
    std::memcpy(dst, header, sizeof header);
    dst += sizeof header;
    for (size_t l = 0; l < s.n_kv_heads.size(); ++l) {
        const size_t k_bytes = k_rows_bytes(s, n, l), v_bytes = v_rows_bytes(s, n, l);
        for (int32_t h = 0; h < s.n_kv_heads[l]; ++h) {
            out(l, h, false, begin, n, dst);
            dst += k_bytes;
            out(l, h, true, begin, n, dst);
            dst += v_bytes;
        }
    }
    return snap;
}

// The rows of a pack()ed snapshot (header already checked) into positions [begin, begin + n). `what`
// starts the error for a wrong size, which is checked before anything is copied.
void unpack(const KvSnapshotShape& s, const KvSnapshot& snap, const char* what, int32_t begin, int32_t n,
            const KvRowsIn& in) {
    size_t total = kHeaderInts * sizeof(int32_t);
    for (size_t l = 0; l < s.n_kv_heads.size(); ++l)
        total += static_cast<size_t>(s.n_kv_heads[l]) * (k_rows_bytes(s, n, l) + v_rows_bytes(s, n, l));
    if (snap.bytes.size() != total)
        throw UsageError(std::string(what) + " has " + std::to_string(snap.bytes.size()) + " bytes but " +
                         std::to_string(total) + " were expected");
    const uint8_t* src = snap.bytes.data() + kHeaderInts * sizeof(int32_t);
    for (size_t l = 0; l < s.n_kv_heads.size(); ++l) {
        const size_t k_bytes = k_rows_bytes(s, n, l), v_bytes = v_rows_bytes(s, n, l);
        for (int32_t h = 0; h < s.n_kv_heads[l]; ++h) {
            in(l, h, false, begin, n, src);
            src += k_bytes;
            in(l, h, true, begin, n, src);
            src += v_bytes;
        }
    }
}

bool same_shape(const KvSnapshotShape& s, const int32_t* header) {
    return header[1] == static_cast<int32_t>(s.type) && header[2] == static_cast<int32_t>(s.n_kv_heads.size()) &&
           header[3] == s.head_dim && header[4] == s.head_dim_v;
}

} // namespace

KvSnapshot kv_snapshot_whole(const KvSnapshotShape& shape, int32_t n_past, int32_t n, const KvRowsOut& out) {
    if (n < 0 || n > n_past)
        throw UsageError("kv_save: " + std::to_string(n) + " positions requested but the cache holds " +
                         std::to_string(n_past));
    return pack(shape, kSnapshotMagic, shape.n_ctx, 0, n, out);
}

KvSnapshot kv_snapshot_range(const KvSnapshotShape& shape, int32_t n_past, int32_t begin, int32_t end,
                             const KvRowsOut& out) {
    if (begin < 0 || end < begin || end > n_past)
        throw UsageError("kv_save_range: positions " + std::to_string(begin) + ".." + std::to_string(end) +
                         " requested but the cache holds " + std::to_string(n_past));
    return pack(shape, kRangeMagic, begin, begin, end - begin, out);
}

int32_t kv_restore_whole(const KvSnapshotShape& shape, const KvSnapshot& s, const KvRowsIn& in) {
    int32_t header[kHeaderInts] = {};
    if (s.bytes.size() < sizeof header) throw UsageError("kv_load: the snapshot is too short to be a KV snapshot");
    std::memcpy(header, s.bytes.data(), sizeof header);
    const int32_t n = header[6];
    const KvType t = shape.type;
    const bool v1 = header[0] == kSnapshotMagicV1 && (t == KvType::f32 || t == KvType::f16 || t == KvType::bf16);
    if ((header[0] != kSnapshotMagic && !v1) || !same_shape(shape, header))
        throw UsageError("kv_load: the snapshot was taken from a different model or KV type (" +
                         std::string(kv_type_name(s.kv_type)) + ", cache is " + std::string(kv_type_name(t)) + ")");
    if (n < 0 || n > shape.n_ctx)
        throw UsageError("kv_load: the snapshot holds " + std::to_string(n) + " positions but the context is " +
                         std::to_string(shape.n_ctx));
    unpack(shape, s, "kv_load: the snapshot", 0, n, in);
    return n;
}

int32_t kv_restore_range(const KvSnapshotShape& shape, int32_t n_past, const KvSnapshot& s, const KvRowsIn& in) {
    int32_t header[kHeaderInts] = {};
    if (s.bytes.size() < sizeof header) throw UsageError("kv_append: the snapshot is too short to be a KV range");
    std::memcpy(header, s.bytes.data(), sizeof header);
    if (header[0] != kRangeMagic || !same_shape(shape, header))
        throw UsageError("kv_append: the range was taken from a different model or KV type (cache is " +
                         std::string(kv_type_name(shape.type)) + ")");
    const int32_t begin = header[5], n = header[6];
    if (begin != n_past)
        throw UsageError("kv_append: the range starts at position " + std::to_string(begin) + " but the cache holds " +
                         std::to_string(n_past));
    if (n < 0 || n > shape.n_ctx - n_past)
        throw UsageError("kv_append: the range holds " + std::to_string(n) + " positions but only " +
                         std::to_string(shape.n_ctx - n_past) + " are free");
    unpack(shape, s, "kv_append: the range", begin, n, in);
    return n;
}

int32_t kv_snapshot_positions(const KvSnapshot& snapshot) {
    int32_t header[kHeaderInts] = {};
    if (snapshot.bytes.size() < sizeof header) return -1;
    std::memcpy(header, snapshot.bytes.data(), sizeof header);
    return header[6];
}

namespace {

uint16_t u16_at(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
uint32_t u32_at(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
// All exponent bits set: infinity or NaN.
bool f32_bits_finite(uint32_t u) { return (u & 0x7f800000u) != 0x7f800000u; }
bool f16_bits_finite(uint16_t h) { return (h & 0x7c00u) != 0x7c00u; }
bool bf16_bits_finite(uint16_t h) { return (h & 0x7f80u) != 0x7f80u; }
bool e4m3_finite(uint8_t q) { return (q & 0x7fu) != 0x7fu; }   // e4m3 has no infinity; S.1111.111 is NaN

} // namespace

bool kv_snapshot_finite(const KvSnapshot& snapshot) {
    if (snapshot.bytes.size() < kHeaderInts * sizeof(int32_t)) return true;   // nothing stored
    const uint8_t* p = snapshot.bytes.data() + kHeaderInts * sizeof(int32_t);
    const size_t n = snapshot.bytes.size() - kHeaderInts * sizeof(int32_t);
    const KvFormatInfo& f = kv_format_info(snapshot.kv_type);
    const auto bytes = static_cast<size_t>(f.block_bytes);
    bool ok = true;   // accumulated without branching out early: the loops vectorise
    switch (snapshot.kv_type) {
    case KvType::f32:
        for (size_t i = 0; i + 4 <= n; i += 4) ok &= f32_bits_finite(u32_at(p + i));
        break;
    case KvType::f16:
        for (size_t i = 0; i + 2 <= n; i += 2) ok &= f16_bits_finite(u16_at(p + i));
        break;
    case KvType::bf16:
        for (size_t i = 0; i + 2 <= n; i += 2) ok &= bf16_bits_finite(u16_at(p + i));
        break;
    case KvType::q8_0:   // the int8 codes are always finite
        for (size_t i = 0; i + bytes <= n; i += bytes) ok &= f16_bits_finite(u16_at(p + i));
        break;
    case KvType::f8_e4m3:
        for (size_t i = 0; i + bytes <= n; i += bytes) {
            ok &= f16_bits_finite(u16_at(p + i));
            for (size_t j = 2; j < bytes; ++j) ok &= e4m3_finite(p[i + j]);
        }
        break;
    }
    return ok;
}

KvSnapshot kv_snapshot_join(const KvSnapshot& front, const KvSnapshot& back) {
    int32_t a[kHeaderInts] = {}, b[kHeaderInts] = {};
    if (front.bytes.size() < sizeof a || back.bytes.size() < sizeof b)
        throw UsageError("kv snapshot: a part is too short to be a KV snapshot");
    std::memcpy(a, front.bytes.data(), sizeof a);
    std::memcpy(b, back.bytes.data(), sizeof b);
    for (int i : {0, 1, 3, 4, 5, 6})
        if (a[i] != b[i]) throw UsageError("kv snapshot: the parts of a split cache do not match");
    KvSnapshot joined;
    joined.n_past = front.n_past;
    joined.kv_type = front.kv_type;
    joined.bytes = front.bytes;
    joined.bytes.insert(joined.bytes.end(), back.bytes.begin() + sizeof b, back.bytes.end());
    a[2] += b[2];
    std::memcpy(joined.bytes.data(), a, sizeof a);
    return joined;
}

std::pair<KvSnapshot, KvSnapshot> kv_snapshot_split(const KvSnapshot& whole, const KvSnapshotShape& front_shape) {
    int32_t h[kHeaderInts] = {};
    if (whole.bytes.size() < sizeof h) throw UsageError("kv_load: the snapshot is too short to be a KV snapshot");
    std::memcpy(h, whole.bytes.data(), sizeof h);
    const auto front_layers = static_cast<int32_t>(front_shape.n_kv_heads.size());
    if (h[2] <= front_layers || h[6] < 0)
        throw UsageError("kv_load: the snapshot was taken from a different model or KV type (" +
                         std::string(kv_type_name(whole.kv_type)) + ", cache is " +
                         std::string(kv_type_name(front_shape.type)) + ")");
    size_t front_body = 0;
    for (int32_t heads : front_shape.n_kv_heads)
        front_body += static_cast<size_t>(heads) * (k_rows_bytes(front_shape, h[6]) + v_rows_bytes(front_shape, h[6]));
    if (whole.bytes.size() < sizeof h + front_body)
        throw UsageError("kv_load: the snapshot has " + std::to_string(whole.bytes.size()) + " bytes, too few for its " +
                         std::to_string(h[6]) + " positions");
    std::pair<KvSnapshot, KvSnapshot> parts;
    for (KvSnapshot* p : {&parts.first, &parts.second}) {
        p->n_past = whole.n_past;
        p->kv_type = whole.kv_type;
    }
    const auto* body = whole.bytes.data() + sizeof h;
    int32_t front_h[kHeaderInts], back_h[kHeaderInts];
    std::memcpy(front_h, h, sizeof h);
    std::memcpy(back_h, h, sizeof h);
    front_h[2] = front_layers;
    back_h[2] = h[2] - front_layers;
    parts.first.bytes.assign(reinterpret_cast<const uint8_t*>(front_h), reinterpret_cast<const uint8_t*>(front_h) + sizeof h);
    parts.first.bytes.insert(parts.first.bytes.end(), body, body + front_body);
    parts.second.bytes.assign(reinterpret_cast<const uint8_t*>(back_h), reinterpret_cast<const uint8_t*>(back_h) + sizeof h);
    parts.second.bytes.insert(parts.second.bytes.end(), body + front_body, whole.bytes.data() + whole.bytes.size());
    return parts;
}

} // namespace tern
