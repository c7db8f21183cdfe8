// KvCache::erase: the context shift's move of cached rows (engine/cpu/kv_cache.h).

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine/cpu/kv_cache.h"
#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "base/parallel_for.h"

namespace tern {

namespace {

// K rows decoded, rotated and re-encoded per pass: 64 rows of 256 floats is 64 KiB of scratch,
// which stays in L2 between the decode and the encode.
constexpr int32_t kRowsPerPass = 64;

} // namespace

void KvCache::erase(int32_t begin, int32_t end, const std::vector<RopeRotation>& k_rotation, int n_threads,
                    int32_t seq) {
    const int32_t n_past = table_.n_past(seq);
    if (begin < 0 || end < begin || end > n_past)
        throw UsageError("kv_erase: positions " + std::to_string(begin) + ".." + std::to_string(end) +
                         " requested but the cache holds " + std::to_string(n_past));
    if (!k_rotation.empty() && k_rotation.size() != n_kv_heads_.size())
        throw std::invalid_argument("KvCache::erase: one K rotation per layer expected");
    const int32_t removed = end - begin;
    const int32_t moved = n_past - end;
    if (removed == 0) return;
    make_writable(seq, begin, n_past);   // the rows from begin on are rewritten: shared pages are copied first

    std::vector<std::pair<int32_t, int32_t>> heads; // (layer, head) work items
    for (size_t l = 0; l < n_kv_heads_.size(); ++l)
        for (int32_t h = 0; h < n_kv_heads_[l]; ++h)
            heads.emplace_back(static_cast<int32_t>(l), h);
    int64_t per_row = 0;   // the elements every position's rows hold, all heads
    for (size_t l = 0; l < n_kv_heads_.size(); ++l) per_row += int64_t{n_kv_heads_[l]} * (head_dim_[l] + head_dim_v_[l]);
    const int64_t work = static_cast<int64_t>(moved) * per_row;
    const int threads = threads_for_work(work * 4, std::max(n_threads, 1));

    parallel_for(static_cast<int64_t>(heads.size()), threads, 1, [&](int64_t i0, int64_t i1) {
        std::vector<float> rows; // (kRowsPerPass, head_dim) f32 scratch of this claim
        for (size_t i = static_cast<size_t>(i0); i < static_cast<size_t>(i1); ++i) {
            // Plain copies, not a structured binding: lambdas below capture h (C++17 forbids capturing bindings).
            const int32_t l = heads[i].first;
            const int32_t h = heads[i].second;
            const size_t lu = static_cast<size_t>(l);
            const int32_t head_dim = head_dim_[lu];
            // Going up from the lowest row, a row is only overwritten after it was read (its destination is
            // removed - 1 or more positions below it). Rows are copied one by one: the pages of the two
            // ranges need not line up.
            auto k_at = [&](int32_t pos) { return k_[lu].data() + k_offset(seq, lu, h, pos); };
            // V rows only move (the rope does not touch values).
            for (int32_t r = 0; r < moved; ++r)
                std::memcpy(v_[lu].data() + v_offset(seq, lu, h, begin + r), v_[lu].data() + v_offset(seq, lu, h, end + r),
                            v_row_bytes_[lu]);
            const RopeRotation* rotation = k_rotation.empty() || k_rotation[lu].n_rot == 0 ? nullptr : &k_rotation[lu];
            if (!rotation) {
                for (int32_t r = 0; r < moved; ++r)
                    std::memcpy(k_at(begin + r), k_at(end + r), k_row_bytes_[lu]);
                continue;
            }
            // K rows: decode a pass of rows to f32, rotate, encode them at their new positions (f32 rows
            // decode and encode as copies, so they are rotated exactly as in place).
            rows.resize(static_cast<size_t>(kRowsPerPass) * static_cast<size_t>(head_dim));
            for (int32_t p = 0; p < moved; p += kRowsPerPass) {
                const int32_t n = std::min(kRowsPerPass, moved - p);
                for (int32_t r = 0; r < n; ++r)
                    kv_load_row(type_, k_at(end + p + r), rows.data() + static_cast<size_t>(r) * static_cast<size_t>(head_dim),
                                head_dim);
                rope_rotate_rows(*rotation, rows.data(), n, head_dim);
                for (int32_t r = 0; r < n; ++r)
                    kv_store_row(type_, rows.data() + static_cast<size_t>(r) * static_cast<size_t>(head_dim),
                                 k_at(begin + p + r), head_dim);
            }
        }
    });
    table_.set_n_past(seq, n_past - removed);
}

} // namespace tern
