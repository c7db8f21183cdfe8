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

void KvCache::erase(int32_t begin, int32_t end, const std::vector<RopeRotation>& k_rotation, int n_threads) {
    if (begin < 0 || end < begin || end > n_past_)
        throw UsageError("kv_erase: positions " + std::to_string(begin) + ".." + std::to_string(end) +
                         " requested but the cache holds " + std::to_string(n_past_));
    if (!k_rotation.empty() && k_rotation.size() != n_kv_heads_.size())
        throw std::invalid_argument("KvCache::erase: one K rotation per layer expected");
    const int32_t removed = end - begin;
    const int32_t moved = n_past_ - end;
    if (removed == 0) return;

    std::vector<std::pair<int32_t, int32_t>> heads; // (layer, head) work items
    for (size_t l = 0; l < n_kv_heads_.size(); ++l)
        for (int32_t h = 0; h < n_kv_heads_[l]; ++h)
            heads.emplace_back(static_cast<int32_t>(l), h);
    const int64_t work = static_cast<int64_t>(moved) * static_cast<int64_t>(heads.size()) * (head_dim_ + head_dim_v_);
    const int threads = threads_for_work(work * 4, std::max(n_threads, 1));

    parallel_for(static_cast<int64_t>(heads.size()), threads, 1, [&](int64_t i0, int64_t i1) {
        std::vector<float> rows; // (kRowsPerPass, head_dim) f32 scratch of this claim
        for (size_t i = static_cast<size_t>(i0); i < static_cast<size_t>(i1); ++i) {
            const auto [l, h] = heads[i];
            const size_t lu = static_cast<size_t>(l);
            // V rows only move (the rope does not touch values): one memmove per head.
            uint8_t* v = v_[lu].data() + v_offset(h, 0);
            std::memmove(v + static_cast<size_t>(begin) * v_row_bytes_, v + static_cast<size_t>(end) * v_row_bytes_,
                         static_cast<size_t>(moved) * v_row_bytes_);

            uint8_t* k = k_[lu].data() + k_offset(h, 0);
            const RopeRotation* rotation = k_rotation.empty() || k_rotation[lu].n_rot == 0 ? nullptr : &k_rotation[lu];
            if (!rotation || type_ == KvType::f32) {
                std::memmove(k + static_cast<size_t>(begin) * k_row_bytes_,
                             k + static_cast<size_t>(end) * k_row_bytes_, static_cast<size_t>(moved) * k_row_bytes_);
                if (rotation)
                    rope_rotate_rows(*rotation, reinterpret_cast<float*>(k + static_cast<size_t>(begin) * k_row_bytes_),
                                     moved, head_dim_);
                continue;
            }
            // Stored formats: decode a pass of rows, rotate, encode them at their new positions.
            // Going up from the lowest row, a pass only overwrites rows that were read already.
            rows.resize(static_cast<size_t>(kRowsPerPass) * static_cast<size_t>(head_dim_));
            for (int32_t p = 0; p < moved; p += kRowsPerPass) {
                const int32_t n = std::min(kRowsPerPass, moved - p);
                for (int32_t r = 0; r < n; ++r)
                    kv_load_row(type_, k + static_cast<size_t>(end + p + r) * k_row_bytes_,
                                rows.data() + static_cast<size_t>(r) * static_cast<size_t>(head_dim_), head_dim_);
                rope_rotate_rows(*rotation, rows.data(), n, head_dim_);
                for (int32_t r = 0; r < n; ++r)
                    kv_store_row(type_, rows.data() + static_cast<size_t>(r) * static_cast<size_t>(head_dim_),
                                 k + static_cast<size_t>(begin + p + r) * k_row_bytes_, head_dim_);
            }
        }
    });
    n_past_ -= removed;
}

} // namespace tern
