#pragma once
// The byte format of KV snapshots (Backend::kv_save / kv_save_range), shared by every backend whose
// cache has the CPU's layout (engine/cpu/kv_cache.h): a header of seven int32 (magic, KV type, layers,
// head_dim, head_dim_v, n_ctx or first position, positions), then per layer, per KV head, that head's K
// rows and V rows in the cache's row format. So a prefix-cache file or a /save taken on one device
// loads on another. Each backend supplies only the copy of a run of rows between its memory and the
// snapshot bytes.
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "engine/backend.h"

namespace tern {

// The shape a snapshot must match.
struct KvSnapshotShape {
    KvType type = KvType::f16;
    std::vector<int32_t> n_kv_heads;   // per layer
    int32_t head_dim = 0, head_dim_v = 0, n_ctx = 0;
    // Each layer's own head sizes where they differ (gemma4's sliding-window layers); empty: head_dim and
    // head_dim_v for every layer. The header keeps the model's head_dim / head_dim_v; the rows of each layer have
    // its own sizes. (A split model's join / split takes uniform shapes only.)
    std::vector<int32_t> head_dims, head_dims_v;
};

// Copies `n` consecutive rows of one head's K (value false) or V (value true) of `layer`, starting at
// position `pos`, to or from `bytes` (n * row bytes of that kind).
using KvRowsOut = std::function<void(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, uint8_t* bytes)>;
using KvRowsIn =
    std::function<void(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, const uint8_t* bytes)>;

// The first n positions ("TKV2") of a cache holding n_past. Throws UsageError unless 0 <= n <= n_past.
KvSnapshot kv_snapshot_whole(const KvSnapshotShape& shape, int32_t n_past, int32_t n, const KvRowsOut& out);
// Positions [begin, end) ("TKR1"). Throws UsageError unless 0 <= begin <= end <= n_past.
KvSnapshot kv_snapshot_range(const KvSnapshotShape& shape, int32_t n_past, int32_t begin, int32_t end,
                             const KvRowsOut& out);

// Restores a whole snapshot (kv_load; "TKV1" too for the float formats) and returns its positions.
// Throws UsageError naming what differs when it was taken from another shape or type, or does not fit.
int32_t kv_restore_whole(const KvSnapshotShape& shape, const KvSnapshot& snapshot, const KvRowsIn& in);
// Appends a range snapshot at n_past (kv_append) and returns its positions. Throws UsageError, having
// copied nothing, when it does not fit: another shape or type, another start, wrong length, past n_ctx.
int32_t kv_restore_range(const KvSnapshotShape& shape, int32_t n_past, const KvSnapshot& range, const KvRowsIn& in);

// The positions a whole snapshot's header says it holds; -1 when it is too short to have a header.
int32_t kv_snapshot_positions(const KvSnapshot& snapshot);

// True when every value the snapshot stores is finite: each element of the float formats, each block's
// scale of q8_0 and f8_e4m3 and each e4m3 code. A NaN or infinity in a cache never comes from a forward
// of a sound model (a damaged or crafted file does hold them) and would turn every later logit into
// NaN. The rows are uniform runs of elements or blocks, so no shape is needed. Linear in the bytes.
bool kv_snapshot_finite(const KvSnapshot& snapshot);

// A split model's cache (engine/split_backend.h) is two caches over consecutive layers. join() makes one
// snapshot of the model from the front layers' and the back layers' snapshots of the same positions;
// split() undoes it for a front part of `front_layers` layers with those KV head counts. Both throw
// UsageError for snapshots that do not fit together.
KvSnapshot kv_snapshot_join(const KvSnapshot& front, const KvSnapshot& back);
std::pair<KvSnapshot, KvSnapshot> kv_snapshot_split(const KvSnapshot& whole, const KvSnapshotShape& front_shape);

} // namespace tern
