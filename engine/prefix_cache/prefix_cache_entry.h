#pragma once
// The byte format of one on-disk prefix-cache entry: the K/V of one block of prompt tokens
// (engine/prefix_cache/prefix_cache.h). Every field is checked on reading, so a truncated, bit-flipped or
// foreign file is refused instead of restoring wrong K/V, which would silently change output.
//
// Layout, little-endian:
//   magic "TPC1"  u32 format version  u64 model identity  u64 chain hash  u32 block index
//   u32 KV type  u32 n_tokens  u64 payload bytes  i32 tokens[n_tokens]  payload
//   u64 XXH3-64 of every byte before it
// The payload is the backend's kv_save_range() snapshot of the block's positions.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace tern {

inline constexpr uint32_t kPrefixEntryVersion = 1;
// Header bytes before the tokens, and the checksum after the payload.
inline constexpr size_t kPrefixEntryHeaderBytes = 44;
inline constexpr size_t kPrefixEntryChecksumBytes = 8;
// No block has more tokens than this (a bound on what a reader allocates).
inline constexpr uint32_t kPrefixEntryMaxTokens = 1u << 16;

struct PrefixEntry {
    uint64_t identity = 0;      // model_identity() of the model and settings that made the K/V
    uint64_t chain = 0;         // chain hash of the tokens up to and including this block
    uint32_t block_index = 0;   // the block holds positions [index * n_tokens, (index + 1) * n_tokens)
    KvType kv_type = KvType::f16;
    std::vector<int32_t> tokens;    // the block's tokens (compared on load: no silent hash collisions)
    std::vector<uint8_t> payload;   // kv_save_range() bytes
};

std::vector<uint8_t> serialize_prefix_entry(const PrefixEntry& entry);

// Parses and checks an entry's bytes: size, magic, version, KV type, counts, checksum. Pure (no
// I/O, no exceptions): on failure returns false with a short reason in *why ("truncated",
// "checksum mismatch", ...). It does not know which entry the caller expected: identity, chain,
// index and tokens are compared by the caller.
bool parse_prefix_entry(std::span<const uint8_t> bytes, PrefixEntry& out, std::string* why);

} // namespace tern
