#pragma once
// ONE table of tensor formats. Ids equal ggml's type ids for every GGUF type, so a tensor's
// `type` field indexes this table directly. tern's own F8_E4M3 uses an id far outside the
// range GGUF uses (ggml's GGML_TYPE_COUNT is 40 with MXFP4 and grows slowly).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tern {

enum class GgmlType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,   // gpt-oss's expert weights: E2M1 codes with a power-of-two (E8M0) scale per 32
    // tern-specific: 32 e4m3 values with one f16 scale (34 bytes). See models.md.
    F8_E4M3 = 1000,
};

// What tern can do with a format. Formats GGUF defines but tern cannot compute with (IQ2/IQ3/IQ1,
// TQ, integer tensors) are still known, so a file holding them validates and `tern info` shows
// them; using them in a model is an "unsupported format" error.
struct TypeInfo {
    GgmlType type;
    std::string_view name;   // ggml's spelling: "q4_K", "f16", ...
    int64_t block_elems;     // elements per block (1 for plain floats)
    size_t block_bytes;      // bytes per block
    bool can_dequantize;     // scalar reference dequantizer exists
    bool can_quantize;       // scalar reference quantizer exists
};

// nullptr for an id that is not a format (including ggml's removed ids 4, 5, 31-33, 36-38).
const TypeInfo* find_type(uint32_t id);
const TypeInfo& type_info(GgmlType type);           // throws InputError for an unknown type
std::optional<GgmlType> type_from_name(std::string_view name);   // case-insensitive
std::span<const TypeInfo> all_types();

std::string_view type_name(GgmlType type);
inline int64_t block_elems(GgmlType t) { return type_info(t).block_elems; }
inline size_t block_bytes(GgmlType t) { return type_info(t).block_bytes; }
// Bytes of one row of n elements; n must be a multiple of the block size (callers validate).
inline size_t row_bytes(GgmlType t, int64_t n) {
    const TypeInfo& ti = type_info(t);
    return static_cast<size_t>(n / ti.block_elems) * ti.block_bytes;
}
double bits_per_weight(GgmlType t);

} // namespace tern
