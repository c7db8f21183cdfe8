// The one safe writer (formats/atomic_file.h) and every command that writes through it: a planted
// symlink is never followed, a target that is not a regular file is refused and left as it was, the
// temporary file is unique (two writers of one file each rename a whole file of their own) and gone
// after an error or a signal, and files get their modes (0600 for conversations and prompt-cache
// entries, 0700 for prompt-cache directories).
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/prefix_cache/prefix_cache_files.h"
#include "formats/atomic_file.h"
#include "base/error.h"
#include "formats/gguf.h"
#include "tests/spawn_support.h"
#include "tests/test_support.h"

using namespace tern;
using namespace tern::test;
namespace fs = std::filesystem;

namespace {

std::string llama2xs() {
    return shared_path("models/gguf/llama2xs-tok512-f32.gguf").string();
}

void write_atomically(const std::string& path, const std::string& bytes, AtomicFile::Options o = {}) {
    AtomicFile f(path, o);
    f.write(bytes.data(), bytes.size());
    f.commit();
}

mode_t mode_of(const fs::path& p) {
    struct stat st {};
    REQUIRE(::lstat(p.c_str(), &st) == 0);
    return st.st_mode & 07777;
}

bool is_link(const fs::path& p) {
    return fs::is_symlink(fs::symlink_status(p));
}

} // namespace

TEST_CASE("AtomicFile: a whole new file, mode 0644 less the umask (or as asked), no temporary left") {
    TempDir dir;
    const mode_t mask = ::umask(022);
    ::umask(mask);
    write_atomically((dir / "a").string(), "hello");
    AtomicFile::Options private_file;
    private_file.mode = 0600;
    write_atomically((dir / "b").string(), "secret", private_file);
    CHECK(read_file(dir / "a") == "hello");
    CHECK(mode_of(dir / "a") == (0644 & ~mask));
    CHECK(mode_of(dir / "b") == 0600);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"a", "b"});
}

TEST_CASE("AtomicFile: the temporary file is 0600, unique, beside the target, and gone after an exception") {
    TempDir dir;
    const std::string out = (dir / "out").string();
    std::string seen;
    try {
        AtomicFile a(out), b(out);
        CHECK(a.temporary_path() != b.temporary_path());
        CHECK(a.temporary_path().rfind(out + ".tmp.", 0) == 0);
        CHECK(mode_of(a.temporary_path()) == 0600);
        seen = a.temporary_path();
        throw std::runtime_error("stop");
    } catch (const std::runtime_error&) {
    }
    CHECK(!seen.empty());
    CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("AtomicFile: planted symlinks are never followed; a non-regular target is refused, never replaced") {
    TempDir dir;
    const fs::path victim = dir / "victim";
    write_file(victim, "precious");
    const std::string out = (dir / "out").string();

    // The old fixed temporary name planted as a link to the victim: the unique name passes it by.
    fs::create_symlink(victim, out + ".tmp");
    write_atomically(out, "new");
    CHECK(read_file(victim) == "precious");
    CHECK(!is_link(out));
    CHECK(read_file(out) == "new");

    // OUT itself a symlink (to the victim, or dangling): refused, the link and the victim unchanged.
    for (const fs::path& target : {victim, dir / "nowhere"}) {
        const fs::path link = dir / "link";
        fs::remove(link);
        fs::create_symlink(target, link);
        try {
            write_atomically(link.string(), "new");
            FAIL("wrote through a symlink");
        } catch (const UsageError& e) {
            const std::string m = e.what();
            CHECK(m.find(link.string()) != std::string::npos);
            CHECK(m.find("symbolic link") != std::string::npos);
            CHECK(m.find('\n') == std::string::npos);
        }
        CHECK(is_link(link));
        CHECK(fs::read_symlink(link) == target);
    }
    CHECK(read_file(victim) == "precious");

    // A directory and a device node.
    fs::create_directory(dir / "subdir");
    CHECK_THROWS_AS(write_atomically((dir / "subdir").string(), "x"), UsageError);
    CHECK(fs::is_directory(dir / "subdir"));
    CHECK_THROWS_AS(write_atomically("/dev/null", "x"), UsageError);
    CHECK(fs::is_character_file("/dev/null"));
    // A FIFO.
    REQUIRE(::mkfifo((dir / "fifo").c_str(), 0600) == 0);
    CHECK_THROWS_AS(write_atomically((dir / "fifo").string(), "x"), UsageError);
    CHECK(fs::is_fifo(dir / "fifo"));
    CHECK(!has_temporary(dir.path()));
}

TEST_CASE("AtomicFile: SIGINT, SIGTERM, SIGHUP and SIGQUIT during a write remove the temporary file") {
    struct Case {
        int sig;
        bool exits_130;
    };
    for (const Case c : {Case{SIGINT, true}, Case{SIGTERM, false}, Case{SIGHUP, false}, Case{SIGQUIT, false}}) {
        CAPTURE(c.sig);
        TempDir dir;
        const std::string out = (dir / "conversation.tern").string();
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
                std::signal(s, SIG_DFL);
            install_temporary_file_cleanup_on_signals();
            AtomicFile f(out);
            f.write("half of it", 10);
            ::raise(c.sig);
            _exit(99); // not reached: the handler ends the process
        }
        int status = 0;
        REQUIRE(::waitpid(pid, &status, 0) == pid);
        if (c.exits_130) {
            REQUIRE(WIFEXITED(status));
            CHECK(WEXITSTATUS(status) == 130);
        } else {
            REQUIRE(WIFSIGNALED(status));
            CHECK(WTERMSIG(status) == c.sig);
        }
        // A core dump of SIGQUIT may land in the working directory, never here.
        CHECK(fs::is_empty(dir.path()));
    }
}

TEST_CASE("AtomicFile: writers racing on one file each rename a whole file of their own") {
    TempDir dir;
    const std::string out = (dir / "shared").string();
    constexpr int kWriters = 6;
    constexpr size_t kBytes = 4 << 20;
    for (int round = 0; round < 3; ++round) {
        std::vector<pid_t> pids;
        for (int w = 0; w < kWriters; ++w) {
            const pid_t pid = ::fork();
            REQUIRE(pid >= 0);
            if (pid == 0) {
                try {
                    const std::string chunk(64 << 10, static_cast<char>('a' + w));
                    AtomicFile f(out);
                    for (size_t done = 0; done < kBytes; done += chunk.size())
                        f.write(chunk.data(), chunk.size());
                    f.commit();
                    _exit(0);
                } catch (...) {
                    _exit(1);
                }
            }
            pids.push_back(pid);
        }
        for (pid_t pid : pids) {
            int status = 0;
            REQUIRE(::waitpid(pid, &status, 0) == pid);
            CHECK(WIFEXITED(status));
            CHECK(WEXITSTATUS(status) == 0);
        }
        const std::string bytes = read_file(out);
        REQUIRE(bytes.size() == kBytes);
        CHECK(bytes.find_first_not_of(bytes[0]) == std::string::npos);
        CHECK(names_in(dir.path()) == std::vector<std::string>{"shared"});
    }
}

namespace {

// The pid of a process that has exited and been reaped: no process has it (until the kernel reuses it).
pid_t dead_pid() {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(0);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return pid;
}

} // namespace

TEST_CASE("AtomicFile: a write removes the temporary files that killed writers of the same file left, and only those") {
    TempDir dir;
    const std::string out = (dir / "model.gguf").string();
    const pid_t dead = dead_pid();
    REQUIRE(::kill(dead, 0) != 0);
    const std::string tail = ".0123456789abcdef";
    const std::string stale = "model.gguf.tmp." + std::to_string(dead) + tail;
    write_file(dir / stale, "left by SIGKILL");
    // Kept: a live writer's (this process), a symlink, a directory, names of another form or another OUT.
    const std::string live = "model.gguf.tmp." + std::to_string(::getpid()) + tail;
    write_file(dir / live, "being written");
    write_file(dir / "victim", "not ours to remove");
    const std::string link = "model.gguf.tmp." + std::to_string(dead) + ".fedcba9876543210";
    fs::create_symlink(dir / "victim", dir / link);
    const std::string directory = "model.gguf.tmp." + std::to_string(dead) + ".00000000000000aa";
    fs::create_directory(dir / directory);
    const std::vector<std::string> other_forms = {
        "model.gguf.tmp." + std::to_string(dead) + ".0123456789abcde",     // 15 digits
        "model.gguf.tmp." + std::to_string(dead) + ".0123456789ABCDEF",    // upper case
        "model.gguf.tmp.0" + std::to_string(dead) + tail,                  // a leading zero
        "model.gguf.tmp." + std::to_string(dead) + tail + ".x",           // a longer name
        "other.gguf.tmp." + std::to_string(dead) + tail,                   // another OUT's
        "xmodel.gguf.tmp." + std::to_string(dead) + tail,
    };
    for (const std::string& name : other_forms) write_file(dir / name, "kept");

    write_atomically(out, "new model");
    CHECK(read_file(out) == "new model");
    CHECK(!fs::exists(dir / stale));
    CHECK(read_file(dir / live) == "being written");
    CHECK(fs::is_symlink(dir / link));
    CHECK(read_file(dir / "victim") == "not ours to remove");
    CHECK(fs::is_directory(dir / directory));
    for (const std::string& name : other_forms) CHECK(fs::exists(dir / name));
}

TEST_CASE("synth killed by SIGKILL leaves its temporary file; the next synth to that OUT removes it") {
    TempDir dir;
    const std::string out = (dir / "synth.gguf").string();
    const pid_t dead = dead_pid();
    // What a SIGKILL-ed synth leaves: its name exactly, a pid that is gone.
    write_file(dir / ("synth.gguf.tmp." + std::to_string(dead) + ".00c0ffee00c0ffee"), std::string(4096, 'x'));
    const CommandResult r = run_tern({"synth", out, "--shape", "tiny", "--type", "q8_0"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(names_in(dir.path()) == std::vector<std::string>{"synth.gguf"});
}

TEST_CASE("prompt-cache directories are created 0700, entries 0600") {
    TempDir dir;
    const fs::path cache = dir / "a" / "b" / "prompts";
    std::error_code ec;
    const mode_t mask = ::umask(0);
    CHECK(create_private_directories(cache, ec));
    std::string why;
    const std::vector<uint8_t> bytes = {1, 2, 3};
    CHECK(write_cache_file_atomically(cache / "e.kv", bytes, &why));
    ::umask(mask);
    CHECK(mode_of(dir / "a") == 0700);
    CHECK(mode_of(dir / "a" / "b") == 0700);
    CHECK(mode_of(cache) == 0700);
    CHECK(mode_of(cache / "e.kv") == 0600);

    // Through the CLI: a run caches its prompt under $XDG_CACHE_HOME/tern/prompts.
    if (!shared_available()) return;
    std::string prompt;
    for (int i = 0; i < 12; ++i)
        prompt += "Once upon a time there was a little dog who liked to play. ";
    const CommandResult r = run_tern(
        {"run", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n", "2", "-c", "512", "-p", prompt}, "",
        {"XDG_CACHE_HOME=" + (dir / "xdg").string()});
    REQUIRE(r.exit_code == 0);
    CHECK(mode_of(dir / "xdg" / "tern") == 0700);
    CHECK(mode_of(dir / "xdg" / "tern" / "prompts") == 0700);
    CHECK(!fs::is_empty(dir / "xdg" / "tern" / "prompts"));
    for (const auto& e : fs::directory_iterator(dir / "xdg" / "tern" / "prompts")) {
        CAPTURE(e.path());
        CHECK(mode_of(e.path()) == 0600);
    }
}

TEST_CASE("quantize and synth: a planted symlink, a device node or a directory as OUT is refused and unchanged") {
    if (!shared_available()) return;
    TempDir dir;
    const fs::path victim = dir / "victim";
    write_file(victim, "precious");
    fs::create_symlink(victim, dir / "out.gguf.tmp");
    fs::create_symlink(victim, dir / "link.gguf");
    fs::create_directory(dir / "dir.gguf");

    // The fixed temporary name planted: ignored, OUT a regular file, the victim unchanged.
    CommandResult r = run_tern({"quantize", llama2xs(), (dir / "out.gguf").string(), "--type", "q8_0"});
    CHECK(r.exit_code == 0);
    CHECK(fs::is_regular_file(fs::symlink_status(dir / "out.gguf")));
    CHECK(GgufFile::open((dir / "out.gguf").string()).tensors().size() > 0);
    r = run_tern({"synth", (dir / "synth.gguf").string(), "--shape", "tiny", "--type", "q8_0"});
    CHECK(r.exit_code == 0);

    for (const std::string& out :
         {(dir / "link.gguf").string(), (dir / "dir.gguf").string(), std::string("/dev/null")}) {
        CAPTURE(out);
        for (const std::vector<std::string>& args :
             {std::vector<std::string>{"quantize", llama2xs(), out, "--type", "q8_0", "--force"},
              std::vector<std::string>{"synth", out, "--shape", "tiny", "--type", "q8_0"}}) {
            r = run_tern(args);
            CHECK(r.exit_code == 1);
            CHECK(r.err.find(out) != std::string::npos);
            CHECK(r.err.find("not a regular file") != std::string::npos);
            CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
        }
    }
    CHECK(read_file(victim) == "precious");
    CHECK(fs::read_symlink(dir / "link.gguf") == victim);
    CHECK(fs::is_directory(dir / "dir.gguf"));
    CHECK(fs::is_character_file("/dev/null"));
    CHECK(!has_temporary(dir.path()));
}

TEST_CASE("two quantize runs to one OUT with --force: OUT is the whole output of one of them") {
    if (!shared_available()) return;
    TempDir dir;
    // The expected outputs, one per type.
    REQUIRE(run_tern({"quantize", llama2xs(), (dir / "ref-q8_0").string(), "--type", "q8_0"}).exit_code == 0);
    REQUIRE(run_tern({"quantize", llama2xs(), (dir / "ref-q4_0").string(), "--type", "q4_0"}).exit_code == 0);
    const std::string q8 = read_file(dir / "ref-q8_0"), q4 = read_file(dir / "ref-q4_0");
    const std::string out = (dir / "out.gguf").string();
    for (int round = 0; round < 8; ++round) {
        CAPTURE(round);
        Spawned a({"quantize", llama2xs(), out, "--type", "q8_0", "--force", "-t", "1"});
        Spawned b({"quantize", llama2xs(), out, "--type", "q4_0", "--force", "-t", "1"});
        REQUIRE(a.wait(120));
        REQUIRE(b.wait(120));
        CHECK(a.exit_code() == 0);
        CHECK(b.exit_code() == 0);
        const std::string got = read_file(out);
        CHECK((got == q8 || got == q4));
        CHECK(!has_temporary(dir.path()));
    }
}
