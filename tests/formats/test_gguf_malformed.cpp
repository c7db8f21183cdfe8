// A generated corpus of broken and wrong files. Each case is built from a small valid GGUF (whose
// every field offset is recorded) by one mutation: truncation, an inflated count or length, a bad
// type, a bad shape or offset, invalid UTF-8, a duplicate, a bad alignment; plus the files people
// pass by mistake (HTML page, git-LFS pointer, GGJT, zeros, empty, directory, missing).
// For every case GgufFile::open must throw InputError with exactly one line that names the file,
// and `tern info FILE` must exit 2 with exactly one line on stderr. Never a crash.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/gguf.h"
#include "formats/gguf_limits.h"
#include "formats/gguf_writer.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace tern;

namespace {

using Bytes = std::vector<uint8_t>;

struct TensorSpec {
    std::string name;
    uint32_t type;
    std::vector<int64_t> ne;
};

// A GGUF image plus the byte offset of every field, by name ("n_kv", "kv2.count", "t1.ne0", ...).
struct Image {
    Bytes bytes;
    std::map<std::string, size_t> at;
    uint64_t data_start = 0;
    uint64_t data_end = 0; // end of the last tensor's bytes (the trailing pad is not needed)
};

class Builder {
public:
    template <class T> void put(T v, const std::string& field = "") {
        if (!field.empty()) img.at[field] = img.bytes.size();
        uint8_t b[sizeof(T)];
        std::memcpy(b, &v, sizeof(T));
        img.bytes.insert(img.bytes.end(), b, b + sizeof(T));
    }
    void put_string(const std::string& s, const std::string& field) {
        put<uint64_t>(s.size(), field + ".len");
        img.at[field + ".bytes"] = img.bytes.size();
        img.bytes.insert(img.bytes.end(), s.begin(), s.end());
    }
    void put_value(const GgufValue& v, const std::string& field) {
        img.at[field] = img.bytes.size();
        switch (v.type) {
        case GgufType::u8:
            put<uint8_t>(uint8_t(v.u));
            break;
        case GgufType::i8:
            put<int8_t>(int8_t(v.i));
            break;
        case GgufType::u16:
            put<uint16_t>(uint16_t(v.u));
            break;
        case GgufType::i16:
            put<int16_t>(int16_t(v.i));
            break;
        case GgufType::u32:
            put<uint32_t>(uint32_t(v.u));
            break;
        case GgufType::i32:
            put<int32_t>(int32_t(v.i));
            break;
        case GgufType::u64:
            put<uint64_t>(v.u);
            break;
        case GgufType::i64:
            put<int64_t>(v.i);
            break;
        case GgufType::f32:
            put<float>(float(v.f));
            break;
        case GgufType::f64:
            put<double>(v.f);
            break;
        case GgufType::boolean:
            put<uint8_t>(v.u ? 1 : 0);
            break;
        case GgufType::string:
            put_string(v.str, field);
            break;
        case GgufType::array:
            put<uint32_t>(uint32_t(v.elem_type), field + ".elem_type");
            put<uint64_t>(v.array.size(), field + ".count");
            for (size_t k = 0; k < v.array.size(); ++k)
                put_value(v.array[k], field + ".e" + std::to_string(k));
            break;
        }
    }
    Image img;
};

uint64_t tensor_bytes(const TensorSpec& t) {
    const TypeInfo& ti = type_info(static_cast<GgmlType>(t.type));
    uint64_t n = uint64_t(t.ne[0] / ti.block_elems) * ti.block_bytes;
    for (size_t d = 1; d < t.ne.size(); ++d)
        n *= uint64_t(t.ne[d]);
    return n;
}

Image build(const std::vector<GgufKv>& kvs, const std::vector<TensorSpec>& tensors, uint32_t alignment = 32) {
    Builder b;
    b.img.bytes = {'G', 'G', 'U', 'F'};
    b.put<uint32_t>(3, "version");
    b.put<int64_t>(int64_t(tensors.size()), "n_tensors");
    b.put<int64_t>(int64_t(kvs.size()), "n_kv");
    for (size_t k = 0; k < kvs.size(); ++k) {
        const std::string f = "kv" + std::to_string(k);
        b.put_string(kvs[k].key, f + ".key");
        b.put<uint32_t>(uint32_t(kvs[k].value.type), f + ".type");
        b.put_value(kvs[k].value, f + ".value");
    }
    uint64_t offset = 0;
    for (size_t k = 0; k < tensors.size(); ++k) {
        const std::string f = "t" + std::to_string(k);
        b.put_string(tensors[k].name, f + ".name");
        b.put<uint32_t>(uint32_t(tensors[k].ne.size()), f + ".n_dims");
        for (size_t d = 0; d < tensors[k].ne.size(); ++d)
            b.put<int64_t>(tensors[k].ne[d], f + ".ne" + std::to_string(d));
        b.put<uint32_t>(tensors[k].type, f + ".type");
        b.put<uint64_t>(offset, f + ".offset");
        offset = (offset + tensor_bytes(tensors[k]) + alignment - 1) / alignment * alignment;
    }
    Image& img = b.img;
    img.at["infos_end"] = img.bytes.size();
    img.data_start = (img.bytes.size() + alignment - 1) / alignment * alignment;
    img.bytes.resize(img.data_start, 0);
    img.at["data"] = img.data_start;
    for (size_t k = 0; k < tensors.size(); ++k) {
        const uint64_t n = tensor_bytes(tensors[k]);
        img.at["t" + std::to_string(k) + ".data"] = img.bytes.size();
        for (uint64_t i = 0; i < n; ++i)
            img.bytes.push_back(uint8_t(0x11 + k * 13 + i));
        img.data_end = img.bytes.size();
        img.bytes.resize((img.bytes.size() + alignment - 1) / alignment * alignment, 0);
    }
    return img;
}

std::vector<GgufKv> base_kvs() {
    return {
        {"general.architecture", GgufValue::make_string("llama")},
        {"general.alignment", GgufValue::make_u32(32)},
        {"tokenizer.ggml.tokens", GgufValue::make_string_array({"<unk>", "<s>", "hello"})},
        {"tokenizer.ggml.scores", GgufValue::make_f32_array({0.f, -1.f, -2.f})},
        {"t.nested",
         GgufValue::make_array(GgufType::array, {GgufValue::make_i32_array({1, 2}), GgufValue::make_i32_array({3})})},
        {"t.u64", GgufValue::make_u64(42)},
    };
}

std::vector<TensorSpec> base_tensors() {
    return {
        {"norm.weight", 0, {8}},             // F32, 32 bytes
        {"blk.0.attn_q.weight", 2, {32, 2}}, // Q4_0, 36 bytes: padded to 64
        {"blk.0.ffn_up.weight", 1, {4, 2}},  // F16, 16 bytes
    };
}

template <class T> Bytes poke(Bytes b, size_t at, T v) {
    std::memcpy(b.data() + at, &v, sizeof(T));
    return b;
}

Bytes truncate(const Bytes& b, size_t n) {
    return Bytes(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(n));
}

Bytes text(const std::string& s) {
    return Bytes(s.begin(), s.end());
}

struct Case {
    std::string name;
    Bytes bytes;
    std::string expect; // a substring the message must contain ("" for none)
};

std::vector<Case> corpus() {
    const Image base = build(base_kvs(), base_tensors());
    const Bytes& B = base.bytes;
    const auto& at = base.at;
    std::vector<Case> cases;
    const auto add = [&](std::string name, Bytes bytes, std::string expect = "") {
        cases.push_back({std::move(name), std::move(bytes), std::move(expect)});
    };

    // ---- truncation inside each section --------------------------------------------------------
    for (const auto& [field, off] : at) {
        if (off >= base.data_end) continue;
        for (size_t extra : {0, 1, 3}) {
            const size_t n = off + extra;
            if (n == 0 || n >= base.data_end) continue;
            add("trunc-" + field + "+" + std::to_string(extra), truncate(B, n), "truncated download");
        }
    }
    add("trunc-last-byte", truncate(B, base.data_end - 1), "truncated download");
    add("trunc-2-bytes", truncate(B, 2), "truncated download");

    // ---- inflated counts and lengths ---------------------------------------------------------
    const int64_t big_counts[] = {int64_t(1) << 40, INT64_MAX, -1, INT64_MIN};
    for (int64_t v : big_counts) {
        add("n_tensors=" + std::to_string(v), poke(B, at.at("n_tensors"), v), "n_tensors");
        add("n_kv=" + std::to_string(v), poke(B, at.at("n_kv"), v), "n_kv");
    }
    // Counts over the caps of formats/gguf_limits.h are refused before the bytes-left check, with
    // the cap in the message (a 9 MB file of minimal records could hold them all).
    add("n_tensors over the cap", poke<int64_t>(B, at.at("n_tensors"), int64_t(gguf_limits::kMaxTensors + 1)),
        "at most " + std::to_string(gguf_limits::kMaxTensors) + " tensors");
    add("n_kv over the cap", poke<int64_t>(B, at.at("n_kv"), int64_t(gguf_limits::kMaxKeys + 1)),
        "at most " + std::to_string(gguf_limits::kMaxKeys) + " metadata keys");
    add("n_kv+1", poke<int64_t>(B, at.at("n_kv"), int64_t(base_kvs().size() + 1)));
    add("n_tensors+1", poke<int64_t>(B, at.at("n_tensors"), int64_t(base_tensors().size() + 1)));
    for (const auto& [field, off] : at) {
        const bool is_len = field.ends_with(".len");
        const bool is_count = field.ends_with(".count");
        if (!is_len && !is_count) continue;
        const uint64_t current = [&] {
            uint64_t v;
            std::memcpy(&v, B.data() + off, 8);
            return v;
        }();
        for (uint64_t v : {current + 1, current + 1000, uint64_t(1) << 32, uint64_t(1) << 62, UINT64_MAX})
            add(field + "=" + std::to_string(v), poke(B, off, v));
    }
    for (uint32_t v : {0u, 5u, 1000u, UINT32_MAX})
        add("t1.n_dims=" + std::to_string(v), poke(B, at.at("t1.n_dims"), v), "n_dims");

    // ---- bad value types and tensor types ----------------------------------------------------
    for (uint32_t v : {13u, 100u, UINT32_MAX}) {
        add("kv0.type=" + std::to_string(v), poke(B, at.at("kv0.type"), v), "value type");
        add("kv2.elem_type=" + std::to_string(v), poke(B, at.at("kv2.value.elem_type"), v), "element type");
        add("kv4.inner_elem_type=" + std::to_string(v), poke(B, at.at("kv4.value.e0.elem_type"), v), "element type");
    }
    for (uint32_t v : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 999u, 1001u, UINT32_MAX})
        add("t0.type=" + std::to_string(v), poke(B, at.at("t0.type"), v), "unknown tensor format");
    add("t1.type=q4_K (ne0 32 not a multiple of 256)", poke<uint32_t>(B, at.at("t1.type"), 12), "multiple");
    add("t0.type=mxfp4 (ne0 8 not a multiple of 32)", poke<uint32_t>(B, at.at("t0.type"), 39), "multiple");
    add("t0.type=q8_0 (ne0 8 not a multiple of 32)", poke<uint32_t>(B, at.at("t0.type"), 8), "multiple");

    // ---- shapes ------------------------------------------------------------------------------
    for (int64_t v : {int64_t(0), int64_t(-1), INT64_MIN}) {
        add("t0.ne0=" + std::to_string(v), poke(B, at.at("t0.ne0"), v), "ne[0]");
        add("t0.ne0=" + std::to_string(v) + " hint", poke(B, at.at("t0.ne0"), v), "no empty tensors; corrupt file?)");
        add("t1.ne1=" + std::to_string(v), poke(B, at.at("t1.ne1"), v), "ne[1]");
    }
    add("t1.ne=2^62x2^62", poke(poke(B, at.at("t1.ne0"), int64_t(1) << 62), at.at("t1.ne1"), int64_t(1) << 62),
        "overflows 64 bits (corrupt file?)");
    add("t1.ne0=2^62 (bytes overflow)", poke(B, at.at("t1.ne0"), int64_t(1) << 62), "");
    add("t1.ne1=2^40 (data past EOF)", poke(B, at.at("t1.ne1"), int64_t(1) << 40), "truncated download");
    add("t2.ne0=2^61 f16 (bytes overflow)", poke(B, at.at("t2.ne0"), int64_t(1) << 61), "");

    // ---- offsets -----------------------------------------------------------------------------
    const uint64_t t1_off = [&] {
        uint64_t v;
        std::memcpy(&v, B.data() + at.at("t1.offset"), 8);
        return v;
    }();
    add("t1.offset misaligned +1", poke(B, at.at("t1.offset"), t1_off + 1), "general.alignment changed");
    add("t1.offset misaligned +16", poke(B, at.at("t1.offset"), t1_off + 16), "alignment");
    add("t1.offset overlaps t0", poke<uint64_t>(B, at.at("t1.offset"), 0), "overlaps");
    add("t2.offset overlaps t1", poke(B, at.at("t2.offset"), t1_off), "overlaps");
    add("t2.offset past EOF", poke<uint64_t>(B, at.at("t2.offset"), 1 << 20), "truncated download");
    add("t2.offset 2^63", poke<uint64_t>(B, at.at("t2.offset"), uint64_t(1) << 63), "truncated download");
    add("t2.offset max aligned", poke<uint64_t>(B, at.at("t2.offset"), UINT64_MAX & ~uint64_t(31)), "");
    add("tensor data past EOF", truncate(B, base.data_end - 5), "truncated download");

    // ---- text --------------------------------------------------------------------------------
    {
        Bytes b = B;
        b[at.at("kv0.key.bytes") + 2] = 0xFF;
        add("key with byte 0xFF", b, "UTF-8");
        b = B;
        b[at.at("kv0.key.bytes")] = 0xC0; // overlong encoding of '/'
        b[at.at("kv0.key.bytes") + 1] = 0xAF;
        add("key with overlong UTF-8", b, "UTF-8");
        b = B;
        b[at.at("kv0.key.bytes")] = 0xED; // U+D800, a surrogate
        b[at.at("kv0.key.bytes") + 1] = 0xA0;
        b[at.at("kv0.key.bytes") + 2] = 0x80;
        add("key with a surrogate", b, "UTF-8");
        b = B;
        b[at.at("t1.name.bytes") + 1] = 0x80;
        add("tensor name with a stray continuation byte", b, "UTF-8");
        b = B;
        b[at.at("kv1.key.bytes") + 3] = '\n'; // valid UTF-8, but must not break the message
        b[at.at("kv1.key.bytes") + 4] = '\r';
        b = poke<uint32_t>(b, at.at("kv1.type"), 77);
        add("key with a newline, then a bad type", b, "value type");
    }

    // ---- structural rules via the builder ------------------------------------------------------
    {
        auto kvs = base_kvs();
        kvs[5].key = "t.nested";
        add("duplicate key", build(kvs, base_tensors()).bytes, "duplicate key");
        auto ts = base_tensors();
        ts[2].name = ts[0].name;
        add("duplicate tensor name", build(base_kvs(), ts).bytes, "duplicate tensor name");
        ts = base_tensors();
        ts[1].name = std::string(64, 'n');
        add("tensor name of 64 bytes", build(base_kvs(), ts).bytes, "at most 63");
        ts[1].name = "";
        add("empty tensor name", build(base_kvs(), ts).bytes, "non-empty");
        kvs = base_kvs();
        kvs[3].key = "";
        add("empty key", build(kvs, base_tensors()).bytes, "non-empty");
        ts = base_tensors();
        ts[0].ne = {2, 2, 2, 1, 1};
        add("5 dims", build(base_kvs(), ts).bytes, "at most 4 dimensions; corrupt file?)");
        for (const GgufValue& v : {GgufValue::make_i32(32), GgufValue::make_u64(32), GgufValue::make_string("32"),
                                   GgufValue::make_u16(32), GgufValue::make_f32(32.f)}) {
            kvs = base_kvs();
            kvs[1].value = v;
            add("alignment as " + std::string(gguf_type_name(v.type)), build(kvs, base_tensors()).bytes,
                "expected type u32");
        }
        for (uint32_t a : {0u, 3u, 48u, 0x80000001u, UINT32_MAX}) {
            kvs = base_kvs();
            kvs[1].value = GgufValue::make_u32(a);
            add("alignment " + std::to_string(a), build(kvs, base_tensors()).bytes, "power of two");
        }
        // Alignment 64 declared, but data laid out for 32.
        kvs = base_kvs();
        Image img = build(kvs, base_tensors());
        add("alignment 64 over a 32 layout", poke<uint32_t>(img.bytes, img.at.at("kv1.value"), 64), "");
        // Nesting deeper than 8 levels.
        GgufValue deep = GgufValue::make_i32_array({1});
        for (int d = 0; d < 9; ++d)
            deep = GgufValue::make_array(GgufType::array, {deep});
        kvs = base_kvs();
        kvs.push_back({"t.deep", deep});
        add("arrays nested 10 deep", build(kvs, base_tensors()).bytes, "nested");
    }

    // ---- header ------------------------------------------------------------------------------
    add("version 1", poke<uint32_t>(B, 4, 1), "version");
    add("version 0", poke<uint32_t>(B, 4, 0), "version");
    add("version 4", poke<uint32_t>(B, 4, 4), "version");
    add("big-endian v3", poke<uint32_t>(B, 4, 0x03000000), "big-endian");
    add("big-endian v2", poke<uint32_t>(B, 4, 0x02000000), "big-endian");
    add("magic only", text("GGUF"), "truncated download");
    add("magic GGUG", poke<uint8_t>(B, 3, 'G'), "not a GGUF file");
    add("lowercase magic", poke<uint32_t>(B, 0, 0x66756767), "not a GGUF file");

    // ---- the wrong files people pass ---------------------------------------------------------
    add("html doctype", text("  \n\t<!DOCTYPE html>\n<html><head><title>Hugging Face</title></head></html>\n"), "HTML");
    add("html tag", text("<html lang=\"en\">\n<body>404</body></html>"), "HTML");
    add("html uppercase", text("\r\n<HTML><BODY>Not Found</BODY></HTML>"), "HTML");
    add("git-lfs pointer",
        text("version https://git-lfs.github.com/spec/v1\noid sha256:"
             "4d7e2f4e1c7bbf7a44ba8cd5a2b7f1b4f1f0a1b4f1f0a1b4f1f0a1b4f1f0a1b4\nsize 253113024\n"),
        "git-LFS");
    Bytes ggjt = text("tjgg");
    ggjt.resize(512, 1);
    add("ggjt", ggjt, "GGJT");
    Bytes ggml = text("lmgg");
    ggml.resize(512, 2);
    add("ggml", ggml, "GGML");
    Bytes ggmf = text("fmgg");
    ggmf.resize(512, 3);
    add("ggmf", ggmf, "GGMF");
    add("zero-filled", Bytes(4096, 0), "zero bytes");
    add("zero-filled 2 MiB", Bytes(2 << 20, 0), "zero bytes");
    add("empty", Bytes{}, "empty");
    add("one byte", Bytes{'G'}, "truncated download");
    add("random text", text("hello, world\n"), "not a GGUF file");
    add(
        "safetensors-like",
        [] {
            Bytes b(8, 0);
            b[0] = 20;
            const std::string json = "{\"__metadata__\":{}}";
            b.insert(b.end(), json.begin(), json.end());
            return b;
        }(),
        "safetensors");
    // ---- a real file cut short: the usual interrupted download ---------------------------------
    const fs::path real = test::shared_path("models/synth/synth-k256-q4_0.gguf");
    if (fs::exists(real)) {
        const std::string r = test::read_file(real);
        const Bytes rb(r.begin(), r.end());
        // Inside the header, the token array (from 0x2C0), the tensor infos (0x2C89..12619), the
        // first tensor's data, and one byte short of the end.
        for (size_t n : {size_t(20), size_t(400), size_t(700), size_t(5000), size_t(0x2C89 + 5), size_t(12619),
                         size_t(12640 + 100), rb.size() / 2, rb.size() - 1})
            add("real file cut at " + std::to_string(n), truncate(rb, n), "truncated download");
    }
    return cases;
}

int count_lines(const std::string& s) {
    int n = 0;
    for (char c : s)
        n += c == '\n';
    return n;
}

// One line, naming the file, never empty.
void check_message(const std::string& m, const std::string& file) {
    CHECK(!m.empty());
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.find('\r') == std::string::npos);
    CHECK(m.find(file) != std::string::npos);
}

std::string open_error(const std::string& path) {
    try {
        GgufFile::open(path);
    } catch (const InputError& e) {
        return e.what();
    } catch (const std::exception& e) {
        FAIL_CHECK("not an InputError: " << e.what());
        return "";
    }
    FAIL_CHECK("no exception");
    return "";
}

bool cli_ready() {
    // `tern info` reports bad files once the lead's cmd_info.cpp calls GgufFile::open; before that
    // it echoes the path and exits 0.
    if (!fs::exists(TERN_BIN)) return false;
    test::TempDir dir;
    test::write_file(dir / "probe.gguf", "");
    return test::run_tern({"info", (dir / "probe.gguf").string()}).exit_code != 0;
}

void check_cli(const std::string& path, const std::string& file) {
    const test::CommandResult r = test::run_tern({"info", path});
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(count_lines(r.err) == 1);
    CHECK(r.err.find(file) != std::string::npos);
    CHECK(r.out.empty());
}

} // namespace

TEST_CASE("the base image is valid and matches what GgufWriter writes") {
    const Image base = build(base_kvs(), base_tensors());
    const GgufFile f = GgufFile::parse(base.bytes, "base.gguf");
    CHECK(f.tensors().size() == 3);
    CHECK(f.metadata().size() == 6);
    CHECK(f.data_offset() == base.data_start);
    CHECK(f.tensors()[1].data == base.bytes.data() + base.at.at("t1.data"));
    // The same content through GgufWriter gives the same bytes (the corpus really starts from
    // what tern writes).
    test::TempDir dir;
    GgufWriter w;
    for (const GgufKv& kv : base_kvs())
        w.set(kv.key, kv.value);
    const std::vector<TensorSpec> tensors = base_tensors();
    for (size_t k = 0; k < tensors.size(); ++k) {
        const TensorSpec& t = tensors[k];
        const uint8_t* p = base.bytes.data() + base.at.at("t" + std::to_string(k) + ".data");
        w.add_tensor(t.name, static_cast<GgmlType>(t.type), t.ne, {p, tensor_bytes(t)});
    }
    w.write((dir / "w.gguf").string());
    const std::string written = test::read_file(dir / "w.gguf");
    CHECK(written == std::string(base.bytes.begin(), base.bytes.end()));
    // Trailing padding is optional for readers.
    CHECK_NOTHROW(GgufFile::parse(std::span(base.bytes).first(base.data_end), "nopad.gguf"));
}

TEST_CASE("accepted variations: GGUF v2, tensors in any aligned non-overlapping order, no alignment key") {
    const Image base = build(base_kvs(), base_tensors());
    const GgufFile v2 = GgufFile::parse(poke<uint32_t>(base.bytes, base.at.at("version"), 2), "v2.gguf");
    CHECK(v2.version() == 2);
    CHECK(v2.tensors().size() == 3);

    // t2 first, then a gap, t1, and t0 last: out of info order but aligned and disjoint.
    Bytes shuffled = poke<uint64_t>(base.bytes, base.at.at("t0.offset"), 96);
    shuffled = poke<uint64_t>(shuffled, base.at.at("t2.offset"), 0);
    const GgufFile f = GgufFile::parse(shuffled, "shuffled.gguf");
    CHECK(f.tensors()[0].offset == 96);
    CHECK(f.tensors()[2].offset == 0);
    CHECK(f.tensors()[0].data == shuffled.data() + base.data_start + 96);

    std::vector<GgufKv> kvs = base_kvs();
    kvs.erase(kvs.begin() + 1); // general.alignment: the default is 32
    const Image no_key = build(kvs, base_tensors());
    CHECK(GgufFile::parse(no_key.bytes, "default.gguf").alignment() == 32);

    // A bool stored as 2 reads as true, as ggml does.
    kvs = base_kvs();
    kvs.push_back({"t.bool", GgufValue::make_bool(true)});
    Image with_bool = build(kvs, base_tensors());
    with_bool.bytes[with_bool.at.at("kv6.value")] = 2;
    CHECK(GgufFile::parse(with_bool.bytes, "bool.gguf").get_bool("t.bool"));

    // Vocabulary tokens and merges may hold raw bytes and partial UTF-8 (byte-level vocabularies do).
    kvs = base_kvs();
    kvs[2].value = GgufValue::make_string_array({"<unk>", std::string("\xff", 1), std::string("\xe4\xbd", 2)});
    kvs.push_back({"tokenizer.ggml.merges", GgufValue::make_string_array({std::string("\xe4 \xbd", 3)})});
    const GgufFile raw = GgufFile::parse(build(kvs, base_tensors()).bytes, "raw.gguf");
    CHECK(raw.get_string_array("tokenizer.ggml.tokens")[1] == "\xff");
    CHECK(raw.get_string_array("tokenizer.ggml.merges")[0] == "\xe4 \xbd");
}

TEST_CASE("metadata strings other than tokens and merges must be valid UTF-8: the key named, the bytes escaped") {
    struct Bad {
        std::string key;
        GgufValue value;
        std::string shown; // the escaped bytes in the message
    };
    const std::vector<Bad> bad = {
        {"tokenizer.ggml.model", GgufValue::make_string(std::string("ll\xffma", 5)), "ll\\xffma"},
        {"general.name", GgufValue::make_string(std::string("a\xc0\xaf" "b", 4)), "a\\xc0\\xafb"},
        {"tokenizer.chat_template", GgufValue::make_string(std::string("{{\xed\xa0\x80}}", 7)), "{{\\xed\\xa0\\x80}}"},
        {"general.tags", GgufValue::make_string_array({"ok", std::string("x\x80", 2)}), "x\\x80"},
        {"tokenizer.ggml.added_tokens", GgufValue::make_string_array({std::string("\xfe", 1)}), "\\xfe"},
    };
    for (const Bad& b : bad) {
        CAPTURE(b.key);
        std::vector<GgufKv> kvs = base_kvs();
        kvs.push_back({b.key, b.value});
        const Bytes bytes = build(kvs, base_tensors()).bytes;
        try {
            GgufFile::parse(bytes, "text.gguf");
            FAIL_CHECK("no exception");
        } catch (const InputError& e) {
            const std::string m = e.what();
            CAPTURE(m);
            check_message(m, "text.gguf");
            CHECK(m.find("metadata key '" + b.key + "'") != std::string::npos);
            CHECK(m.find("UTF-8") != std::string::npos);
            CHECK(m.find(b.shown) != std::string::npos);
        }
    }
}

TEST_CASE("every shared model and vocabulary file still opens (their metadata strings are valid UTF-8)") {
    if (!test::shared_available()) return;
    int n = 0;
    for (const char* sub : {"models/gguf", "models/synth", "models/vocab"})
        for (const auto& e : fs::directory_iterator(test::shared_path(sub))) {
            if (e.path().extension() != ".gguf") continue;
            CAPTURE(e.path());
            CHECK_NOTHROW(GgufFile::open(e.path().string()));
            ++n;
        }
    CHECK(n > 40);
}

TEST_CASE("every truncation of a valid file is an InputError") {
    const Image base = build(base_kvs(), base_tensors());
    for (size_t n = 0; n < base.data_end; ++n) {
        CAPTURE(n);
        try {
            GgufFile::parse(std::span(base.bytes).first(n), "cut.gguf");
            FAIL_CHECK("no exception");
        } catch (const InputError& e) {
            check_message(e.what(), "cut.gguf");
        }
    }
}

TEST_CASE("random byte mutations never crash: the file parses or gives a one-line InputError") {
    const Image base = build(base_kvs(), base_tensors());
    std::mt19937_64 rng(20260522);
    // TERN_FUZZ_ITERS=1000000 for a longer soak (under ASan/UBSan, say).
    const char* env = std::getenv("TERN_FUZZ_ITERS");
    const int iters = env ? std::max(1, std::atoi(env)) : 20000;
    int rejected = 0;
    for (int iter = 0; iter < iters; ++iter) {
        Bytes b = base.bytes;
        // Mostly the header and infos, where the structure is; sometimes anywhere.
        const size_t span = iter % 4 == 0 ? b.size() : base.data_start;
        const int n_mut = 1 + static_cast<int>(rng() % 4);
        for (int m = 0; m < n_mut; ++m) {
            const size_t at = rng() % span;
            switch (rng() % 4) {
            case 0:
                b[at] = static_cast<uint8_t>(rng());
                break;
            case 1:
                b[at] ^= static_cast<uint8_t>(1u << (rng() % 8));
                break;
            case 2: // an extreme 8-byte value where a length or count may be
                if (at + 8 <= b.size()) {
                    const uint64_t extremes[] = {0, 1, UINT64_MAX, uint64_t(1) << 63, uint64_t(1) << 32, 0xFFFFFFFF};
                    const uint64_t v = extremes[rng() % 6];
                    std::memcpy(b.data() + at, &v, 8);
                }
                break;
            default:
                b.resize(at);
                break;
            }
            if (b.empty()) break;
        }
        try {
            GgufFile::parse(b, "fuzz.gguf");
        } catch (const InputError& e) {
            ++rejected;
            const std::string m = e.what();
            if (m.find('\n') != std::string::npos || m.find("fuzz.gguf") != 0) {
                CAPTURE(iter);
                FAIL_CHECK(m);
            }
        }
    }
    MESSAGE(rejected << " of " << iters << " mutated files rejected");
    CHECK(rejected > iters / 2);
}

TEST_CASE("generated corpus: one-line InputError naming the file, and `tern info` exits 2") {
    const std::vector<Case> cases = corpus();
    REQUIRE(cases.size() > 150);
    const bool cli = cli_ready();
    if (!cli) MESSAGE("`tern info` is not built or does not report bad files yet: CLI checks skipped");
    test::TempDir dir;
    int index = 0;
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const std::string file = "case-" + std::to_string(index++) + ".gguf";
        const std::string path = (dir / file).string();
        test::write_file(path, std::string(c.bytes.begin(), c.bytes.end()));

        const std::string m = open_error(path);
        CAPTURE(m);
        check_message(m, file);
        if (!c.expect.empty()) CHECK(m.find(c.expect) != std::string::npos);
        // Every rejection ends with a hint: "(truncated download?)", "(corrupt file?)", or what
        // the file really is and what to do ("convert it to GGUF first").
        const bool hinted = m.ends_with("?)") || m.ends_with(")") || m.find("; convert it") != std::string::npos;
        CHECK_MESSAGE(hinted, "no hint");
        if (std::getenv("TERN_CORPUS_VERBOSE")) MESSAGE(c.name << "\n    " << m); // to review the wording

        // The in-memory parser says the same thing.
        try {
            GgufFile::parse(c.bytes, path);
            FAIL_CHECK("parse: no exception");
        } catch (const InputError& e) {
            CHECK(std::string(e.what()) == m);
        }
        if (cli) check_cli(path, file);
    }
}

TEST_CASE("not a file: directory, missing file, FIFO") {
    test::TempDir dir;
    const bool cli = cli_ready();

    const std::string sub = (dir / "model-dir.gguf").string();
    fs::create_directory(sub);
    std::string m = open_error(sub);
    check_message(m, "model-dir.gguf");
    CHECK(m.find("directory") != std::string::npos);
    if (cli) check_cli(sub, "model-dir.gguf");

    const std::string missing = (dir / "missing.gguf").string();
    m = open_error(missing);
    check_message(m, "missing.gguf");
    CHECK(m.find("no such file") != std::string::npos);
    if (cli) check_cli(missing, "missing.gguf");

    const std::string parent_is_file = (dir / "missing.gguf" / "x.gguf").string();
    test::write_file(dir / "missing.gguf", "x");
    m = open_error(parent_is_file);
    check_message(m, "x.gguf");

    const std::string fifo = (dir / "fifo.gguf").string();
    REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
    m = open_error(fifo); // must not block waiting for a writer
    check_message(m, "fifo.gguf");
    CHECK(m.find("not a regular file") != std::string::npos);
}
