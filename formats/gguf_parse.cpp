// The GGUF reader: walks the bytes of ../shared/FORMATS.md §1 once, validating every count,
// length, type and offset before it is used. All arithmetic on values read from the file is
// 64-bit and overflow-checked; a hostile file can make us throw, never read out of bounds,
// allocate without bound or recurse without bound.
#include <algorithm>
#include <bit>
#include <cstring>
#include <numeric>

#include "base/error.h"
#include "formats/gguf.h"
#include "formats/gguf_limits.h"
#include "formats/gguf_sniff.h"
#include "formats/text.h"

namespace tern {

namespace lim = gguf_limits;

// GGUF is little-endian and both sides copy integers with memcpy.
static_assert(std::endian::native == std::endian::little, "the GGUF code assumes a little-endian host");

namespace {

constexpr const char* kTruncatedHint = "truncated download?";
// For values no converter writes: the bytes were damaged (or the file was crafted).
constexpr const char* kCorruptHint = " (corrupt file?)";
// Smallest possible records: key length, 1 key byte, value type, a u8 value; name length, 1 name
// byte, n_dims, one ne, type, offset.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;

bool valid_value_type(uint32_t t) {
    return t <= static_cast<uint32_t>(GgufType::f64);
}

// Fewest bytes one value of type `t` can occupy, for bounding counts by the bytes left.
uint64_t min_value_bytes(GgufType t) {
    switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
        return 1;
    case GgufType::u16:
    case GgufType::i16:
        return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
        return 4;
    case GgufType::string:
        return 8; // the length
    case GgufType::array:
        return 12; // element type + count
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
        return 8;
    }
    return 1;
}

// Why a ggml type id is not a format, for the ids ggml used once and dropped.
std::string unknown_type_reason(uint32_t id) {
    if (id == 4 || id == 5) return " (Q4_2/Q4_3, removed from ggml in 2023; re-quantize the model)";
    if (id >= 31 && id <= 33) return " (Q4_0_4_4/4_8/8_8, repacked formats that are no longer stored in files)";
    if (id >= 36 && id <= 38) return " (IQ4_NL_4_4/4_8/8_8, repacked formats that are no longer stored in files)";
    return " (a format newer than this tern, or a corrupt file)";
}

} // namespace

// Friend of GgufFile (see gguf.h): fills its private members.
class GgufParser {
public:
    GgufParser(GgufFile& file, std::string display_name)
        : f_(file), name_(printable(display_name, 4096)), b_(file.bytes_) {}

    void run() {
        read_header();
        for (uint64_t k = 0; k < n_kv_; ++k)
            read_kv(k);
        read_alignment();
        check_count(8, "n_tensors", n_tensors_, kMinTensorInfoBytes, "tensor info records", "the metadata");
        f_.tensors_.reserve(n_tensors_);
        tensor_pos_.reserve(n_tensors_);
        for (uint64_t t = 0; t < n_tensors_; ++t)
            read_tensor_info(t);
        place_tensors();
    }

private:
    GgufFile& f_;
    std::string name_; // the file as shown in messages
    std::span<const uint8_t> b_;
    uint64_t pos_ = 0;
    uint64_t n_tensors_ = 0;
    uint64_t n_kv_ = 0;
    uint64_t total_values_ = 0;
    std::string ctx_ = "header";       // what is being read, for messages
    bool text_strings_ = true;         // the strings of the record being read must be valid UTF-8
    std::vector<uint64_t> elem_path_;  // indices of the array elements being read, outermost first
    std::vector<uint64_t> kv_pos_;     // byte offset of each metadata record
    std::vector<uint64_t> tensor_pos_; // byte offset of each tensor's offset field

    uint64_t size() const { return b_.size(); }
    uint64_t remaining() const { return size() - pos_; }

    std::string where() const {
        std::string w = ctx_;
        for (uint64_t i : elem_path_)
            w += " element " + std::to_string(i);
        return w;
    }

    // Every message has the shape "<file>: <record>: <field> at byte N: <problem>".
    [[noreturn]] void fail(uint64_t at, const std::string& field, const std::string& problem) const {
        throw InputError(name_ + ": " + where() + ": " + field + " at byte " + std::to_string(at) + ": " + problem);
    }

    [[noreturn]] void truncated(uint64_t at, uint64_t need, const std::string& field) const {
        fail(at, field,
             "needs " + std::to_string(need) + " bytes but the file ends at byte " + std::to_string(size()) + " (" +
                 kTruncatedHint + ")");
    }

    template <class T> T read(const char* field) {
        if (sizeof(T) > remaining()) truncated(pos_, sizeof(T), field);
        T v;
        std::memcpy(&v, b_.data() + pos_, sizeof(T)); // little-endian host assumed (x86-64, aarch64)
        pos_ += sizeof(T);
        return v;
    }

    std::string_view read_bytes(uint64_t n) {
        std::string_view s(reinterpret_cast<const char*>(b_.data() + pos_), n);
        pos_ += n;
        return s;
    }

    // A u64 length and that many bytes, with the length checked against `cap` and the file.
    // `field` is spelled out only on the error paths: this runs once per vocabulary token.
    std::string_view read_string(const char* field, uint64_t cap) {
        const uint64_t at = pos_;
        if (remaining() < 8) truncated(pos_, 8, std::string(field) + " length");
        const uint64_t len = read<uint64_t>(field);
        if (len > cap)
            fail(at, std::string(field) + " length",
                 "expected at most " + std::to_string(cap) + " bytes, found " + std::to_string(len) +
                     " (corrupt file?)");
        if (len > remaining())
            fail(at, std::string(field) + " length",
                 std::to_string(len) + " bytes, but only " + std::to_string(remaining()) +
                     " bytes follow in the file (truncated download or corrupt length?)");
        return read_bytes(len);
    }

    // ---- header -------------------------------------------------------------------------------

    void read_header() {
        if (size() == 0) throw InputError(name_ + ": " + describe_non_gguf(b_));
        static constexpr uint8_t kMagic[4] = {'G', 'G', 'U', 'F'};
        const size_t have = std::min<uint64_t>(size(), 4);
        if (std::memcmp(b_.data(), kMagic, have) != 0) bad_magic();
        if (have < 4) truncated(0, 4, "magic");
        pos_ = 4;

        const uint32_t version = read<uint32_t>("version");
        if (version != 0 && (version & 0xFFFF) == 0)
            fail(4, "version",
                 "found the bytes of version " + std::to_string(__builtin_bswap32(version)) +
                     " in big-endian order; this is a big-endian GGUF file and tern reads only little-endian "
                     "ones (convert it with a little-endian converter)");
        if (version == 1)
            fail(4, "version", "expected 2 or 3, found 1 (GGUF v1 from 2023 is not supported; re-convert the model)");
        if (version != 2 && version != 3)
            fail(4, "version",
                 "expected 2 or 3, found " + std::to_string(version) +
                     (version > 3 ? " (a newer GGUF revision than tern reads)" : " (corrupt header?)"));
        f_.version_ = version;

        const int64_t n_tensors = read<int64_t>("n_tensors");
        const int64_t n_kv = read<int64_t>("n_kv");
        if (n_tensors < 0)
            fail(8, "n_tensors", "expected a count >= 0, found " + std::to_string(n_tensors) + " (corrupt header?)");
        if (n_kv < 0) fail(16, "n_kv", "expected a count >= 0, found " + std::to_string(n_kv) + " (corrupt header?)");
        n_tensors_ = static_cast<uint64_t>(n_tensors);
        n_kv_ = static_cast<uint64_t>(n_kv);
        if (n_tensors_ > lim::kMaxTensors)
            fail(8, "n_tensors",
                 "expected at most " + std::to_string(lim::kMaxTensors) + " tensors, found " +
                     std::to_string(n_tensors_) + " (corrupt header?)");
        if (n_kv_ > lim::kMaxKeys)
            fail(16, "n_kv",
                 "expected at most " + std::to_string(lim::kMaxKeys) + " metadata keys, found " +
                     std::to_string(n_kv_) + " (corrupt header?)");
        // n_tensors is checked once the metadata has been read, where the bound is exact.
        check_count(16, "n_kv", n_kv_, kMinKvBytes, "key/value records", "the header");
        f_.kvs_.reserve(n_kv_);
        kv_pos_.reserve(n_kv_);
    }

    [[noreturn]] void bad_magic() const {
        std::string hint = describe_non_gguf(b_);
        if (!hint.empty()) throw InputError(name_ + ": " + hint);
        std::string found;
        static constexpr char kHex[] = "0123456789abcdef";
        for (size_t i = 0; i < std::min<uint64_t>(size(), 4); ++i) {
            if (i) found += ' ';
            found += kHex[b_[i] >> 4];
            found += kHex[b_[i] & 15];
        }
        throw InputError(name_ + ": not a GGUF file: expected the magic \"GGUF\" (47 47 55 46) at byte 0, found " +
                         found + " (the wrong file, or a damaged one?)");
    }

    // A count from the header, bounded by the bytes that follow so that reserve() stays small and
    // a corrupt count is reported as such.
    void check_count(uint64_t at, const char* field, uint64_t n, uint64_t min_record, const char* what,
                     const char* after) {
        if (n <= remaining() / min_record) return;
        ctx_ = "header";
        fail(at, field,
             std::to_string(n) + " " + what + " need at least " + std::to_string(min_record) +
                 " bytes each, but only " + std::to_string(remaining()) + " bytes follow " + after +
                 " (truncated download or corrupt header?)");
    }

    // ---- metadata -----------------------------------------------------------------------------

    void read_kv(uint64_t index) {
        ctx_ = "metadata key #" + std::to_string(index);
        const uint64_t at = pos_;
        kv_pos_.push_back(at);
        const std::string_view key = read_string("key", lim::kMaxKeyBytes);
        if (key.empty()) fail(at, "key", std::string("expected a non-empty key, found an empty one") + kCorruptHint);
        if (!is_valid_utf8(key))
            fail(at, "key", "expected valid UTF-8, found \"" + printable(key) + "\"" + kCorruptHint);
        ctx_ = "metadata key '" + printable(key) + "'";
        if (f_.kv_index_.count(key))
            fail(at, "key",
                 "duplicate key (first defined at byte " + std::to_string(kv_pos_[f_.kv_index_.find(key)->second]) +
                     "; a broken converter or a corrupt file?)");

        const uint64_t type_at = pos_;
        const uint32_t type = read<uint32_t>("value type");
        if (!valid_value_type(type))
            fail(type_at, "value type", "expected a type id 0..12, found " + std::to_string(type) + " (corrupt file?)");

        GgufKv kv;
        kv.key.assign(key);
        text_strings_ = !lim::holds_byte_strings(key);
        read_value(static_cast<GgufType>(type), kv.value, 0);
        f_.kv_index_.emplace(kv.key, f_.kvs_.size());
        f_.kvs_.push_back(std::move(kv));
    }

    void read_value(GgufType type, GgufValue& v, int depth) {
        v.type = type;
        switch (type) {
        case GgufType::u8:
            v.u = read<uint8_t>("u8 value");
            break;
        case GgufType::i8:
            v.i = read<int8_t>("i8 value");
            break;
        case GgufType::u16:
            v.u = read<uint16_t>("u16 value");
            break;
        case GgufType::i16:
            v.i = read<int16_t>("i16 value");
            break;
        case GgufType::u32:
            v.u = read<uint32_t>("u32 value");
            break;
        case GgufType::i32:
            v.i = read<int32_t>("i32 value");
            break;
        case GgufType::u64:
            v.u = read<uint64_t>("u64 value");
            break;
        case GgufType::i64:
            v.i = read<int64_t>("i64 value");
            break;
        case GgufType::f32:
            v.f = read<float>("f32 value");
            break;
        case GgufType::f64:
            v.f = read<double>("f64 value");
            break;
        case GgufType::boolean:
            v.u = read<uint8_t>("bool value") != 0 ? 1 : 0;
            break; // nonzero is true, as in ggml
        case GgufType::string: {
            const uint64_t at = pos_;
            const std::string_view str = read_string("string", lim::kMaxStringBytes);
            if (text_strings_ && !is_valid_utf8(str))
                fail(at, "string",
                     "expected valid UTF-8 text, found \"" + printable(str) +
                         "\" (only the vocabulary's token and merge strings may hold raw bytes; corrupt file?)");
            v.str.assign(str);
            break;
        }
        case GgufType::array:
            read_array(v, depth);
            break;
        }
    }

    void read_array(GgufValue& v, int depth) {
        if (depth + 1 > lim::kMaxArrayDepth)
            fail(pos_, "array",
                 "expected at most " + std::to_string(lim::kMaxArrayDepth) + " nested array levels" + kCorruptHint);
        const uint64_t type_at = pos_;
        const uint32_t elem_type = read<uint32_t>("array element type");
        if (!valid_value_type(elem_type))
            fail(type_at, "array element type",
                 "expected a type id 0..12, found " + std::to_string(elem_type) + " (corrupt file?)");
        v.elem_type = static_cast<GgufType>(elem_type);

        const uint64_t count_at = pos_;
        const uint64_t count = read<uint64_t>("array count");
        const uint64_t min_bytes = min_value_bytes(v.elem_type);
        if (count > remaining() / min_bytes)
            fail(count_at, "array count",
                 std::to_string(count) + " " + std::string(gguf_type_name(v.elem_type)) + " elements need at least " +
                     std::to_string(min_bytes) + " bytes each, but only " + std::to_string(remaining()) +
                     " bytes follow (truncated download or corrupt count?)");
        if (count > lim::kMaxArrayElems)
            fail(count_at, "array count",
                 "expected at most " + std::to_string(lim::kMaxArrayElems) + " elements, found " +
                     std::to_string(count) + " (more than any model's vocabulary; corrupt file?)");
        if (count > lim::kMaxTotalValues - total_values_)
            fail(count_at, "array count",
                 "the metadata would hold more than " + std::to_string(lim::kMaxTotalValues) +
                     " values in all (corrupt file?)");
        total_values_ += count;

        v.array.resize(count);
        elem_path_.push_back(0);
        for (uint64_t k = 0; k < count; ++k) {
            elem_path_.back() = k;
            read_value(v.elem_type, v.array[k], depth + 1);
        }
        elem_path_.pop_back();
    }

    void read_alignment() {
        ctx_ = "metadata key 'general.alignment'";
        const auto it = f_.kv_index_.find(std::string_view("general.alignment"));
        if (it == f_.kv_index_.end()) return; // default 32
        const GgufValue& v = f_.kvs_[it->second].value;
        const uint64_t at = kv_pos_[it->second];
        if (v.type != GgufType::u32)
            fail(at, "value", "expected type u32, found " + std::string(gguf_type_name(v.type)) + kCorruptHint);
        if (v.u == 0 || (v.u & (v.u - 1)) != 0)
            fail(at, "value", "expected a power of two, found " + std::to_string(v.u) + kCorruptHint);
        f_.alignment_ = static_cast<uint32_t>(v.u);
    }

    // ---- tensors ------------------------------------------------------------------------------

    void read_tensor_info(uint64_t index) {
        ctx_ = "tensor #" + std::to_string(index);
        const uint64_t at = pos_;
        const std::string_view name = read_string("name", lim::kMaxTensorNameBytes);
        if (name.empty()) fail(at, "name", std::string("expected a non-empty name") + kCorruptHint);
        if (!is_valid_utf8(name))
            fail(at, "name", "expected valid UTF-8, found \"" + printable(name) + "\"" + kCorruptHint);
        ctx_ = "tensor " + printable(name);
        if (f_.tensor_index_.count(name))
            fail(at, "name", "duplicate tensor name (a broken converter or a corrupt file?)");

        GgufTensor t;
        t.name.assign(name);
        const uint64_t dims_at = pos_;
        const uint32_t n_dims = read<uint32_t>("n_dims");
        if (n_dims < 1 || n_dims > lim::kMaxDims)
            fail(dims_at, "n_dims",
                 "expected 1.." + std::to_string(lim::kMaxDims) + ", found " + std::to_string(n_dims) +
                     " (ggml tensors have at most " + std::to_string(lim::kMaxDims) + " dimensions; corrupt file?)");
        t.n_dims = static_cast<int>(n_dims);
        int64_t n_elements = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            const uint64_t ne_at = pos_;
            const std::string field = "ne[" + std::to_string(d) + "]";
            const int64_t ne = read<int64_t>(field.c_str());
            if (ne <= 0)
                fail(ne_at, field,
                     "expected a dimension > 0, found " + std::to_string(ne) +
                         " (converters write no empty tensors; corrupt file?)");
            if (__builtin_mul_overflow(n_elements, ne, &n_elements))
                fail(ne_at, field,
                     "the element count of shape " + shape_so_far(t, d, ne) + " overflows 64 bits" + kCorruptHint);
            t.ne[d] = ne;
        }

        const uint64_t type_at = pos_;
        const uint32_t type_id = read<uint32_t>("type");
        const TypeInfo* info = find_type(type_id);
        if (!info)
            fail(type_at, "type", "unknown tensor format id " + std::to_string(type_id) + unknown_type_reason(type_id));
        t.type = info->type;
        if (t.ne[0] % info->block_elems != 0)
            fail(type_at, "type",
                 std::string(info->name) + " packs " + std::to_string(info->block_elems) +
                     " elements per block, but ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of it" +
                     kCorruptHint);
        // Bytes = (ne0 / block) * block_bytes * rows; each step checked, since ne can be ~2^62.
        uint64_t n_bytes = static_cast<uint64_t>(t.ne[0] / info->block_elems);
        if (__builtin_mul_overflow(n_bytes, static_cast<uint64_t>(info->block_bytes), &n_bytes) ||
            __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(t.ne[1]), &n_bytes) ||
            __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(t.ne[2]), &n_bytes) ||
            __builtin_mul_overflow(n_bytes, static_cast<uint64_t>(t.ne[3]), &n_bytes))
            fail(type_at, "type", "the byte size of shape " + t.shape_string() + " overflows 64 bits" + kCorruptHint);
        t.n_bytes = n_bytes;

        tensor_pos_.push_back(pos_);
        t.offset = read<uint64_t>("data offset");
        f_.tensor_index_.emplace(t.name, f_.tensors_.size());
        f_.tensors_.push_back(std::move(t));
    }

    static std::string shape_so_far(const GgufTensor& t, uint32_t d, int64_t ne) {
        std::string s = "[";
        for (uint32_t k = 0; k < d; ++k)
            s += std::to_string(t.ne[k]) + ", ";
        return s + std::to_string(ne) + "]";
    }

    // With every info read: the data section starts at the next multiple of the alignment, each
    // tensor must start on an aligned offset inside the file, and no two may share bytes.
    void place_tensors() {
        const uint64_t infos_end = pos_; // <= size(), so the rounding below cannot overflow
        const uint64_t align = f_.alignment_;
        const uint64_t data_start = (infos_end + align - 1) / align * align;
        f_.data_offset_ = data_start;
        if (n_tensors_ == 0) return; // vocab-only files end right after the metadata, unpadded

        ctx_ = "data section";
        if (data_start > size())
            fail(data_start, "start",
                 "expected inside the file (the tensor infos end at byte " + std::to_string(infos_end) +
                     "), but the file has " + std::to_string(size()) + " bytes (" + kTruncatedHint + ")");

        for (size_t k = 0; k < f_.tensors_.size(); ++k) {
            GgufTensor& t = f_.tensors_[k];
            ctx_ = "tensor " + printable(t.name);
            if (t.offset % align != 0)
                fail(tensor_pos_[k], "data offset",
                     "expected a multiple of the alignment " + std::to_string(align) + ", found " +
                         std::to_string(t.offset) +
                         " (a corrupt file, or general.alignment changed without moving the data?)");
            // 128-bit sums: offset and size are both up to 2^64 - 1 here.
            const unsigned __int128 start = static_cast<unsigned __int128>(data_start) + t.offset;
            const unsigned __int128 end = start + t.n_bytes;
            if (end > size()) {
                const std::string end_text = end > UINT64_MAX ? std::string("beyond byte 2^64")
                                                              : "at byte " + std::to_string(static_cast<uint64_t>(end));
                fail(tensor_pos_[k], "data offset",
                     "data (" + std::to_string(t.n_bytes) + " bytes at offset " + std::to_string(t.offset) + ") ends " +
                         end_text + " but the file has " + std::to_string(size()) + " bytes (" + kTruncatedHint + ")");
            }
            t.data = b_.data() + static_cast<uint64_t>(start);
        }

        // Any order is fine as long as no two tensors share bytes.
        std::vector<size_t> order(f_.tensors_.size());
        std::iota(order.begin(), order.end(), size_t{0});
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return f_.tensors_[a].offset < f_.tensors_[b].offset; });
        for (size_t k = 1; k < order.size(); ++k) {
            const GgufTensor& prev = f_.tensors_[order[k - 1]];
            const GgufTensor& cur = f_.tensors_[order[k]];
            if (prev.offset + prev.n_bytes > cur.offset) {
                ctx_ = "tensor " + printable(cur.name);
                fail(tensor_pos_[order[k]], "data offset",
                     "data at offset " + std::to_string(cur.offset) + " overlaps tensor " + printable(prev.name) +
                         " (data offsets " + std::to_string(prev.offset) + ".." +
                         std::to_string(prev.offset + prev.n_bytes) + "; corrupt file?)");
            }
        }
    }
};

GgufFile GgufFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
    GgufFile f;
    f.path_ = name;
    f.bytes_ = bytes;
    GgufParser(f, name).run();
    return f;
}

GgufFile GgufFile::open(const std::string& path) {
    GgufFile f;
    f.path_ = path;
    f.map_ = MappedFile::open(path);
    f.bytes_ = f.map_.bytes();
    GgufParser(f, path).run();
    return f;
}

} // namespace tern
