#pragma once
// The CPU KV cache: per layer, K and V of every position, stored as f32, f16, bf16, q8_0 or f8_e4m3 rows
// (kernels/kv_format.h KvType; the block formats halve f16's bytes, models.md "KV cache formats").
//
// Paged: positions live in pages of kKvPagePositions (= the attention's chunk, kernels/cpu/attention.h, so
// a chunk is one run of rows and the attention's bits do not depend on where the pages are). A page slot
// holds, in every layer, K (n_kv_heads, kKvPagePositions, head_dim) then, in the layer's V buffer, V
// (n_kv_heads, kKvPagePositions, head_dim_v). The sequence's page table maps chunk c (positions
// [c * kKvPagePositions, (c + 1) * kKvPagePositions)) to a slot; slots are taken from a free list as
// positions are reserved and go back when positions are forgotten, so the many sequences of a batching
// engine can later share one pool.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_snapshot.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rope_shift.h"

namespace tern {

class KvCache {
public:
    // Throws KvHeadDimsUnfit when head_dim or head_dim_v is not a multiple of 32 for q8_0 / f8_e4m3,
    // KvAllocationFailed when the memory is not there (engine/load_errors.h).
    void init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim, int32_t head_dim_v,
              int32_t n_ctx);

    KvType type() const { return type_; }
    KvType format() const { return type_; }   // the stored row format (kernels/kv_format.h)
    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_past() const { return n_past_; }
    // The first n positions are valid (n <= the positions reserved); the pages past them go back to the pool.
    void set_n_past(int32_t n);
    size_t total_bytes() const;

    // Maps pages for positions [0, n) (n <= n_ctx). write() maps a missing page itself, so writers on
    // several threads reserve their positions first (the forward reserves its batch's).
    void reserve(int32_t n);
    // Stores one position of a layer: k (n_kv_heads, head_dim) f32, v (n_kv_heads, head_dim_v) f32.
    void write(int32_t layer, int32_t pos, const float* k, const float* v);
    // The address of row `pos` (reserved) of a head, kv_row_bytes(format(), head_dim) bytes; the rows of
    // one page are consecutive.
    const void* k_row(int32_t layer, int32_t head, int32_t pos) const;
    const void* v_row(int32_t layer, int32_t head, int32_t pos) const;
    // A layer's rows for the attention kernels (valid until the next reserve or set_n_past).
    KvPagesView pages_view(int32_t layer) const;
    // Page slots mapped now (the positions reserved, rounded up to pages).
    int32_t pages_in_use() const { return static_cast<int32_t>(page_table_.size()); }

    // The first n positions as bytes (engine/kv_snapshot.h: header + per layer, per head: K rows then V rows).
    KvSnapshot save(int32_t n) const;
    // Restores a snapshot taken from a cache of the same shape and type; sets n_past.
    // Throws UsageError when the snapshot does not fit this cache.
    void load(const KvSnapshot& snapshot);

    // Positions [begin, end) only ("TKR1": header + per layer, per head: K rows then V rows): one
    // block of the on-disk prefix cache, which stores each block of a prompt once.
    KvSnapshot save_range(int32_t begin, int32_t end) const;
    // Appends a save_range() snapshot whose first position is n_past() (blocks are restored in
    // order); n_past grows by its length. Throws UsageError, leaving the cache unchanged, when the
    // snapshot does not fit: another shape or type, another start, wrong length, past n_ctx.
    void append(const KvSnapshot& range);

    // Removes positions [begin, end): the rows after them move down by end - begin and n_past shrinks
    // by as much (the context shift). V rows move as bytes; K rows are turned by k_rotation[layer]
    // when it is given (one per layer; n_rot 0 = none): decoded to f32, rotated, re-encoded in the
    // cache's format (f32 rows in place). Throws UsageError for a range outside [0, n_past()].
    // n_threads splits the (layer, head) pairs. Defined in kv_cache_erase.cpp.
    void erase(int32_t begin, int32_t end, const std::vector<RopeRotation>& k_rotation, int n_threads);

private:
    KvSnapshotShape shape() const;
    void copy_rows_out(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, uint8_t* bytes) const;
    void copy_rows_in(size_t layer, int32_t head, bool value, int32_t pos, int32_t n, const uint8_t* bytes);
    size_t k_offset(size_t layer, int32_t head, int32_t pos) const; // bytes into a layer's K buffer (pos reserved)
    size_t v_offset(size_t layer, int32_t head, int32_t pos) const;
    // Returns the slots of pages wholly past position n to the free list.
    void release_after(int32_t n);

    KvType type_ = KvType::f16;
    size_t k_row_bytes_ = 0, v_row_bytes_ = 0;
    int32_t head_dim_ = 0, head_dim_v_ = 0, n_ctx_ = 0, n_past_ = 0;
    std::vector<int32_t> n_kv_heads_; // per layer
    std::vector<size_t> k_page_bytes_, v_page_bytes_;   // per layer: one slot's K / V bytes
    std::vector<int32_t> page_table_;   // chunk -> slot, for the positions reserved
    std::vector<int32_t> free_slots_;   // a stack; the lowest slot on top, so one sequence fills 0, 1, 2 ...
    // Uninitialised storage: a default-sized context of a small model is hundreds of MB (Gemma 3 270M
    // at 32768 positions: 604 MB in f16) and only positions < n_past are ever read, so the pages are
    // left for the OS to commit as the cache fills instead of being zeroed up front.
    struct Buffer {
        std::unique_ptr<uint8_t[]> bytes;
        size_t n = 0;
        void allocate(size_t size) {
            bytes.reset(new uint8_t[size]);
            n = size;
        }
        uint8_t* data() const { return bytes.get(); }
        size_t size() const { return n; }
    };
    std::vector<Buffer> k_, v_; // per layer: the slots' pages
};

} // namespace tern
