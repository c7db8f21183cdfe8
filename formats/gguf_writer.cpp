// GgufWriter: serialises metadata and tensor infos into memory (a few MB at most, for a large
// vocabulary), then streams tensor data to a unique temporary file beside PATH and renames it into
// place after fsync (AtomicFile). A reader therefore never sees a half-written model under PATH,
// even after a crash or a full disk.
#include "formats/gguf_writer.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>

#include "formats/atomic_file.h"
#include "base/error.h"
#include "formats/gguf_limits.h"
#include "formats/text.h"

namespace tern {

namespace lim = gguf_limits;

// GGUF is little-endian and both sides copy integers with memcpy.
static_assert(std::endian::native == std::endian::little, "the GGUF code assumes a little-endian host");

namespace {

// ---- validation: never write what GgufFile::open would refuse -----------------------------------

[[noreturn]] void bad_tensor(const std::string& name, const std::string& problem) {
    throw InputError("GGUF writer: tensor '" + printable(name) + "': " + problem);
}

void check_value(const std::string& key, const GgufValue& v, int depth) {
    const auto fail = [&](const std::string& problem) {
        throw std::invalid_argument("GGUF writer: metadata key '" + printable(key) + "': " + problem);
    };
    if (static_cast<uint32_t>(v.type) > static_cast<uint32_t>(GgufType::f64)) fail("invalid value type");
    if (v.type == GgufType::string && v.str.size() > lim::kMaxStringBytes) fail("string longer than 64 MiB");
    if (v.type == GgufType::string && !lim::holds_byte_strings(key) && !is_valid_utf8(v.str))
        fail("string is not valid UTF-8: \"" + printable(v.str) + "\"");
    if (v.type != GgufType::array) return;
    if (depth + 1 > lim::kMaxArrayDepth) fail("arrays nested deeper than 8 levels");
    if (v.array.size() > lim::kMaxArrayElems) fail("array with more than 2^24 elements");
    for (const GgufValue& e : v.array) {
        if (e.type != v.elem_type)
            fail("array of " + std::string(gguf_type_name(v.elem_type)) + " holds a " +
                 std::string(gguf_type_name(e.type)) + " element");
        check_value(key, e, depth + 1);
    }
}

void check_key(const std::string& key) {
    if (key.empty() || key.size() > lim::kMaxKeyBytes || !is_valid_utf8(key))
        throw std::invalid_argument("GGUF writer: invalid metadata key '" + printable(key) + "'");
}

// ---- serialisation -----------------------------------------------------------------------------

struct ByteSink {
    std::string out;

    template <class T> void put(T v) {
        char b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T)); // little-endian host assumed, as in the reader
        out.append(b, sizeof(T));
    }
    void put_string(std::string_view s) {
        put<uint64_t>(s.size());
        out.append(s);
    }
    void put_value(const GgufValue& v) {
        switch (v.type) {
        case GgufType::u8:
            put<uint8_t>(static_cast<uint8_t>(v.u));
            break;
        case GgufType::i8:
            put<int8_t>(static_cast<int8_t>(v.i));
            break;
        case GgufType::u16:
            put<uint16_t>(static_cast<uint16_t>(v.u));
            break;
        case GgufType::i16:
            put<int16_t>(static_cast<int16_t>(v.i));
            break;
        case GgufType::u32:
            put<uint32_t>(static_cast<uint32_t>(v.u));
            break;
        case GgufType::i32:
            put<int32_t>(static_cast<int32_t>(v.i));
            break;
        case GgufType::u64:
            put<uint64_t>(v.u);
            break;
        case GgufType::i64:
            put<int64_t>(v.i);
            break;
        case GgufType::f32:
            put<float>(static_cast<float>(v.f));
            break;
        case GgufType::f64:
            put<double>(v.f);
            break;
        case GgufType::boolean:
            put<uint8_t>(v.u ? 1 : 0);
            break;
        case GgufType::string:
            put_string(v.str);
            break;
        case GgufType::array:
            put<uint32_t>(static_cast<uint32_t>(v.elem_type));
            put<uint64_t>(v.array.size());
            for (const GgufValue& e : v.array)
                put_value(e);
            break;
        }
    }
};

uint64_t align_up(uint64_t n, uint64_t align) {
    return (n + align - 1) / align * align;
}

uint64_t tensor_bytes(GgmlType type, const std::vector<int64_t>& ne) {
    const TypeInfo& ti = type_info(type);
    uint64_t n = static_cast<uint64_t>(ne[0] / ti.block_elems);
    bool overflow = __builtin_mul_overflow(n, static_cast<uint64_t>(ti.block_bytes), &n);
    for (size_t d = 1; d < ne.size(); ++d)
        overflow |= __builtin_mul_overflow(n, static_cast<uint64_t>(ne[d]), &n);
    return overflow ? UINT64_MAX : n;
}

} // namespace

void GgufWriter::set(const std::string& key, GgufValue value) {
    check_key(key);
    for (GgufKv& kv : kvs_)
        if (kv.key == key) {
            kv.value = std::move(value);
            return;
        }
    kvs_.push_back({key, std::move(value)});
}

void GgufWriter::remove(const std::string& key) {
    std::erase_if(kvs_, [&](const GgufKv& kv) { return kv.key == key; });
}

void GgufWriter::copy_metadata_from(const GgufFile& file) {
    for (const GgufKv& kv : file.metadata())
        set(kv.key, kv.value);
}

void GgufWriter::add_tensor(const std::string& name, GgmlType type, std::vector<int64_t> ne,
                            std::span<const uint8_t> data) {
    if (name.empty() || name.size() > lim::kMaxTensorNameBytes)
        bad_tensor(name, "expected a name of 1.." + std::to_string(lim::kMaxTensorNameBytes) + " bytes, found " +
                             std::to_string(name.size()));
    if (!is_valid_utf8(name)) bad_tensor(name, "the name is not valid UTF-8");
    for (const PendingTensor& t : tensors_)
        if (t.name == name) bad_tensor(name, "duplicate tensor name");
    if (ne.empty() || ne.size() > static_cast<size_t>(lim::kMaxDims))
        bad_tensor(name, "expected 1..4 dimensions, found " + std::to_string(ne.size()));
    int64_t n_elements = 1;
    for (int64_t n : ne) {
        if (n <= 0) bad_tensor(name, "expected dimensions > 0, found " + std::to_string(n));
        if (__builtin_mul_overflow(n_elements, n, &n_elements)) bad_tensor(name, "element count overflows 64 bits");
    }
    const TypeInfo* ti = find_type(static_cast<uint32_t>(type));
    if (!ti) bad_tensor(name, "unknown tensor format id " + std::to_string(static_cast<uint32_t>(type)));
    if (ne[0] % ti->block_elems != 0)
        bad_tensor(name, std::string(ti->name) + " needs ne[0] to be a multiple of " + std::to_string(ti->block_elems) +
                             ", found " + std::to_string(ne[0]));
    const uint64_t n_bytes = tensor_bytes(type, ne);
    if (n_bytes == UINT64_MAX) bad_tensor(name, "byte size overflows 64 bits");
    if (!data.empty() && data.size() != n_bytes)
        bad_tensor(name, "expected " + std::to_string(n_bytes) + " bytes of data, got " + std::to_string(data.size()));
    tensors_.push_back({name, type, std::move(ne), data});
}

void GgufWriter::write(const std::string& path, const FillFn& fill, uint32_t alignment) const {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
        throw std::invalid_argument("GGUF writer: alignment must be a power of two, got " + std::to_string(alignment));
    for (const PendingTensor& t : tensors_)
        if (t.data.empty() && !fill)
            throw std::invalid_argument("GGUF writer: tensor '" + t.name + "' has no data and no fill callback");

    // general.alignment always matches the layout actually written.
    std::vector<GgufKv> kvs = kvs_;
    bool have_alignment = false;
    for (GgufKv& kv : kvs)
        if (kv.key == "general.alignment") {
            kv.value = GgufValue::make_u32(alignment);
            have_alignment = true;
        }
    if (!have_alignment && alignment != lim::kDefaultAlignment)
        kvs.push_back({"general.alignment", GgufValue::make_u32(alignment)});
    for (const GgufKv& kv : kvs) {
        check_key(kv.key);
        check_value(kv.key, kv.value, 0);
    }
    if (kvs.size() > lim::kMaxKeys)
        throw std::invalid_argument("GGUF writer: " + std::to_string(kvs.size()) + " metadata keys, more than the " +
                                    std::to_string(lim::kMaxKeys) + " the reader accepts");
    if (tensors_.size() > lim::kMaxTensors)
        throw std::invalid_argument("GGUF writer: " + std::to_string(tensors_.size()) + " tensors, more than the " +
                                    std::to_string(lim::kMaxTensors) + " the reader accepts");

    ByteSink head;
    head.out.append("GGUF", 4);
    head.put<uint32_t>(3);
    head.put<int64_t>(static_cast<int64_t>(tensors_.size()));
    head.put<int64_t>(static_cast<int64_t>(kvs.size()));
    for (const GgufKv& kv : kvs) {
        head.put_string(kv.key);
        head.put<uint32_t>(static_cast<uint32_t>(kv.value.type));
        head.put_value(kv.value);
    }
    // Tensors are packed in declaration order, each padded to the alignment.
    std::vector<uint64_t> sizes(tensors_.size());
    uint64_t offset = 0;
    for (size_t k = 0; k < tensors_.size(); ++k) {
        const PendingTensor& t = tensors_[k];
        sizes[k] = tensor_bytes(t.type, t.ne);
        head.put_string(t.name);
        head.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
        for (int64_t n : t.ne)
            head.put<int64_t>(n);
        head.put<uint32_t>(static_cast<uint32_t>(t.type));
        head.put<uint64_t>(offset);
        offset = align_up(offset + sizes[k], alignment);
    }

    // A unique temporary file beside PATH, renamed over it at the end (formats/atomic_file.h).
    AtomicFile out(path);
    std::string t_name;
    const auto stopped = [&](const std::string& why) {
        throw RuntimeFailure(printable(path, 4096) + ": stopped writing at tensor '" + printable(t_name) + "': " + why);
    };
    out.write(head.out.data(), head.out.size());
    out.write_zeros(align_up(out.written(), alignment) - out.written());
    std::vector<uint8_t> buffer;
    for (size_t k = 0; k < tensors_.size(); ++k) {
        const PendingTensor& t = tensors_[k];
        t_name = t.name;
        if (!t.data.empty()) {
            out.write(t.data.data(), t.data.size());
        } else {
            buffer.assign(sizes[k], 0); // zeroed, so bytes a callback leaves alone are deterministic
            try {
                fill(k, std::span<uint8_t>(buffer));
            } catch (const TernError&) {
                throw; // keeps its exit code (e.g. bad input found while quantizing)
            } catch (const std::bad_alloc&) {
                throw;
            } catch (const std::exception& e) {
                stopped(e.what());
            } catch (...) {
                stopped("unknown error");
            }
            out.write(buffer.data(), buffer.size());
        }
        out.write_zeros(align_up(sizes[k], alignment) - sizes[k]);
    }
    out.commit();
}

} // namespace tern
