#pragma once
// GgufFile: a validated, read-only view of a GGUF v2/v3 file (../shared/FORMATS.md §1).
// Everything is checked before use with 64-bit overflow-checked arithmetic; any problem throws
// InputError with a one-line message naming the file, the field or tensor, the byte offset,
// what was expected, and a hint for common wrong files (HTML page, git-LFS pointer, truncated
// download, old GGML/GGJT, zero-filled file, directory).
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/mapped_file.h"
#include "quant/types.h"

namespace tern {

enum class GgufType : uint32_t {
    u8 = 0, i8 = 1, u16 = 2, i16 = 3, u32 = 4, i32 = 5, f32 = 6, boolean = 7,
    string = 8, array = 9, u64 = 10, i64 = 11, f64 = 12,
};
std::string_view gguf_type_name(GgufType t);   // "u32", "string", "array", ...

// One metadata value. Scalars keep their stored type; arrays hold their elements (arrays of
// arrays are allowed, as gguf-py writes them). Owning, so the writer can build them too.
// Keys, tensor names and metadata strings are validated as UTF-8, except the strings of
// tokenizer.ggml.tokens and tokenizer.ggml.merges (a vocabulary may hold raw byte tokens), so code
// that prints those should escape what is not valid UTF-8.
struct GgufValue {
    GgufType type = GgufType::u8;
    uint64_t u = 0;        // u8/u16/u32/u64, and bool (0/1)
    int64_t i = 0;         // i8/i16/i32/i64
    double f = 0;          // f32/f64
    std::string str;       // string
    GgufType elem_type = GgufType::u8;   // array
    std::vector<GgufValue> array;        // array elements

    static GgufValue make_u32(uint32_t v);
    static GgufValue make_i32(int32_t v);
    static GgufValue make_u64(uint64_t v);
    static GgufValue make_f32(float v);
    static GgufValue make_bool(bool v);
    static GgufValue make_string(std::string v);
    static GgufValue make_string_array(const std::vector<std::string>& v);
    static GgufValue make_f32_array(const std::vector<float>& v);
    static GgufValue make_i32_array(const std::vector<int32_t>& v);
    // The remaining scalar types and generic arrays (nested ones included), for writers and tests.
    static GgufValue make_u8(uint8_t v);
    static GgufValue make_i8(int8_t v);
    static GgufValue make_u16(uint16_t v);
    static GgufValue make_i16(int16_t v);
    static GgufValue make_i64(int64_t v);
    static GgufValue make_f64(double v);
    // Every element must have type `elem_type` (checked by GgufWriter::write).
    static GgufValue make_array(GgufType elem_type, std::vector<GgufValue> elems);

    bool is_integer() const;   // u8..i64 (not bool)
    bool operator==(const GgufValue&) const = default;

    // A short human form for `tern info` ("[512 strings]" for long arrays).
    std::string to_display(size_t max_chars = 60) const;
};

struct GgufKv {
    std::string key;
    GgufValue value;
    bool operator==(const GgufKv&) const = default;
};

struct GgufTensor {
    std::string name;
    GgmlType type = GgmlType::F32;
    int n_dims = 0;
    int64_t ne[4] = {1, 1, 1, 1};   // ne[0] is the contiguous dimension
    uint64_t offset = 0;            // relative to the data section
    uint64_t n_bytes = 0;           // row_bytes(type, ne[0]) * ne[1] * ne[2] * ne[3]
    const uint8_t* data = nullptr;  // inside the mapping, aligned

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
    size_t row_size() const { return row_bytes(type, ne[0]); }
    std::string shape_string() const;   // "[64, 512]"
};

class GgufFile {
public:
    static GgufFile open(const std::string& path);
    // Parse bytes already in memory (tests, fuzzing); `name` is used in messages.
    static GgufFile parse(std::span<const uint8_t> bytes, const std::string& name);

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint64_t file_size() const { return bytes_.size(); }
    uint32_t alignment() const { return alignment_; }
    uint64_t data_offset() const { return data_offset_; }
    std::span<const uint8_t> bytes() const { return bytes_; }

    // Metadata, in file order.
    const std::vector<GgufKv>& metadata() const { return kvs_; }
    const GgufValue* find(std::string_view key) const;   // nullptr when absent
    bool has(std::string_view key) const { return find(key) != nullptr; }

    // Typed getters. The no-default forms throw InputError when the key is missing; all throw
    // InputError naming the key, the type wanted and the type found when the type is wrong.
    // Integer getters accept any integer type whose value fits (files in the wild mix u32/i32).
    uint32_t get_u32(std::string_view key) const;
    uint32_t get_u32(std::string_view key, uint32_t fallback) const;
    int64_t get_int(std::string_view key) const;
    int64_t get_int(std::string_view key, int64_t fallback) const;
    float get_f32(std::string_view key) const;
    float get_f32(std::string_view key, float fallback) const;
    bool get_bool(std::string_view key) const;
    bool get_bool(std::string_view key, bool fallback) const;
    const std::string& get_string(std::string_view key) const;
    std::string get_string(std::string_view key, const std::string& fallback) const;
    // Arrays: the element type must match (ints: any integer type that fits).
    std::vector<std::string_view> get_string_array(std::string_view key) const;
    std::vector<float> get_f32_array(std::string_view key) const;
    std::vector<int64_t> get_int_array(std::string_view key) const;
    // A per-layer value stored either as a scalar or as an array with one entry per layer.
    std::vector<int64_t> get_per_layer(std::string_view key, int64_t n_layers) const;

    const std::vector<GgufTensor>& tensors() const { return tensors_; }
    const GgufTensor* find_tensor(std::string_view name) const;   // nullptr when absent
    const GgufTensor& tensor(std::string_view name) const;        // throws InputError when absent

private:
    std::string path_;
    MappedFile map_;                      // empty when parsed from memory
    std::span<const uint8_t> bytes_;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t data_offset_ = 0;
    std::vector<GgufKv> kvs_;
    std::map<std::string, size_t, std::less<>> kv_index_;
    std::vector<GgufTensor> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;

    friend class GgufParser;
};

} // namespace tern
