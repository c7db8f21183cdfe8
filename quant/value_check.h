#pragma once
// Values no weight may hold: a NaN or +-inf that a tensor's bytes decode to (by the scalar reference codecs,
// reference.h), and the encodings a format itself excludes (MXFP4's E8M0 scale byte 0xff, which is NaN). One
// such value in a norm or a router turns every logit into NaN; in a matrix, the rows that meet it. What
// `tern info --check` runs over every tensor and loading runs over the small ones.
#include <cstdint>
#include <optional>
#include <string>

#include "quant/types.h"

namespace tern {

// Whether find_bad_value can check a format: every format the reference codecs decode, and the integer formats
// (an integer is never non-finite). The others (IQ1/IQ2/IQ3, TQ, F64) tern cannot decode.
bool values_checkable(GgmlType type);

struct BadValue {
    int64_t block = 0;   // the block that holds it (the element itself for the plain float formats)
    int64_t element = 0; // its first non-finite element, or the block's first when its encoding is refused
    float value = 0.0f;  // what that element decodes to
    // In words, for an error line after the tensor's name: "element 17 is nan", "block 12 (elements
    // 384..415): its f16 scale d is inf (0x7c00)", "block 3 (elements 96..127): its E8M0 scale byte is 0xff
    // (NaN)", "block 9 (elements 288..319): element 300 decodes to inf".
    std::string what;
};

// The first bad block of the n elements (a multiple of the block size) of `type` at `data` (any alignment), or
// nullopt when every value decodes finite. `first_block` is the index, in its tensor, of the block at `data`
// (a piece of a tensor checked apart): the indices returned and named count from the tensor's start. Throws
// InputError for a format that is not values_checkable.
std::optional<BadValue> find_bad_value(GgmlType type, const uint8_t* data, int64_t n, int64_t first_block = 0);

} // namespace tern
