#include "tests/test_support.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>

#include "tests/quick_mode.h"

namespace tern::test {
namespace fs = std::filesystem;

fs::path shared_dir() {
    if (const char* env = std::getenv("TERN_SHARED"); env && *env) return fs::path(env);
    return fs::path(TERN_SHARED_DIR);
}

fs::path shared_path(const std::string& relative) { return shared_dir() / relative; }

bool shared_available() { return fs::exists(shared_dir() / "models"); }

bool quick_mode() {
    const char* e = std::getenv("TERN_TEST_QUICK");
    return e && *e && std::string(e) != "0";
}

namespace {
std::string shell_quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) {
        if (c == '\'') q += "'\\''";
        else q += c;
    }
    return q + "'";
}
} // namespace

CommandResult run_tern(const std::vector<std::string>& args, const std::string& stdin_text,
                       const std::vector<std::string>& env) {
    TempDir dir;
    const fs::path in = dir / "stdin", out = dir / "stdout", err = dir / "stderr";
    write_file(in, stdin_text);
    std::string cmd = "env";
    bool own_cache = false;
    for (const std::string& e : env) {
        cmd += " " + shell_quote(e);
        own_cache = own_cache || e.starts_with("XDG_CACHE_HOME=");
    }
    if (!own_cache) cmd += " " + shell_quote("XDG_CACHE_HOME=" + (dir / "cache").string());
    cmd += " " + shell_quote(TERN_BIN);
    for (const std::string& a : args) cmd += " " + shell_quote(a);
    cmd += " <" + shell_quote(in.string()) + " >" + shell_quote(out.string()) + " 2>" + shell_quote(err.string());
    const int status = std::system(cmd.c_str());
    CommandResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.out = read_file(out);
    r.err = read_file(err);
    return r;
}

TempDir::TempDir() {
    std::random_device rd;
    for (int attempt = 0; attempt < 100; ++attempt) {
        fs::path p = fs::temp_directory_path() / ("tern-test-" + std::to_string(rd()));
        if (fs::create_directory(p)) {
            path_ = p;
            return;
        }
    }
    throw std::runtime_error("cannot create a temporary directory");
}

TempDir::~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
}

std::string read_file(const fs::path& path) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

void write_file(const fs::path& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string stories() { return shared_path("models/gguf/stories260K-f32.gguf").string(); }
std::string wikitext() { return shared_path("data/wikitext-2-raw/wiki.test.raw").string(); }

} // namespace tern::test
