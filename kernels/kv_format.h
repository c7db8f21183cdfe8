#pragma once
// The KV cache formats, one table for every layer: the engine sizes caches and plans memory with
// it, the app names the formats with it, and each kernel family (kernels/cpu, later kernels/cuda)
// stores and reads rows laid out by it. It lives at the kernels/ root because that is the lowest
// folder both the engine and every kernel family include; base/ knows nothing about tensors.
//
//   f32 / f16 / bf16  one element per 4 / 2 / 2 bytes
//   q8_0              GGUF Q8_0 blocks: f16 scale d + 32 int8 codes, x = d * q (quant/blocks.h BlockQ8_0)
//   f8_e4m3           tern's F8_E4M3 blocks: f16 scale d + 32 e4m3 bytes, x = d * e4m3(q) (models.md)
// A row of n elements is ceil(n / block_elems) blocks; the block formats need head dims that are
// multiples of 32 (KvCache::init refuses others), so no row ever ends in a partial block.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace tern {

enum class KvType : uint8_t { f32, f16, bf16, q8_0, f8_e4m3 };

struct KvFormatInfo {
    KvType type;
    std::string_view name;    // as --kv-type spells it
    int32_t block_elems;      // elements per block (1 for the float formats)
    int32_t block_bytes;      // bytes per block
    bool quantized;           // a block format with a scale (about half of f16's bytes)
};

// Positions per page of the CPU's paged KV cache (engine/cpu/kv_cache.h), which is also the CPU attention's
// chunk (kernels/cpu/attention.h kAttnChunk): a chunk's rows are then one run inside one page.
inline constexpr int32_t kKvPagePositions = 128;
// Pages that hold `positions` positions (64-bit: a context may be up to INT32_MAX positions).
inline constexpr int64_t kv_pages_for(int64_t positions) {
    return (positions + kKvPagePositions - 1) / kKvPagePositions;
}

inline constexpr std::array<KvFormatInfo, 5> kKvFormats = {{
    {KvType::f32, "f32", 1, 4, false},
    {KvType::f16, "f16", 1, 2, false},
    {KvType::bf16, "bf16", 1, 2, false},
    {KvType::q8_0, "q8_0", 32, 34, true},      // 32 int8 + one f16 scale
    {KvType::f8_e4m3, "f8_e4m3", 32, 34, true}, // 32 e4m3 bytes + one f16 scale
}};

constexpr const KvFormatInfo& kv_format_info(KvType t) {
    for (const KvFormatInfo& f : kKvFormats)
        if (f.type == t) return f;
    return kKvFormats[1];   // unreachable for a valid enum value
}

// Elements per block of the format (1 for the float formats, 32 for q8_0 / f8_e4m3).
constexpr int64_t kv_block_elems(KvType t) { return kv_format_info(t).block_elems; }

// Bytes of one row of n elements.
constexpr size_t kv_row_bytes(KvType t, int64_t n) {
    const KvFormatInfo& f = kv_format_info(t);
    const uint64_t blocks = (static_cast<uint64_t>(n) + static_cast<uint64_t>(f.block_elems) - 1) /
                            static_cast<uint64_t>(f.block_elems);
    return static_cast<size_t>(blocks * static_cast<uint64_t>(f.block_bytes));
}

// Bytes one position takes in a cache: per layer, one K row of head_dim and one V row of
// head_dim_v for each of that layer's KV heads.
constexpr uint64_t kv_position_bytes(KvType t, std::span<const int32_t> n_kv_heads_per_layer, int64_t head_dim,
                                     int64_t head_dim_v) {
    uint64_t bytes = 0;
    for (int32_t heads : n_kv_heads_per_layer)
        bytes += static_cast<uint64_t>(heads) * (kv_row_bytes(t, head_dim) + kv_row_bytes(t, head_dim_v));
    return bytes;
}

std::string_view kv_type_name(KvType t);
KvType kv_type_from_name(std::string_view name);   // throws UsageError listing the choices

} // namespace tern
