#include "quant/value_check.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <span>
#include <vector>

#include "base/error.h"
#include "base/finite.h"
#include "quant/blocks.h"
#include "quant/half.h"
#include "quant/reference.h"

namespace tern {
namespace {

// A block's f16 scale fields, where its struct keeps them (quant/blocks.h).
struct ScaleField {
    const char* name;
    size_t offset;
};

struct ScaleFields {
    ScaleField fields[2];
    int n = 0;
};

ScaleFields f16_scales(GgmlType type) {
    switch (type) {
    case GgmlType::Q4_0:
        return {{{"d", offsetof(BlockQ4_0, d)}}, 1};
    case GgmlType::Q4_1:
        return {{{"d", offsetof(BlockQ4_1, d)}, {"m", offsetof(BlockQ4_1, m)}}, 2};
    case GgmlType::Q5_0:
        return {{{"d", offsetof(BlockQ5_0, d)}}, 1};
    case GgmlType::Q5_1:
        return {{{"d", offsetof(BlockQ5_1, d)}, {"m", offsetof(BlockQ5_1, m)}}, 2};
    case GgmlType::Q8_0:
        return {{{"d", offsetof(BlockQ8_0, d)}}, 1};
    case GgmlType::Q8_1:
        return {{{"d", offsetof(BlockQ8_1, d)}}, 1};
    case GgmlType::Q2_K:
        return {{{"d", offsetof(BlockQ2_K, d)}, {"dmin", offsetof(BlockQ2_K, dmin)}}, 2};
    case GgmlType::Q3_K:
        return {{{"d", offsetof(BlockQ3_K, d)}}, 1};
    case GgmlType::Q4_K:
        return {{{"d", offsetof(BlockQ4_K, d)}, {"dmin", offsetof(BlockQ4_K, dmin)}}, 2};
    case GgmlType::Q5_K:
        return {{{"d", offsetof(BlockQ5_K, d)}, {"dmin", offsetof(BlockQ5_K, dmin)}}, 2};
    case GgmlType::Q6_K:
        return {{{"d", offsetof(BlockQ6_K, d)}}, 1};
    case GgmlType::IQ4_NL:
        return {{{"d", offsetof(BlockIQ4_NL, d)}}, 1};
    case GgmlType::IQ4_XS:
        return {{{"d", offsetof(BlockIQ4_XS, d)}}, 1};
    case GgmlType::F8_E4M3:
        return {{{"d", offsetof(BlockF8_E4M3, d)}}, 1};
    default:
        return {};
    }
}

bool is_integer(GgmlType type) {
    return type == GgmlType::I8 || type == GgmlType::I16 || type == GgmlType::I32 || type == GgmlType::I64;
}

bool has_refused_encodings(GgmlType type) {
    return type == GgmlType::MXFP4;
}

// MXFP4 values are code * 2^(e - 128) with |code| <= 12 (mxfp4_scale_half): below e = 0xfd every one is finite
// (12 * 2^124 < FLT_MAX), so a run of such blocks needs no decoding, and the check of gpt-oss's experts goes at
// the speed of reading one byte in 17.
bool mxfp4_may_overflow(const uint8_t* blocks, int64_t n_blocks) {
    uint8_t top = 0;
    for (int64_t b = 0; b < n_blocks; ++b)
        top = std::max(top, blocks[static_cast<size_t>(b) * sizeof(BlockMXFP4) + offsetof(BlockMXFP4, e)]);
    return top >= 0xFD;
}

// An encoding the format excludes, whatever the block's values: E8M0 reserves 0xff for NaN (ggml's decoder
// reads it as 2^127, which the codes then push past FLT_MAX or leave huge).
std::string refused_encoding(GgmlType type, const uint8_t* block) {
    if (type == GgmlType::MXFP4 && block[offsetof(BlockMXFP4, e)] == 0xFF) return "its E8M0 scale byte is 0xff (NaN)";
    return "";
}

// Why a block decodes to a non-finite value: a scale field that is not finite, else the value itself.
std::string block_defect(GgmlType type, const uint8_t* block, int64_t element, float value) {
    const ScaleFields scales = f16_scales(type);
    for (int i = 0; i < scales.n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, block + scales.fields[i].offset, sizeof bits);
        const float v = f16_to_f32(bits);
        if (!std::isfinite(v)) {
            char hex[16];
            std::snprintf(hex, sizeof hex, "0x%04x", bits);
            return std::string("its f16 scale ") + scales.fields[i].name + " is " + float_text(v) + " (" + hex + ")";
        }
    }
    return "element " + std::to_string(element) + " decodes to " + float_text(value);
}

std::string block_words(const TypeInfo& ti, int64_t block, const std::string& defect) {
    const int64_t first = block * ti.block_elems;
    return "block " + std::to_string(block) + " (elements " + std::to_string(first) + ".." +
           std::to_string(first + ti.block_elems - 1) + "): " + defect;
}

} // namespace

bool values_checkable(GgmlType type) {
    const TypeInfo* ti = find_type(static_cast<uint32_t>(type));
    return ti && (ti->can_dequantize || is_integer(type));
}

std::optional<BadValue> find_bad_value(GgmlType type, const uint8_t* data, int64_t n, int64_t first_block) {
    const TypeInfo& ti = type_info(type);
    if (!values_checkable(type))
        throw InputError("values of format " + std::string(ti.name) + " cannot be decoded by tern");
    if (is_integer(type) || n <= 0) return std::nullopt;
    // Chunks of whole blocks, copied to an aligned buffer first (a file may place a tensor at any byte) and
    // decoded there.
    const int64_t blocks_per_chunk = std::max<int64_t>(1, 8192 / ti.block_elems);
    const int64_t n_blocks = n / ti.block_elems;
    std::vector<uint64_t> bytes((static_cast<size_t>(blocks_per_chunk) * ti.block_bytes + 7) / 8);
    std::vector<float> values(static_cast<size_t>(blocks_per_chunk * ti.block_elems));
    const auto* raw = reinterpret_cast<const uint8_t*>(bytes.data());
    for (int64_t b0 = 0; b0 < n_blocks; b0 += blocks_per_chunk) {
        const int64_t nb = std::min(blocks_per_chunk, n_blocks - b0);
        const int64_t n_values = nb * ti.block_elems;
        const uint8_t* src = data + static_cast<size_t>(b0) * ti.block_bytes;
        int64_t refused = -1;
        std::string refusal;
        if (type == GgmlType::F32) { // the bytes are the values: one copy, no decode
            std::memcpy(values.data(), src, static_cast<size_t>(n_values) * sizeof(float));
        } else {
            std::memcpy(bytes.data(), src, static_cast<size_t>(nb) * ti.block_bytes);
            if (type == GgmlType::MXFP4 && !mxfp4_may_overflow(raw, nb)) continue;
            if (has_refused_encodings(type))
                for (int64_t b = 0; b < nb && refused < 0; ++b) {
                    refusal = refused_encoding(type, raw + static_cast<size_t>(b) * ti.block_bytes);
                    if (!refusal.empty()) refused = b;
                }
            dequantize_row(type, raw, values.data(), n_values);
        }
        const int64_t bad = first_non_finite(std::span<const float>(values.data(), static_cast<size_t>(n_values)));
        if (refused < 0 && bad < 0) continue;
        BadValue r;
        if (refused >= 0 && (bad < 0 || refused <= bad / ti.block_elems)) {
            r.block = first_block + b0 + refused;
            r.element = r.block * ti.block_elems;
            r.value = values[static_cast<size_t>(refused * ti.block_elems)];
            r.what = block_words(ti, r.block, refusal);
            return r;
        }
        r.block = first_block + b0 + bad / ti.block_elems;
        r.element = (first_block + b0) * ti.block_elems + bad;
        r.value = values[static_cast<size_t>(bad)];
        r.what = ti.block_elems == 1
                     ? "element " + std::to_string(r.element) + " is " + float_text(r.value)
                     : block_words(ti, r.block,
                                   block_defect(type, raw + static_cast<size_t>(bad / ti.block_elems) * ti.block_bytes,
                                                r.element, r.value));
        return r;
    }
    return std::nullopt;
}

} // namespace tern
