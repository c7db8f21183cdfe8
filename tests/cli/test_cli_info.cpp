// `tern info` on every model file we have: it must describe each one (exit 0, JSON that parses
// with the fields users script against), and refuse bad files with exit 2 and one line.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "tests/gguf_rewrite.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using tern::test::run_tern;

namespace {

std::vector<fs::path> shared_gguf_files() {
    std::vector<fs::path> files;
    for (const char* dir : {"models/gguf", "models/synth", "models/vocab", "models/raw/gguf"}) {
        const fs::path d = tern::test::shared_path(dir);
        if (!fs::exists(d)) continue;
        for (const auto& e : fs::directory_iterator(d))
            if (e.path().extension() == ".gguf") files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    return files;
}

int count_lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

// `file` with `bytes` written over tensor `tensor`'s data, `at` bytes into it.
void patch_tensor(const fs::path& file, const std::string& tensor, size_t at, const std::string& bytes) {
    size_t offset = 0;
    {
        const tern::GgufFile f = tern::GgufFile::open(file.string());
        const tern::GgufTensor* t = f.find_tensor(tensor);
        REQUIRE(t != nullptr);
        REQUIRE(at + bytes.size() <= t->n_bytes);
        offset = f.data_offset() + t->offset + at;
    }
    std::string all = tern::test::read_file(file);
    all.replace(offset, bytes.size(), bytes);
    tern::test::write_file(file, all);
}

// `tern info --check` on `path` fails with exit 2 and this one line, nothing on stdout.
std::string check_error(const fs::path& path) {
    const auto r = run_tern({"info", path.string(), "--check"});
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK(count_lines(r.err) == 1);
    const std::string head = "tern: " + path.string() + ": ";
    CHECK(r.err.starts_with(head));
    return r.err.starts_with(head) ? r.err.substr(head.size()) : r.err;
}

const std::string kCheckTail = " (a damaged or wrongly converted file: running it gives NaN or infinite values)\n";

} // namespace

TEST_CASE("tern info describes every shared model file") {
    if (!tern::test::shared_available()) {
        MESSAGE("skipped: ../shared not found (set TERN_SHARED)");
        return;
    }
    const auto files = shared_gguf_files();
    REQUIRE(files.size() >= 40);
    for (const fs::path& f : files) {
        CAPTURE(f.string());
        auto text = run_tern({"info", f.string()});
        CHECK(text.exit_code == 0);
        CHECK(text.err.empty());
        CHECK(text.out.find("architecture:") != std::string::npos);

        auto json = run_tern({"info", f.string(), "--json", "--tensors"});
        REQUIRE(json.exit_code == 0);
        const auto j = nlohmann::json::parse(json.out);
        CHECK(j["file_size"].get<uint64_t>() == fs::file_size(f));
        CHECK(j["tensors"].size() == j["n_tensors"].get<size_t>());
        CHECK(j["tokenizer"]["vocab_size"].get<int64_t>() > 0);
    }
}

TEST_CASE("tern info facts of known files") {
    if (!tern::test::shared_available()) return;
    auto r = run_tern({"info", tern::test::shared_path("models/gguf/stories260K-f32.gguf").string(), "--json"});
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["architecture"] == "llama");
    CHECK(j["architecture_supported"] == true);
    CHECK(j["n_layers"] == 5);
    CHECK(j["dim"] == 64);
    CHECK(j["n_heads"] == 8);
    CHECK(j["n_kv_heads"] == 4);
    CHECK(j["n_params"] == 292800);   // 2 x 512x64 embeddings/output + norm 64 + 5 layers x 45,440
    CHECK(j["tokenizer"]["model"] == "llama");
    CHECK(j["tokenizer"]["vocab_size"] == 512);
    CHECK(j["formats"]["f32"]["tensors"] == 48);
}

TEST_CASE("tern info on the Gemma 3 270M file") {
    const char* gemma = std::getenv("TERN_GEMMA");
    fs::path path = gemma ? fs::path(gemma) : fs::path(std::getenv("HOME") ? std::getenv("HOME") : "/") / ".cache/tern/models/gemma-3-270m-q4_k_m.gguf";
    if (!fs::exists(path)) {
        MESSAGE("skipped: Gemma 3 model not found (run scripts/fetch_model.sh or set TERN_GEMMA)");
        return;
    }
    auto r = run_tern({"info", path.string(), "--json"});
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["architecture"] == "gemma3");
    CHECK(j["n_layers"] == 18);
    CHECK(j["dim"] == 640);
    CHECK(j["tokenizer"]["vocab_size"] == 262144);
    CHECK(j["file_type"] == "Q4_K_M");
}

TEST_CASE("tern info refuses bad files with exit 2 and one line") {
    tern::test::TempDir dir;
    tern::test::write_file(dir / "page.gguf", "<!DOCTYPE html>\n<html><body>Not found</body></html>\n");
    tern::test::write_file(dir / "lfs.gguf",
                           "version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n");
    tern::test::write_file(dir / "empty.gguf", "");
    const std::vector<std::pair<fs::path, std::string>> cases = {
        {dir / "missing.gguf", "missing"}, {dir / "page.gguf", "HTML"},   {dir / "lfs.gguf", "LFS"},
        {dir / "empty.gguf", "empty"},     {dir.path(), "directory"},
    };
    for (const auto& [path, what] : cases) {
        CAPTURE(what);
        auto r = run_tern({"info", path.string()});
        CHECK(r.exit_code == 2);
        CHECK(count_lines(r.err) == 1);
        CHECK(r.err.find(path.filename().string()) != std::string::npos);
        CHECK(r.out.empty());
    }
}

TEST_CASE("tern --version and usage errors") {
    auto v = run_tern({"--version"});
    CHECK(v.exit_code == 0);
    CHECK(v.out.find("tern ") == 0);
    CHECK(v.out.find("CUDA") != std::string::npos);

    auto bad = run_tern({"info", "--no-such-flag", "x.gguf"});
    CHECK(bad.exit_code == 1);
    CHECK(count_lines(bad.err) == 1);
    auto none = run_tern({"info"});
    CHECK(none.exit_code == 1);
}

TEST_CASE("tern info --check decodes every tensor: passes good files, names the first bad tensor and block (exit 2)") {
    if (!tern::test::shared_available()) return;
    tern::test::TempDir dir;
    { // A good file: the JSON says the check passed, stderr has the summary line.
        const auto r = run_tern({"info", tern::test::stories(), "--check", "--json"});
        REQUIRE(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["check"]["passed"] == true);
        CHECK(j["check"]["tensors_checked"] == j["n_tensors"]);
        CHECK(j["check"]["not_checked"].empty());
        CHECK(r.err.starts_with("tern info: checked 48 tensors ("));
        CHECK(r.err.ends_with(": every value finite\n"));
        CHECK(count_lines(r.err) == 1);
        const auto text = run_tern({"info", tern::test::stories(), "--check"});
        CHECK(text.exit_code == 0);
        CHECK(text.out.find("check:           passed: 48 tensors, every value finite\n") != std::string::npos);
    }
    { // A NaN in a big matrix: loading does not read it (plain info and run open the file), --check finds it.
        const std::string nan = tern::test::rewrite_with_value(dir, tern::test::stories(), "nan-matrix.gguf",
                                                               "blk.2.ffn_down.weight", 1000, NAN);
        CHECK(run_tern({"info", nan}).exit_code == 0);
        CHECK(check_error(nan) == "tensor blk.2.ffn_down.weight: element 1000 is nan" + kCheckTail);
        const std::string inf = tern::test::rewrite_with_value(
            dir, tern::test::stories(), "inf-embd.gguf", "token_embd.weight", 4097, -INFINITY, tern::GgmlType::F16);
        CHECK(check_error(inf) == "tensor token_embd.weight: element 4097 is -inf" + kCheckTail);
    }
    { // Q4_0 and Q8_0 blocks with a NaN or inf f16 scale.
        const fs::path q4 = dir / "q4_0.gguf";
        fs::copy_file(tern::test::shared_path("models/gguf/llama2xs-tok512-q4_0.gguf"), q4);
        patch_tensor(q4, "blk.1.attn_q.weight", 18 * 7, std::string("\x00\x7e", 2)); // block 7's d = NaN
        CHECK(check_error(q4) ==
              "tensor blk.1.attn_q.weight: block 7 (elements 224..255): its f16 scale d is nan (0x7e00)" + kCheckTail);
        const fs::path q8 = dir / "q8_0.gguf";
        fs::copy_file(tern::test::shared_path("models/gguf/llama2xs-tok512-q8_0.gguf"), q8);
        patch_tensor(q8, "blk.0.ffn_up.weight", 34 * 2, std::string("\x00\xfc", 2)); // block 2's d = -inf
        CHECK(check_error(q8) ==
              "tensor blk.0.ffn_up.weight: block 2 (elements 64..95): its f16 scale d is -inf (0xfc00)" + kCheckTail);
    }
    { // A Q4_K super-block whose f16 d is inf, then one whose dmin is.
        const fs::path q4k = dir / "q4_k.gguf";
        REQUIRE(run_tern({"synth", q4k.string(), "--shape", "tiny", "--type", "q4_k_m", "-t", "1"}).exit_code == 0);
        std::string name;
        {
            const tern::GgufFile f = tern::GgufFile::open(q4k.string());
            for (const tern::GgufTensor& t : f.tensors())
                if (t.type == tern::GgmlType::Q4_K && t.n_bytes >= 144 * 4) {
                    name = t.name;
                    break;
                }
        }
        REQUIRE(!name.empty());
        CHECK(run_tern({"info", q4k.string(), "--check"}).exit_code == 0);
        patch_tensor(q4k, name, 144 * 3 + 2, std::string("\x00\x7c", 2)); // block 3's dmin = inf
        CHECK(check_error(q4k) ==
              "tensor " + name + ": block 3 (elements 768..1023): its f16 scale dmin is inf (0x7c00)" + kCheckTail);
        patch_tensor(q4k, name, 144 * 3, std::string("\x00\x7c", 2)); // and its d
        CHECK(check_error(q4k) ==
              "tensor " + name + ": block 3 (elements 768..1023): its f16 scale d is inf (0x7c00)" + kCheckTail);
    }
    { // MXFP4 experts: the E8M0 scale byte 0xff is NaN whatever the codes; 0xfe overflows the largest codes.
        const fs::path mx = dir / "mxfp4.gguf";
        REQUIRE(
            run_tern({"synth", mx.string(), "--shape", "tiny-gpt-oss", "--type", "mxfp4_moe", "-t", "1"}).exit_code ==
            0);
        const std::string exps = "blk.1.ffn_down_exps.weight";
        {
            const tern::GgufFile f = tern::GgufFile::open(mx.string());
            REQUIRE(f.find_tensor(exps) != nullptr);
            REQUIRE(f.find_tensor(exps)->type == tern::GgmlType::MXFP4);
        }
        CHECK(run_tern({"info", mx.string(), "--check"}).exit_code == 0);
        const fs::path fe = dir / "mxfp4-fe.gguf";
        fs::copy_file(mx, fe);
        patch_tensor(fe, exps, 17 * 6, std::string("\xfe\x07", 2)); // block 6: scale 2^127, element 0 code 12 (6.0)
        CHECK(check_error(fe) ==
              "tensor " + exps + ": block 6 (elements 192..223): element 192 decodes to inf" + kCheckTail);
        patch_tensor(mx, exps, 17 * 5, std::string("\xff", 1));
        CHECK(check_error(mx) ==
              "tensor " + exps + ": block 5 (elements 160..191): its E8M0 scale byte is 0xff (NaN)" + kCheckTail);
        // Plain info (what run checks at open) does not read the expert matrices.
        CHECK(run_tern({"info", mx.string()}).exit_code == 0);
    }
}

TEST_CASE("tern info --check lists the tensors in formats tern cannot decode, and checks the rest") {
    tern::test::TempDir dir;
    const std::vector<uint8_t> zeros(1024, 0);
    std::vector<float> values(64, 1.0f);
    values[9] = NAN;
    tern::GgufWriter w;
    w.set("general.architecture", tern::GgufValue::make_string("mamba"));   // described, not loaded
    w.add_tensor("iq.weight", tern::GgmlType::IQ2_XXS, {256}, std::span<const uint8_t>(zeros.data(), 66));
    w.add_tensor("ints.weight", tern::GgmlType::I32, {16}, std::span<const uint8_t>(zeros.data(), 64));
    w.add_tensor("ok.weight", tern::GgmlType::F32, {64},
                 std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(zeros.data()), 256));
    const fs::path good = dir / "iq.gguf";
    w.write(good.string());
    const auto r = run_tern({"info", good.string(), "--check", "--json"});
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["check"]["passed"] == true);
    CHECK(j["check"]["tensors_checked"] == 2);
    CHECK(j["check"]["not_checked"] == nlohmann::json::array({"iq.weight (iq2_xxs)"}));
    CHECK(r.err.find("; not checked, in formats tern cannot decode: iq.weight (iq2_xxs)\n") !=
          std::string::npos);
    w.add_tensor("bad.weight", tern::GgmlType::F32, {64},
                 std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(values.data()), 256));
    const fs::path bad = dir / "bad.gguf";
    w.write(bad.string());
    CHECK(check_error(bad) == "tensor bad.weight: element 9 is nan" + kCheckTail);
}

TEST_CASE("tern info refuses what tern run refuses at open: metadata out of range, a NaN in a norm (exit 2)") {
    if (!tern::test::shared_available()) return;
    tern::test::TempDir dir;
    const std::string norm =
        tern::test::rewrite_with_value(dir, tern::test::stories(), "nan-norm.gguf", "blk.3.ffn_norm.weight", 7, NAN);
    const std::string base =
        tern::test::rewrite_gguf(dir, tern::test::stories(), "inf-base.gguf", [](tern::GgufWriter& w) {
            w.set("llama.rope.freq_base", tern::GgufValue::make_f32(INFINITY));
        });
    for (const auto& [path, what] : std::vector<std::pair<std::string, std::string>>{
             {norm, "tensor blk.3.ffn_norm.weight: element 7 is nan"},
             {base, "metadata llama.rope.freq_base: value inf is out of range"}}) {
        CAPTURE(path);
        const auto info = run_tern({"info", path});
        const auto run = run_tern({"run", "-m", path, "-p", "Once", "-n", "2"});
        CHECK(info.exit_code == 2);
        CHECK(run.exit_code == 2);
        CHECK(info.out.empty());
        CHECK(count_lines(info.err) == 1);
        CHECK(info.err.starts_with("tern: " + path + ": " + what));
        CHECK(info.err == run.err); // the same check, the same line
    }
}
