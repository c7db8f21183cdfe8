// GgufValue construction and display, GgufTensor helpers: the parts of gguf.h that are plain data.
#include <charconv>

#include "formats/gguf.h"
#include "formats/text.h"

namespace tern {

std::string_view gguf_type_name(GgufType t) {
    switch (t) {
    case GgufType::u8:
        return "u8";
    case GgufType::i8:
        return "i8";
    case GgufType::u16:
        return "u16";
    case GgufType::i16:
        return "i16";
    case GgufType::u32:
        return "u32";
    case GgufType::i32:
        return "i32";
    case GgufType::f32:
        return "f32";
    case GgufType::boolean:
        return "bool";
    case GgufType::string:
        return "string";
    case GgufType::array:
        return "array";
    case GgufType::u64:
        return "u64";
    case GgufType::i64:
        return "i64";
    case GgufType::f64:
        return "f64";
    }
    return "unknown";
}

namespace {

GgufValue unsigned_value(GgufType t, uint64_t v) {
    GgufValue r;
    r.type = t;
    r.u = v;
    return r;
}

GgufValue signed_value(GgufType t, int64_t v) {
    GgufValue r;
    r.type = t;
    r.i = v;
    return r;
}

GgufValue float_value(GgufType t, double v) {
    GgufValue r;
    r.type = t;
    r.f = v;
    return r;
}

// Shortest text that reads back to the same value: f32 values must print as f32, or 0.1f
// would show as 0.10000000149011612.
std::string number_text(const GgufValue& v) {
    char buf[64];
    std::to_chars_result r{};
    switch (v.type) {
    case GgufType::f32:
        r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(v.f));
        break;
    case GgufType::f64:
        r = std::to_chars(buf, buf + sizeof buf, v.f);
        break;
    case GgufType::i8:
    case GgufType::i16:
    case GgufType::i32:
    case GgufType::i64:
        r = std::to_chars(buf, buf + sizeof buf, v.i);
        break;
    default:
        r = std::to_chars(buf, buf + sizeof buf, v.u);
        break;
    }
    return std::string(buf, r.ptr);
}

std::string array_summary(const GgufValue& v) {
    const std::string n = std::to_string(v.array.size());
    switch (v.elem_type) {
    case GgufType::string:
        return "[" + n + (v.array.size() == 1 ? " string]" : " strings]");
    case GgufType::array:
        return "[" + n + (v.array.size() == 1 ? " array]" : " arrays]");
    default:
        return "[" + n + " " + std::string(gguf_type_name(v.elem_type)) + "]";
    }
}

} // namespace

GgufValue GgufValue::make_u8(uint8_t v) {
    return unsigned_value(GgufType::u8, v);
}
GgufValue GgufValue::make_u16(uint16_t v) {
    return unsigned_value(GgufType::u16, v);
}
GgufValue GgufValue::make_u32(uint32_t v) {
    return unsigned_value(GgufType::u32, v);
}
GgufValue GgufValue::make_u64(uint64_t v) {
    return unsigned_value(GgufType::u64, v);
}
GgufValue GgufValue::make_bool(bool v) {
    return unsigned_value(GgufType::boolean, v ? 1 : 0);
}
GgufValue GgufValue::make_i8(int8_t v) {
    return signed_value(GgufType::i8, v);
}
GgufValue GgufValue::make_i16(int16_t v) {
    return signed_value(GgufType::i16, v);
}
GgufValue GgufValue::make_i32(int32_t v) {
    return signed_value(GgufType::i32, v);
}
GgufValue GgufValue::make_i64(int64_t v) {
    return signed_value(GgufType::i64, v);
}
GgufValue GgufValue::make_f32(float v) {
    return float_value(GgufType::f32, v);
}
GgufValue GgufValue::make_f64(double v) {
    return float_value(GgufType::f64, v);
}

GgufValue GgufValue::make_string(std::string v) {
    GgufValue r;
    r.type = GgufType::string;
    r.str = std::move(v);
    return r;
}

GgufValue GgufValue::make_array(GgufType elem_type, std::vector<GgufValue> elems) {
    GgufValue r;
    r.type = GgufType::array;
    r.elem_type = elem_type;
    r.array = std::move(elems);
    return r;
}

GgufValue GgufValue::make_string_array(const std::vector<std::string>& v) {
    std::vector<GgufValue> elems;
    elems.reserve(v.size());
    for (const std::string& s : v)
        elems.push_back(make_string(s));
    return make_array(GgufType::string, std::move(elems));
}

GgufValue GgufValue::make_f32_array(const std::vector<float>& v) {
    std::vector<GgufValue> elems;
    elems.reserve(v.size());
    for (float x : v)
        elems.push_back(make_f32(x));
    return make_array(GgufType::f32, std::move(elems));
}

GgufValue GgufValue::make_i32_array(const std::vector<int32_t>& v) {
    std::vector<GgufValue> elems;
    elems.reserve(v.size());
    for (int32_t x : v)
        elems.push_back(make_i32(x));
    return make_array(GgufType::i32, std::move(elems));
}

bool GgufValue::is_integer() const {
    switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64:
        return true;
    default:
        return false;
    }
}

std::string GgufValue::to_display(size_t max_chars) const {
    switch (type) {
    case GgufType::boolean:
        return u ? "true" : "false";
    case GgufType::string: {
        // Keep the quotes outside the budget so a cut string still reads as a string.
        std::string out(1, '"');
        out += printable(str, max_chars > 2 ? max_chars - 2 : 1);
        out += '"';
        return out;
    }
    case GgufType::array: {
        // Short arrays of scalars are shown in full; anything longer is summarised.
        std::string out = "[";
        for (size_t k = 0; k < array.size(); ++k) {
            if (k) out += ", ";
            out += array[k].to_display(max_chars);
            if (out.size() + 1 > max_chars) return array_summary(*this);
        }
        return out + "]";
    }
    default:
        return number_text(*this);
    }
}

std::string GgufTensor::shape_string() const {
    std::string out = "[";
    for (int d = 0; d < n_dims; ++d) {
        if (d) out += ", ";
        out += std::to_string(ne[d]);
    }
    return out + "]";
}

} // namespace tern
