// `tern info` on every model file we have: it must describe each one (exit 0, JSON that parses
// with the fields users script against), and refuse bad files with exit 2 and one line.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

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
