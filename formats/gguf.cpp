// GgufFile lookups and typed getters. Parsing and validation live in gguf_parse.cpp.
#include "formats/gguf.h"

#include <limits>

#include "base/error.h"
#include "formats/text.h"

namespace tern {
namespace {

// The stored value as int64 when it is an integer that fits; false otherwise.
bool integer_value(const GgufValue& v, int64_t& out) {
    switch (v.type) {
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64:
        if (v.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
        out = static_cast<int64_t>(v.u);
        return true;
    case GgufType::i8:
    case GgufType::i16:
    case GgufType::i32:
    case GgufType::i64:
        out = v.i;
        return true;
    default:
        return false;
    }
}

bool float_value(const GgufValue& v, float& out) {
    if (v.type != GgufType::f32 && v.type != GgufType::f64) return false;
    out = static_cast<float>(v.f);
    return true;
}

// "u32", "string", or "array of f32" for messages.
std::string type_text(const GgufValue& v) {
    if (v.type != GgufType::array) return std::string(gguf_type_name(v.type));
    return "array of " + std::string(gguf_type_name(v.elem_type));
}

} // namespace

const GgufValue* GgufFile::find(std::string_view key) const {
    const auto it = kv_index_.find(key);
    return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

namespace {

[[noreturn]] void missing(const std::string& path, std::string_view key, std::string_view wanted) {
    throw InputError(printable(path, 4096) + ": metadata key '" + printable(key) + "' is missing (expected " +
                     std::string(wanted) + ")");
}

[[noreturn]] void wrong_type(const std::string& path, std::string_view key, std::string_view wanted,
                             const GgufValue& found) {
    std::string what = type_text(found);
    if (found.type != GgufType::array) what += " " + found.to_display(40);
    throw InputError(printable(path, 4096) + ": metadata key '" + printable(key) + "': expected " +
                     std::string(wanted) + ", found " + what);
}

} // namespace

uint32_t GgufFile::get_u32(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "u32");
    int64_t x = 0;
    if (!integer_value(*v, x) || x < 0 || x > static_cast<int64_t>(std::numeric_limits<uint32_t>::max()))
        wrong_type(path_, key, "u32", *v);
    return static_cast<uint32_t>(x);
}

uint32_t GgufFile::get_u32(std::string_view key, uint32_t fallback) const {
    return has(key) ? get_u32(key) : fallback;
}

int64_t GgufFile::get_int(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "an integer");
    int64_t x = 0;
    if (!integer_value(*v, x)) wrong_type(path_, key, "an integer that fits in i64", *v);
    return x;
}

int64_t GgufFile::get_int(std::string_view key, int64_t fallback) const {
    return has(key) ? get_int(key) : fallback;
}

float GgufFile::get_f32(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "f32");
    float x = 0;
    if (!float_value(*v, x)) wrong_type(path_, key, "f32", *v);
    return x;
}

float GgufFile::get_f32(std::string_view key, float fallback) const {
    return has(key) ? get_f32(key) : fallback;
}

bool GgufFile::get_bool(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "bool");
    if (v->type != GgufType::boolean) wrong_type(path_, key, "bool", *v);
    return v->u != 0;
}

bool GgufFile::get_bool(std::string_view key, bool fallback) const {
    return has(key) ? get_bool(key) : fallback;
}

const std::string& GgufFile::get_string(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "string");
    if (v->type != GgufType::string) wrong_type(path_, key, "string", *v);
    return v->str;
}

std::string GgufFile::get_string(std::string_view key, const std::string& fallback) const {
    return has(key) ? get_string(key) : fallback;
}

std::vector<std::string_view> GgufFile::get_string_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "array of string");
    if (v->type != GgufType::array || v->elem_type != GgufType::string) wrong_type(path_, key, "array of string", *v);
    std::vector<std::string_view> out;
    out.reserve(v->array.size());
    for (const GgufValue& e : v->array)
        out.emplace_back(e.str);
    return out;
}

std::vector<float> GgufFile::get_f32_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "array of f32");
    if (v->type != GgufType::array || (v->elem_type != GgufType::f32 && v->elem_type != GgufType::f64))
        wrong_type(path_, key, "array of f32", *v);
    std::vector<float> out;
    out.reserve(v->array.size());
    for (const GgufValue& e : v->array)
        out.push_back(static_cast<float>(e.f));
    return out;
}

std::vector<int64_t> GgufFile::get_int_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "array of integers");
    if (v->type != GgufType::array) wrong_type(path_, key, "array of integers", *v);
    std::vector<int64_t> out;
    out.reserve(v->array.size());
    for (size_t k = 0; k < v->array.size(); ++k) {
        int64_t x = 0;
        if (!integer_value(v->array[k], x))
            throw InputError(printable(path_, 4096) + ": metadata key '" + printable(key) + "': element " +
                             std::to_string(k) + ": expected an integer that fits in i64, found " +
                             type_text(v->array[k]) + " " + v->array[k].to_display(40));
        out.push_back(x);
    }
    return out;
}

std::vector<int64_t> GgufFile::get_per_layer(std::string_view key, int64_t n_layers) const {
    const GgufValue* v = find(key);
    if (!v) missing(path_, key, "an integer or an array with one integer per layer");
    if (v->type != GgufType::array) return std::vector<int64_t>(static_cast<size_t>(n_layers), get_int(key));
    std::vector<int64_t> out = get_int_array(key);
    if (static_cast<int64_t>(out.size()) != n_layers)
        throw InputError(printable(path_, 4096) + ": metadata key '" + printable(key) + "': expected " +
                         std::to_string(n_layers) + " values (one per layer), found " + std::to_string(out.size()));
    return out;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
    const auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
    if (const GgufTensor* t = find_tensor(name)) return *t;
    throw InputError(printable(path_, 4096) + ": tensor '" + printable(name) + "' is missing");
}

} // namespace tern
