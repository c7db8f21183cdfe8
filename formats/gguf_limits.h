#pragma once
// Caps the GGUF reader enforces beyond "fits in the file", shared with the writer so that tern
// never writes a file it would refuse to read. They bound memory and recursion for hostile files
// while leaving room for every real model: a 262,144-token vocabulary is three arrays of 262,144
// values, chat templates are tens of KiB.
#include <cstdint>
#include <string_view>

namespace tern::gguf_limits {

inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr uint64_t kMaxKeyBytes = 64 * 1024;              // keys are short dotted names
inline constexpr uint64_t kMaxStringBytes = 64ull * 1024 * 1024; // one string value
inline constexpr uint64_t kMaxArrayElems = 1ull << 24;           // one array (16.7M)
// All metadata values of a file, array elements included. Each parsed value costs ~100 bytes
// of memory, so this keeps the worst case of a small hostile file near 1.6 GB.
inline constexpr uint64_t kMaxTotalValues = 1ull << 24;
// Metadata records and tensors of one file. Real files have tens of keys and at most a few
// thousand tensors (a 256-expert MoE with unmerged experts would have ~50k); without the caps a
// 1 GB file of minimal records would cost gigabytes of parsed records before any other check.
inline constexpr uint64_t kMaxKeys = 1ull << 16;     // 65,536 metadata records
inline constexpr uint64_t kMaxTensors = 1ull << 18;  // 262,144 tensors
inline constexpr int kMaxArrayDepth = 8;            // array nesting levels
inline constexpr uint64_t kMaxTensorNameBytes = 63; // ggml's GGML_MAX_NAME is 64 with NUL
inline constexpr int kMaxDims = 4;

// Metadata strings are text (names, templates, tokenizer kinds) and must be valid UTF-8, or a
// message or `tern info` would print raw bytes and `quantize` would copy them on. Vocabulary tokens
// are the exception: byte-level and SentencePiece vocabularies hold single bytes and partial UTF-8
// sequences as tokens, and merges are pairs of tokens.
inline bool holds_byte_strings(std::string_view key) {
    return key == "tokenizer.ggml.tokens" || key == "tokenizer.ggml.merges";
}

} // namespace tern::gguf_limits
