#pragma once
// Helpers shared by the tests: where ../shared is, running the built `tern` binary, temp dirs.
#include <filesystem>
#include <string>
#include <vector>

namespace tern::test {

// ../shared (TERN_SHARED env var overrides the configured path).
std::filesystem::path shared_dir();
std::filesystem::path shared_path(const std::string& relative);
bool shared_available();
// The files many tests run: the f32 stories260K model (the smallest real one) and the wikitext-2
// test text, as paths under shared_dir().
std::string stories();
std::string wikitext();

struct CommandResult {
    int exit_code = -1;
    std::string out;   // stdout
    std::string err;   // stderr
};
// Runs the built tern binary with `args` (shell-quoted here), optional stdin text and extra
// environment ("NAME=value"). XDG_CACHE_HOME points into a fresh temporary directory unless `env`
// sets it, so runs never write to the real ~/.cache (the prompt cache) nor see each other's.
CommandResult run_tern(const std::vector<std::string>& args, const std::string& stdin_text = "",
                       const std::vector<std::string>& env = {});

// A fresh empty directory under the system temp dir, removed when the object dies.
class TempDir {
public:
    TempDir();
    ~TempDir();
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return path_; }
    std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

private:
    std::filesystem::path path_;
};

std::string read_file(const std::filesystem::path& path);
void write_file(const std::filesystem::path& path, const std::string& bytes);

} // namespace tern::test
