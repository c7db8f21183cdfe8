// GgufWriter: a file with every value type and several tensor formats reads back identically; a
// shared model copied through the writer keeps its metadata and tensor bytes; and every failure
// (throwing fill callback, file size limit, bad declarations) leaves no file behind.
#include <doctest/doctest.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace tern;

namespace {

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
    return v;
}

// One metadata value of every GGUF type, plus arrays of several kinds, nested ones included.
std::vector<GgufKv> every_value_type() {
    std::vector<GgufKv> kvs;
    kvs.push_back({"general.architecture", GgufValue::make_string("llama")});
    kvs.push_back({"t.u8", GgufValue::make_u8(250)});
    kvs.push_back({"t.i8", GgufValue::make_i8(-120)});
    kvs.push_back({"t.u16", GgufValue::make_u16(65000)});
    kvs.push_back({"t.i16", GgufValue::make_i16(-32000)});
    kvs.push_back({"t.u32", GgufValue::make_u32(4000000000u)});
    kvs.push_back({"t.i32", GgufValue::make_i32(-2000000000)});
    kvs.push_back({"t.f32", GgufValue::make_f32(0.1f)});
    kvs.push_back({"t.bool", GgufValue::make_bool(true)});
    kvs.push_back({"t.bool_false", GgufValue::make_bool(false)});
    kvs.push_back({"t.string", GgufValue::make_string("héllo\nwörld \xF0\x9F\x98\x80")});
    kvs.push_back({"t.empty_string", GgufValue::make_string("")});
    // Not UTF-8: allowed in vocabulary tokens only (other metadata strings must be text).
    kvs.push_back({"tokenizer.ggml.tokens", GgufValue::make_string_array({std::string("\xff\xfe\x00x", 4)})});
    kvs.push_back({"t.u64", GgufValue::make_u64(0xFFFFFFFFFFFFFFFFull)});
    kvs.push_back({"t.i64", GgufValue::make_i64(-9000000000000000000ll)});
    kvs.push_back({"t.f64", GgufValue::make_f64(-1.0 / 3.0)});
    kvs.push_back({"t.strings", GgufValue::make_string_array({"a", "", "ccc", "\xe2\x96\x81the"})});
    kvs.push_back({"t.f32s", GgufValue::make_f32_array({1.5f, -0.0f, 3.25e-20f})});
    kvs.push_back({"t.i32s", GgufValue::make_i32_array({1, -2, 3})});
    kvs.push_back({"t.empty_array", GgufValue::make_array(GgufType::u16, {})});
    kvs.push_back({"t.bools", GgufValue::make_array(GgufType::boolean,
                                                    {GgufValue::make_bool(false), GgufValue::make_bool(true)})});
    kvs.push_back({"t.u64s", GgufValue::make_array(GgufType::u64, {GgufValue::make_u64(1), GgufValue::make_u64(2)})});
    kvs.push_back({"t.f64s", GgufValue::make_array(GgufType::f64, {GgufValue::make_f64(2.5)})});
    kvs.push_back({"t.nested", GgufValue::make_array(GgufType::array,
                                                     {GgufValue::make_i32_array({1, 2}), GgufValue::make_i32_array({}),
                                                      GgufValue::make_i32_array({3})})});
    kvs.push_back(
        {"t.nested_strings", GgufValue::make_array(GgufType::array, {GgufValue::make_string_array({"x", "y"})})});
    // Three levels deep: array of arrays of arrays of u8.
    GgufValue inner = GgufValue::make_array(GgufType::u8, {GgufValue::make_u8(9)});
    GgufValue middle = GgufValue::make_array(GgufType::array, {inner, inner});
    kvs.push_back({"t.deep", GgufValue::make_array(GgufType::array, {middle})});
    return kvs;
}

struct TensorSpec {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
};

const std::vector<TensorSpec> kTensors = {
    {"token_embd.weight", GgmlType::Q4_0, {64, 10}},
    {"norm.weight", GgmlType::F32, {7}}, // 28 bytes: forces padding
    {"blk.0.attn_q.weight", GgmlType::Q6_K, {256, 3}},
    {"blk.0.attn_k.weight", GgmlType::F16, {3, 5, 2}},
    {"blk.0.ffn_up.weight", GgmlType::Q8_0, {32, 2, 2, 2}},
    {"blk.0.bf16", GgmlType::BF16, {5}},
    {"blk.0.fp8", GgmlType::F8_E4M3, {64, 1}},
    {"blk.0.q4k", GgmlType::Q4_K, {256}},
    {"blk.0.i8", GgmlType::I8, {3}},
};

uint64_t bytes_of(const TensorSpec& t) {
    const TypeInfo& ti = type_info(t.type);
    uint64_t n = static_cast<uint64_t>(t.ne[0] / ti.block_elems) * ti.block_bytes;
    for (size_t d = 1; d < t.ne.size(); ++d)
        n *= static_cast<uint64_t>(t.ne[d]);
    return n;
}

// Everything from the end of one blob to the start of the next (or the end of the file) must be
// zero, and every blob must end its padding on an aligned byte.
void check_padding_is_zero(const GgufFile& f) {
    std::vector<std::pair<uint64_t, uint64_t>> used; // [begin, end) in file bytes
    for (const GgufTensor& t : f.tensors())
        used.push_back({f.data_offset() + t.offset, f.data_offset() + t.offset + t.n_bytes});
    std::sort(used.begin(), used.end());
    for (size_t i = 0; i < used.size(); ++i) {
        const uint64_t next = i + 1 < used.size() ? used[i + 1].first : f.file_size();
        for (uint64_t k = used[i].second; k < next; ++k)
            REQUIRE(f.bytes()[k] == 0);
        CHECK(next % f.alignment() == 0);
    }
}

} // namespace

TEST_CASE("round trip: every value type, nested arrays, several tensor formats") {
    for (uint32_t alignment : {32u, 64u, 1u, 4096u}) {
        CAPTURE(alignment);
        test::TempDir dir;
        const std::string path = (dir / "rt.gguf").string();

        GgufWriter w;
        const std::vector<GgufKv> kvs = every_value_type();
        for (const GgufKv& kv : kvs)
            w.set(kv.key, kv.value);
        std::vector<std::vector<uint8_t>> blobs;
        for (size_t k = 0; k < kTensors.size(); ++k)
            blobs.push_back(pattern(bytes_of(kTensors[k]), uint8_t(k * 31)));
        // Even tensors from spans, odd ones from the fill callback.
        for (size_t k = 0; k < kTensors.size(); ++k)
            w.add_tensor(kTensors[k].name, kTensors[k].type, kTensors[k].ne,
                         k % 2 == 0 ? std::span<const uint8_t>(blobs[k]) : std::span<const uint8_t>());
        std::vector<size_t> filled;
        w.write(
            path,
            [&](size_t index, std::span<uint8_t> out) {
                REQUIRE(out.size() == blobs[index].size());
                std::memcpy(out.data(), blobs[index].data(), out.size());
                filled.push_back(index);
            },
            alignment);
        CHECK(filled == std::vector<size_t>{1, 3, 5, 7});
        CHECK(!fs::exists(path + ".tmp"));

        const GgufFile f = GgufFile::open(path);
        CHECK(f.version() == 3);
        CHECK(f.alignment() == alignment);
        std::vector<GgufKv> expected = kvs;
        if (alignment != 32) expected.push_back({"general.alignment", GgufValue::make_u32(alignment)});
        REQUIRE(f.metadata().size() == expected.size());
        for (size_t k = 0; k < expected.size(); ++k) {
            CAPTURE(expected[k].key);
            CHECK(f.metadata()[k] == expected[k]);
        }
        CHECK(f.get_string("t.string") == "héllo\nwörld \xF0\x9F\x98\x80");
        CHECK(f.get_u32("t.u16") == 65000);
        CHECK(f.get_int("t.i64") == -9000000000000000000ll);
        CHECK_THROWS_AS(f.get_int("t.u64"), InputError); // 2^64 - 1 does not fit
        CHECK(f.get_bool("t.bool"));
        REQUIRE(f.tensors().size() == kTensors.size());
        for (size_t k = 0; k < kTensors.size(); ++k) {
            const GgufTensor& t = f.tensors()[k];
            CAPTURE(t.name);
            CHECK(t.name == kTensors[k].name);
            CHECK(t.type == kTensors[k].type);
            CHECK(t.n_dims == static_cast<int>(kTensors[k].ne.size()));
            for (int d = 0; d < 4; ++d)
                CHECK(t.ne[d] == (d < t.n_dims ? kTensors[k].ne[static_cast<size_t>(d)] : 1));
            REQUIRE(t.n_bytes == blobs[k].size());
            CHECK(std::memcmp(t.data, blobs[k].data(), t.n_bytes) == 0);
            CHECK((f.data_offset() + t.offset) % alignment == 0);
        }
        check_padding_is_zero(f);
        // Zero padding after the last tensor too: the file ends on an aligned size.
        CHECK(f.file_size() % alignment == 0);
    }
}

TEST_CASE("a shared model copied through the writer reads back identically") {
    for (const char* rel : {"models/synth/synth-k256-q4_0.gguf", "models/gguf/stories260K-q4_k_m.gguf",
                            "models/vocab/ggml-vocab-llama-spm.gguf"}) {
        const fs::path src_path = test::shared_path(rel);
        if (!fs::exists(src_path)) {
            MESSAGE("skipped: " << src_path.string() << " not found");
            continue;
        }
        CAPTURE(src_path.string());
        test::TempDir dir;
        const std::string path = (dir / "copy.gguf").string();
        const GgufFile src = GgufFile::open(src_path.string());
        GgufWriter w;
        w.copy_metadata_from(src);
        CHECK(w.metadata() == src.metadata());
        for (const GgufTensor& t : src.tensors())
            w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), {t.data, t.n_bytes});
        w.write(path);

        const GgufFile copy = GgufFile::open(path);
        CHECK(copy.metadata() == src.metadata());
        REQUIRE(copy.tensors().size() == src.tensors().size());
        for (size_t k = 0; k < src.tensors().size(); ++k) {
            const GgufTensor& a = src.tensors()[k];
            const GgufTensor& b = copy.tensors()[k];
            CHECK(a.name == b.name);
            CHECK(a.type == b.type);
            CHECK(a.shape_string() == b.shape_string());
            CHECK(a.offset == b.offset);
            REQUIRE(a.n_bytes == b.n_bytes);
            CHECK(std::memcmp(a.data, b.data, a.n_bytes) == 0);
        }
        // llama.cpp's writer lays files out the same way, so model files come back byte for byte
        // (vocab-only files there end without padding; ours pad to the alignment).
        if (!src.tensors().empty()) CHECK(test::read_file(path) == test::read_file(src_path));
    }
}

TEST_CASE("set replaces in place, remove deletes") {
    GgufWriter w;
    w.set("a", GgufValue::make_u32(1));
    w.set("b", GgufValue::make_u32(2));
    w.set("a", GgufValue::make_string("x"));
    REQUIRE(w.metadata().size() == 2);
    CHECK(w.metadata()[0].key == "a");
    CHECK(w.metadata()[0].value == GgufValue::make_string("x"));
    w.remove("a");
    REQUIRE(w.metadata().size() == 1);
    CHECK(w.metadata()[0].key == "b");
    w.remove("missing");
    CHECK(w.metadata().size() == 1);
}

TEST_CASE("a stored general.alignment follows the alignment written") {
    test::TempDir dir;
    const std::string path = (dir / "a.gguf").string();
    GgufWriter w;
    w.set("general.alignment", GgufValue::make_u32(64));
    w.set("z", GgufValue::make_u8(1));
    const std::vector<uint8_t> data(12, 1); // must outlive write(): the writer keeps a span
    w.add_tensor("t", GgmlType::F32, {3}, data);
    w.write(path, {}, 128);
    const GgufFile f = GgufFile::open(path);
    CHECK(f.alignment() == 128);
    CHECK(f.metadata()[0].key == "general.alignment");
    CHECK(f.metadata().size() == 2);
}

TEST_CASE("bad tensor declarations are refused") {
    GgufWriter w;
    w.add_tensor("ok", GgmlType::F32, {4});
    CHECK_THROWS_AS(w.add_tensor("ok", GgmlType::F32, {4}), InputError);
    CHECK_THROWS_AS(w.add_tensor("", GgmlType::F32, {4}), InputError);
    CHECK_THROWS_AS(w.add_tensor(std::string(64, 'n'), GgmlType::F32, {4}), InputError);
    CHECK_NOTHROW(w.add_tensor(std::string(63, 'n'), GgmlType::F32, {4}));
    CHECK_THROWS_AS(w.add_tensor("bad\xff", GgmlType::F32, {4}), InputError);
    CHECK_THROWS_AS(w.add_tensor("q", GgmlType::Q4_0, {33}), InputError);
    CHECK_THROWS_AS(w.add_tensor("z", GgmlType::F32, {0}), InputError);
    CHECK_THROWS_AS(w.add_tensor("d", GgmlType::F32, {}), InputError);
    CHECK_THROWS_AS(w.add_tensor("d5", GgmlType::F32, {1, 1, 1, 1, 1}), InputError);
    CHECK_THROWS_AS(w.add_tensor("big", GgmlType::F32, {int64_t(1) << 62, int64_t(1) << 62}), InputError);
    CHECK_THROWS_AS(w.add_tensor("unknown", static_cast<GgmlType>(4), {32}), InputError);
    CHECK_THROWS_AS(w.add_tensor("size", GgmlType::F32, {4}, std::vector<uint8_t>(15)), InputError);
}

TEST_CASE("metadata text that is not UTF-8 is refused, as the reader would; vocabulary tokens may hold bytes") {
    test::TempDir dir;
    const std::string path = (dir / "u.gguf").string();
    const std::vector<uint8_t> data(16, 0);   // must outlive write(): the writer keeps a span
    GgufWriter bad;
    bad.set("general.name", GgufValue::make_string("name\xff"));
    bad.add_tensor("t", GgmlType::F32, {4}, data);
    CHECK_THROWS_AS(bad.write(path), std::invalid_argument);
    CHECK(!fs::exists(path));
    GgufWriter in_array;
    in_array.set("tokenizer.chat_templates", GgufValue::make_string_array({"ok", "\xC3"}));
    in_array.add_tensor("t", GgmlType::F32, {4}, data);
    CHECK_THROWS_AS(in_array.write(path), std::invalid_argument);
    GgufWriter tokens;
    tokens.set("tokenizer.ggml.tokens", GgufValue::make_string_array({"a", "\xF0", "\x9F"}));
    tokens.add_tensor("t", GgmlType::F32, {4}, data);
    tokens.write(path);
    CHECK(GgufFile::open(path).metadata().size() == 1);
}

TEST_CASE("failures leave no file behind") {
    test::TempDir dir;
    const std::string path = (dir / "out.gguf").string();
    GgufWriter w;
    w.set("general.architecture", GgufValue::make_string("llama"));
    w.add_tensor("a", GgmlType::F32, {1024});
    w.add_tensor("b", GgmlType::F32, {1024});

    SUBCASE("fill callback throws a std::exception: RuntimeFailure naming the path") {
        try {
            w.write(path, [](size_t index, std::span<uint8_t>) {
                if (index == 1) throw std::runtime_error("quantizer exploded");
            });
            FAIL("no exception");
        } catch (const RuntimeFailure& e) {
            const std::string m = e.what();
            CHECK(m.find(path) != std::string::npos);
            CHECK(m.find("quantizer exploded") != std::string::npos);
            CHECK(m.find('\n') == std::string::npos);
        }
    }
    SUBCASE("fill callback throws InputError: it keeps its type") {
        CHECK_THROWS_AS(w.write(path, [](size_t, std::span<uint8_t>) { throw InputError("x.gguf: NaN"); }), InputError);
    }
    SUBCASE("an existing file is left untouched") {
        test::write_file(path, "previous");
        CHECK_THROWS_AS(w.write(path, [](size_t, std::span<uint8_t>) { throw std::runtime_error("no"); }),
                        RuntimeFailure);
        CHECK(test::read_file(path) == "previous");
        fs::remove(path);
    }
    SUBCASE("missing directory") {
        const std::string bad = (dir / "no-such-dir" / "out.gguf").string();
        try {
            w.write(bad, [](size_t, std::span<uint8_t>) {});
            FAIL("no exception");
        } catch (const RuntimeFailure& e) {
            CHECK(std::string(e.what()).find(bad) != std::string::npos);
        }
    }
    CHECK(!fs::exists(path));
    CHECK(!fs::exists(path + ".tmp"));
    CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("file size limit (EFBIG with SIGXFSZ ignored): RuntimeFailure and no file") {
    test::TempDir dir;
    const std::string path = (dir / "big.gguf").string();
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        // Child: the write must fail with EFBIG after 64 KiB instead of killing the process.
        std::signal(SIGXFSZ, SIG_IGN);
        rlimit lim{64 * 1024, 64 * 1024};
        if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(10);
        try {
            GgufWriter w;
            w.set("general.architecture", GgufValue::make_string("llama"));
            std::vector<uint8_t> data(1 << 20, 0x5a);
            w.add_tensor("big", GgmlType::F32, {1 << 18}, data);
            w.write(path);
            _exit(11); // should not succeed
        } catch (const RuntimeFailure& e) {
            const std::string m = e.what();
            if (m.find(path) == std::string::npos) _exit(12);
            if (m.find("File too large") == std::string::npos) _exit(13);
            if (m.find('\n') != std::string::npos) _exit(14);
            _exit(0);
        } catch (...) {
            _exit(15);
        }
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(!fs::exists(path));
    CHECK(!fs::exists(path + ".tmp"));
}
