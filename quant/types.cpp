#include "quant/types.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "base/error.h"

namespace tern {
namespace {

// Sizes from ../shared/FORMATS.md §2. Keep in id order.
constexpr std::array kTypes = {
    TypeInfo{GgmlType::F32, "f32", 1, 4, true, true},
    TypeInfo{GgmlType::F16, "f16", 1, 2, true, true},
    TypeInfo{GgmlType::Q4_0, "q4_0", 32, 18, true, true},
    TypeInfo{GgmlType::Q4_1, "q4_1", 32, 20, true, true},
    TypeInfo{GgmlType::Q5_0, "q5_0", 32, 22, true, true},
    TypeInfo{GgmlType::Q5_1, "q5_1", 32, 24, true, true},
    TypeInfo{GgmlType::Q8_0, "q8_0", 32, 34, true, true},
    TypeInfo{GgmlType::Q8_1, "q8_1", 32, 36, true, true},
    TypeInfo{GgmlType::Q2_K, "q2_K", 256, 84, true, true},
    TypeInfo{GgmlType::Q3_K, "q3_K", 256, 110, true, true},
    TypeInfo{GgmlType::Q4_K, "q4_K", 256, 144, true, true},
    TypeInfo{GgmlType::Q5_K, "q5_K", 256, 176, true, true},
    TypeInfo{GgmlType::Q6_K, "q6_K", 256, 210, true, true},
    TypeInfo{GgmlType::Q8_K, "q8_K", 256, 292, true, true},
    TypeInfo{GgmlType::IQ2_XXS, "iq2_xxs", 256, 66, false, false},
    TypeInfo{GgmlType::IQ2_XS, "iq2_xs", 256, 74, false, false},
    TypeInfo{GgmlType::IQ3_XXS, "iq3_xxs", 256, 98, false, false},
    TypeInfo{GgmlType::IQ1_S, "iq1_s", 256, 50, false, false},
    TypeInfo{GgmlType::IQ4_NL, "iq4_nl", 32, 18, true, true},
    TypeInfo{GgmlType::IQ3_S, "iq3_s", 256, 110, false, false},
    TypeInfo{GgmlType::IQ2_S, "iq2_s", 256, 82, false, false},
    TypeInfo{GgmlType::IQ4_XS, "iq4_xs", 256, 136, true, true},
    TypeInfo{GgmlType::I8, "i8", 1, 1, false, false},
    TypeInfo{GgmlType::I16, "i16", 1, 2, false, false},
    TypeInfo{GgmlType::I32, "i32", 1, 4, false, false},
    TypeInfo{GgmlType::I64, "i64", 1, 8, false, false},
    TypeInfo{GgmlType::F64, "f64", 1, 8, false, false},
    TypeInfo{GgmlType::IQ1_M, "iq1_m", 256, 56, false, false},
    TypeInfo{GgmlType::BF16, "bf16", 1, 2, true, true},
    TypeInfo{GgmlType::TQ1_0, "tq1_0", 256, 54, false, false},
    TypeInfo{GgmlType::TQ2_0, "tq2_0", 256, 66, false, false},
    TypeInfo{GgmlType::MXFP4, "mxfp4", 32, 17, true, true},
    TypeInfo{GgmlType::F8_E4M3, "f8_e4m3", 32, 34, true, true},
};

bool iequals(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
               return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
           });
}

} // namespace

const TypeInfo* find_type(uint32_t id) {
    for (const TypeInfo& t : kTypes)
        if (static_cast<uint32_t>(t.type) == id) return &t;
    return nullptr;
}

const TypeInfo& type_info(GgmlType type) {
    if (const TypeInfo* t = find_type(static_cast<uint32_t>(type))) return *t;
    throw InputError("unknown tensor format id " + std::to_string(static_cast<uint32_t>(type)) +
                     " (tern knows the GGUF ids 0-3, 6-30, 34, 35, 39 and its own f8_e4m3 = 1000)");
}

std::optional<GgmlType> type_from_name(std::string_view name) {
    for (const TypeInfo& t : kTypes)
        if (iequals(t.name, name)) return t.type;
    return std::nullopt;
}

std::span<const TypeInfo> all_types() { return kTypes; }

std::string_view type_name(GgmlType type) {
    const TypeInfo* t = find_type(static_cast<uint32_t>(type));
    return t ? t->name : std::string_view("unknown");
}

double bits_per_weight(GgmlType t) {
    const TypeInfo& ti = type_info(t);
    return 8.0 * static_cast<double>(ti.block_bytes) / static_cast<double>(ti.block_elems);
}

} // namespace tern
