#pragma once
// The CPU KV cache: per layer, K and V of every position, stored as f32, f16, bf16, q8_0 or f8_e4m3 rows
// (kernels/kv_format.h KvType; the block formats halve f16's bytes, models.md "KV cache formats").
//
// Paged: positions live in pages of kKvPagePositions (= the attention's chunk, kernels/cpu/attention.h, so
// a chunk is one run of rows and the attention's bits do not depend on where the pages are). A page slot
// holds, in every layer, K (n_kv_heads, kKvPagePositions, head_dim) then, in the layer's V buffer, V
// (n_kv_heads, kKvPagePositions, head_dim_v). A sequence's page table (engine/kv_pages.h) maps its chunk c
// (positions [c * kKvPagePositions, (c + 1) * kKvPagePositions)) to a slot; slots are taken from a free
// list as positions are reserved and go back when positions are forgotten, so many sequences share one
// pool, and sequences with a common prefix share its pages.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/kv_pages.h"
#include "engine/kv_snapshot.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rope_shift.h"

namespace tern {

class KvCache {
public:
    // A pool of n_slots pages (0: enough for n_ctx positions of one sequence) and sequence 0, empty.
    // Throws KvHeadDimsUnfit when head_dim or head_dim_v is not a multiple of 32 for q8_0 / f8_e4m3,
    // KvAllocationFailed when the memory is not there (engine/load_errors.h).
    void init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, int32_t head_dim, int32_t head_dim_v,
              int32_t n_ctx, int32_t n_slots = 0);
    // The same with each layer's own head sizes (gemma4's sliding-window layers); a layer of 0 KV heads (one
    // that reads another layer's KV) holds no bytes; its snapshots hold each layer's rows in its own sizes.
    void init(KvType type, const std::vector<int32_t>& n_kv_heads_per_layer, const std::vector<int32_t>& head_dims,
              const std::vector<int32_t>& head_dims_v, int32_t n_ctx, int32_t n_slots = 0);

    KvType type() const { return type_; }
    KvType format() const { return type_; }   // the stored row format (kernels/kv_format.h)
    int32_t n_ctx() const { return n_ctx_; }   // positions one sequence may hold
    size_t total_bytes() const;

    // Sequences (engine/kv_pages.h): page tables over the one pool. Every method below takes the sequence
    // last, sequence 0 when left out. fork() shares the first n positions of src with dst (no bytes copied:
    // the first write into a shared page copies it).
    const KvPageTable& pages() const { return table_; }
    void create(int32_t seq) { table_.create(seq); }
    void free(int32_t seq) { table_.free(seq); }
    void fork(int32_t src, int32_t dst, int32_t n) { table_.fork(src, dst, n); }

    int32_t n_past(int32_t seq = 0) const { return table_.n_past(seq); }
    // The first n positions are valid (n <= the positions reserved); the pages past them go back to the pool.
    void set_n_past(int32_t n, int32_t seq = 0) { table_.set_n_past(seq, n); }

    // Makes positions [n_past, n) writable (n <= n_ctx): maps their pages, copying a page shared with
    // another sequence first. write() reserves a missing page itself, so writers on several threads
    // reserve their positions first (the forward reserves its batch's). Throws KvPoolExhausted when the
    // pool lacks the pages (nothing changed).
    void reserve(int32_t n, int32_t seq = 0);
    // Stores one position of a layer: k (n_kv_heads, head_dim) f32, v (n_kv_heads, head_dim_v) f32.
    void write(int32_t layer, int32_t pos, const float* k, const float* v, int32_t seq = 0);
    // The address of row `pos` (reserved) of a head, kv_row_bytes(format(), head_dim) bytes; the rows of
    // one page are consecutive.
    const void* k_row(int32_t layer, int32_t head, int32_t pos, int32_t seq = 0) const;
    const void* v_row(int32_t layer, int32_t head, int32_t pos, int32_t seq = 0) const;
    // A layer's rows for the attention kernels (valid until the sequence's pages change).
    KvPagesView pages_view(int32_t layer, int32_t seq = 0) const;
    // Page slots of the pool in use (by any sequence).
    int32_t pages_in_use() const { return table_.slots_in_use(); }

    // The first n positions as bytes (engine/kv_snapshot.h: header + per layer, per head: K rows then V rows).
    KvSnapshot save(int32_t n, int32_t seq = 0) const;
    // Restores a snapshot taken from a cache of the same shape and type; sets n_past.
    // Throws UsageError when the snapshot does not fit this cache.
    void load(const KvSnapshot& snapshot, int32_t seq = 0);

    // Positions [begin, end) only ("TKR1": header + per layer, per head: K rows then V rows): one
    // block of the on-disk prefix cache, which stores each block of a prompt once.
    KvSnapshot save_range(int32_t begin, int32_t end, int32_t seq = 0) const;
    // Appends a save_range() snapshot whose first position is n_past() (blocks are restored in
    // order); n_past grows by its length. Throws UsageError, leaving the cache unchanged, when the
    // snapshot does not fit: another shape or type, another start, wrong length, past n_ctx.
    void append(const KvSnapshot& range, int32_t seq = 0);

    // Removes positions [begin, end): the rows after them move down by end - begin and n_past shrinks
    // by as much (the context shift). V rows move as bytes; K rows are turned by k_rotation[layer]
    // when it is given (one per layer; n_rot 0 = none): decoded to f32, rotated, re-encoded in the
    // cache's format (f32 rows in place). Throws UsageError for a range outside [0, n_past()].
    // n_threads splits the (layer, head) pairs. Defined in kv_cache_erase.cpp.
    void erase(int32_t begin, int32_t end, const std::vector<RopeRotation>& k_rotation, int n_threads,
               int32_t seq = 0);

private:
    KvSnapshotShape shape() const;
    void copy_rows_out(int32_t seq, size_t layer, int32_t head, bool value, int32_t pos, int32_t n,
                       uint8_t* bytes) const;
    void copy_rows_in(int32_t seq, size_t layer, int32_t head, bool value, int32_t pos, int32_t n,
                      const uint8_t* bytes);
    // Calls run(offset, rows) for each page's part of rows [pos, pos + n) (mapped) of a head: the bytes
    // of those rows are consecutive from `offset` into the layer's K (or V) buffer.
    template <class Run>
    void for_each_run(int32_t seq, size_t layer, int32_t head, bool value, int32_t pos, int32_t n, Run run) const;
    // Bytes into a layer's K (value false) or V buffer of row `pos` (mapped) of a head of a sequence.
    size_t row_offset(int32_t seq, size_t layer, int32_t head, int32_t pos, bool value) const;
    size_t k_offset(int32_t seq, size_t layer, int32_t head, int32_t pos) const { return row_offset(seq, layer, head, pos, false); }
    size_t v_offset(int32_t seq, size_t layer, int32_t head, int32_t pos) const { return row_offset(seq, layer, head, pos, true); }
    // Bytes into a layer's K or V buffer of a slot's page.
    size_t page_offset(size_t layer, int32_t slot, bool value) const {
        return static_cast<size_t>(slot) * (value ? v_page_bytes_ : k_page_bytes_)[layer];
    }
    // Makes [begin, end) of seq writable and copies the pages prepare_write() moved.
    void make_writable(int32_t seq, int32_t begin, int32_t end);

    KvType type_ = KvType::f16;
    std::vector<size_t> k_row_bytes_, v_row_bytes_;    // per layer
    std::vector<int32_t> head_dim_, head_dim_v_;      // per layer
    int32_t n_ctx_ = 0;
    std::vector<int32_t> n_kv_heads_; // per layer
    std::vector<size_t> k_page_bytes_, v_page_bytes_;   // per layer: one slot's K / V bytes
    KvPageTable table_;
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
