// The bad-input matrix of issue #11: every subcommand against the files and streams people and
// scripts really pass by mistake. Each case runs the built `tern` under a time limit (a hang is
// a failure, not a stuck CI job) and asserts the exit code of ../shared/CLI.md, exactly one line
// on stderr that names the file or flag, nothing on stdout when nothing is due, no crash text
// (sanitizer reports, "terminate called", assertions) and no partial or temporary output files.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace tern;
using test::read_file;
using test::write_file;

namespace {

using tern::test::stories;

// Seconds one case may take; a stuck open() or read on a FIFO would otherwise hang CI. Sanitized
// builds run tern several times slower.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
constexpr int kCaseSeconds = kSanitized ? 240 : 60;

enum class Stdout { file, closed, pipe_closed_early };

struct Setup {
    std::string stdin_file = "/dev/null";
    Stdout out = Stdout::file;
    std::string shell_prefix;   // e.g. "ulimit -f 64;"
};

struct Outcome {
    int code = -1;
    std::string out, err;
};

std::string quote(const std::string& s) {
    std::string q = "'";
    for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return q + "'";
}

// Runs `tern args` through bash so that stdout can be closed (>&-) or be a pipe whose reader
// leaves after one byte; `timeout` turns a hang into exit 124.
Outcome run_tern(const std::vector<std::string>& args, const Setup& s = {}) {
    test::TempDir dir;
    std::string cmd = "timeout -k 5 " + std::to_string(kCaseSeconds) + " " + quote(TERN_BIN);
    for (const std::string& a : args) {
        cmd += ' ';   // appended apart: GCC 12 misreads " " + quote(a) as an overlapping copy (-Wrestrict)
        cmd += quote(a);
    }
    cmd += " <" + quote(s.stdin_file) + " 2>" + quote((dir / "err").string());
    std::string script = s.shell_prefix + "\n";
    switch (s.out) {
    case Stdout::file: script += cmd + " >" + quote((dir / "out").string()) + "\necho $? >"; break;
    case Stdout::closed: script += cmd + " >&-\necho $? >"; break;
    case Stdout::pipe_closed_early: script += cmd + " | head -c 1 >/dev/null\necho ${PIPESTATUS[0]} >"; break;
    }
    script += quote((dir / "rc").string()) + "\n";
    write_file(dir / "script.sh", script);
    const int status = std::system(("bash " + quote((dir / "script.sh").string())).c_str());
    REQUIRE(status == 0);
    Outcome r;
    r.code = std::atoi(read_file(dir / "rc").c_str());
    r.out = read_file(dir / "out");
    r.err = read_file(dir / "err");
    return r;
}

int count_lines(const std::string& s) {
    int n = 0;
    for (char c : s) n += c == '\n';
    return n;
}

// Text that only a crash, an abort or a sanitizer writes.
void check_no_crash_text(const Outcome& r) {
    for (const char* bad : {"terminate called", "Assertion", "AddressSanitizer", "runtime error:", "Segmentation",
                            "internal error", "Aborted", "core dumped", "LeakSanitizer"})
        CHECK_MESSAGE(r.err.find(bad) == std::string::npos, "stderr has '" << bad << "'");
}

// stderr without the note a build with CUDA prints once a model has loaded on a machine without a usable
// GPU ("tern: device auto: ...; running on the cpu"): information about the device, not part of an error
// that comes after it.
std::string without_device_note(const std::string& err) {
    const std::string prefix = "tern: device auto: ";
    if (!err.starts_with(prefix)) return err;
    const size_t end = err.find('\n');
    return end == std::string::npos ? std::string() : err.substr(end + 1);
}

// The error contract: exit code, exactly one line naming `names`, nothing on stdout.
void check_error(const Outcome& r, int code, const std::string& names) {
    CAPTURE(r.err);
    CHECK_MESSAGE(r.code != 124, "tern hung (killed after " << kCaseSeconds << " s)");
    CHECK(r.code == code);
    const std::string err = without_device_note(r.err);
    CHECK(count_lines(err) == 1);
    CHECK(err.starts_with("tern: "));
    CHECK_MESSAGE(err.find(names) != std::string::npos, "the line does not name '" << names << "'");
    CHECK(r.out.empty());
    check_no_crash_text(r);
}

std::vector<std::string> dir_listing(const fs::path& d) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// No width fallbacks for q8_0, so quantize prints nothing but its error on stderr.
std::string llama2xs() { return test::shared_path("models/gguf/llama2xs-tok512-f32.gguf").string(); }
std::string vocab_only() { return test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf").string(); }

// A copy of `src` through GgufWriter with `change` applied to its metadata.
void rewrite(const std::string& src_path, const fs::path& out, const std::function<void(GgufWriter&)>& change,
             uint32_t alignment = 32) {
    const GgufFile src = GgufFile::open(src_path);
    GgufWriter w;
    w.copy_metadata_from(src);
    change(w);
    for (const GgufTensor& t : src.tensors())
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), {t.data, t.n_bytes});
    w.write(out.string(), {}, alignment);
}

// The file with its first tensor's format id replaced by `id` (one no ggml version defines).
void poke_first_tensor_type(const fs::path& file, uint32_t id) {
    const GgufFile f = GgufFile::open(file.string());
    const GgufTensor& t = f.tensors().front();
    std::string bytes = read_file(file);
    std::string record(8, '\0');
    const uint64_t len = t.name.size();
    std::memcpy(record.data(), &len, 8);
    record += t.name;
    const size_t at = bytes.find(record);
    REQUIRE(at != std::string::npos);
    const size_t type_at = at + record.size() + 4 + 8 * static_cast<size_t>(t.n_dims);
    std::memcpy(bytes.data() + type_at, &id, 4);
    write_file(file, bytes);
}

// The files of the matrix, made once per test case in `dir`, by name.
struct BadFiles {
    std::vector<std::pair<std::string, std::string>> unparseable;   // (case, path): exit 2 everywhere
    std::string unknown_arch, vocab;
};

BadFiles make_bad_files(const test::TempDir& dir) {
    BadFiles b;
    const std::string real = read_file(stories());
    auto add = [&](const std::string& name, const std::string& bytes) {
        write_file(dir / name, bytes);
        b.unparseable.push_back({name, (dir / name).string()});
    };
    b.unparseable.push_back({"missing", (dir / "missing.gguf").string()});
    add("empty.gguf", "");
    fs::create_directory(dir / "dir.gguf");
    b.unparseable.push_back({"directory", (dir / "dir.gguf").string()});
    // A FIFO with no writer: open() without O_NONBLOCK would block forever.
    REQUIRE(mkfifo((dir / "fifo.gguf").c_str(), 0644) == 0);
    b.unparseable.push_back({"fifo", (dir / "fifo.gguf").string()});
    fs::create_symlink(dir / "nowhere.gguf", dir / "dangling.gguf");
    b.unparseable.push_back({"dangling symlink", (dir / "dangling.gguf").string()});
    add("page.gguf", "<!DOCTYPE html>\n<html><head><title>stories260K</title></head><body>Not Found</body></html>\n");
    add("pointer.gguf", "version https://git-lfs.github.com/spec/v1\noid sha256:"
                        "2d4f0a2c8a0a1e7b4c9d2f6e8b0a3c5d7e9f1a2b3c4d5e6f7a8b9c0d1e2f3a4b\nsize 1185376\n");
    for (size_t n : {size_t(3), size_t(8), size_t(100), size_t(5000), real.size() / 2, real.size() - 1})
        add("cut-at-" + std::to_string(n) + ".gguf", real.substr(0, n));
    add("zeros.gguf", std::string(64 * 1024, '\0'));
    add("random.gguf", [] {
        std::mt19937 rng(11);
        std::string s(4096, '\0');
        for (char& c : s) c = static_cast<char>(rng());
        return s;
    }());
    rewrite(stories(), dir / "unknown-format.gguf", [](GgufWriter&) {});
    poke_first_tensor_type(dir / "unknown-format.gguf", 99);
    b.unparseable.push_back({"unknown tensor format", (dir / "unknown-format.gguf").string()});

    b.unknown_arch = (dir / "unknown-arch.gguf").string();
    rewrite(stories(), b.unknown_arch, [](GgufWriter& w) { w.set("general.architecture", GgufValue::make_string("mamba")); });
    b.vocab = vocab_only();
    return b;
}

// Each subcommand's argument list for a model path; `out` is a fresh directory for outputs.
struct Command {
    std::string name;
    std::function<std::vector<std::string>(const std::string& model, const fs::path& out)> args;
    std::string stdin_text;
};

std::vector<Command> model_commands(const fs::path& text_file) {
    const std::string text = text_file.string();
    return {
        {"run", [](const std::string& m, const fs::path&) { return std::vector<std::string>{"run", "-m", m, "-p", "Once", "-n", "4"}; }, ""},
        {"chat", [](const std::string& m, const fs::path&) { return std::vector<std::string>{"chat", "-m", m, "-n", "4"}; }, "hello\n"},
        {"bench", [](const std::string& m, const fs::path&) {
             return std::vector<std::string>{"bench", "-m", m, "-p", "8", "-n", "4", "-r", "1"}; }, ""},
        {"perplexity", [text](const std::string& m, const fs::path&) {
             return std::vector<std::string>{"perplexity", "-m", m, "-f", text, "-c", "16"}; }, ""},
        {"info", [](const std::string& m, const fs::path&) { return std::vector<std::string>{"info", m}; }, ""},
        {"tokenize", [](const std::string& m, const fs::path&) { return std::vector<std::string>{"tokenize", "-m", m, "-p", "hi"}; }, ""},
        {"quantize", [](const std::string& m, const fs::path& out) {
             return std::vector<std::string>{"quantize", m, (out / "q.gguf").string(), "--type", "q8_0"}; }, ""},
        {"synth --vocab-from", [](const std::string& m, const fs::path& out) {
             return std::vector<std::string>{"synth", (out / "s.gguf").string(), "--shape", "tiny", "--type", "q8_0",
                                             "--vocab-from", m}; }, ""},
    };
}

bool ready() {
    if (!test::shared_available()) {
        MESSAGE("../shared/models is missing: the bad-input matrix is skipped");
        return false;
    }
    return true;
}

// A text of `n` short lines, for perplexity and tokenize.
std::string story_text(int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += "Once upon a time there was a little girl named Lily. She liked to play outside.\n";
    return s;
}

} // namespace

TEST_CASE("every subcommand refuses each broken model file with exit 2, one line naming it, no output files") {
    if (!ready()) return;
    test::TempDir dir;
    const BadFiles bad = make_bad_files(dir);
    write_file(dir / "text.txt", story_text(20));
    for (const Command& c : model_commands(dir / "text.txt")) {
        for (const auto& [what, path] : bad.unparseable) {
            CAPTURE(c.name);
            CAPTURE(what);
            test::TempDir out;
            write_file(dir / "stdin.txt", c.stdin_text);
            const Outcome r = run_tern(c.args(path, out.path()), Setup{(dir / "stdin.txt").string()});
            check_error(r, 2, path);
            CHECK(dir_listing(out.path()).empty());
        }
    }
}

TEST_CASE("an unknown architecture or a vocabulary-only file cannot be run, benched or scored (exit 2)") {
    if (!ready()) return;
    test::TempDir dir;
    const BadFiles bad = make_bad_files(dir);
    write_file(dir / "text.txt", story_text(20));
    for (const Command& c : model_commands(dir / "text.txt")) {
        if (c.name != "run" && c.name != "chat" && c.name != "bench" && c.name != "perplexity") continue;
        CAPTURE(c.name);
        write_file(dir / "stdin.txt", c.stdin_text);
        const Setup s{(dir / "stdin.txt").string()};
        Outcome r = run_tern(c.args(bad.unknown_arch, dir.path()), s);
        check_error(r, 2, bad.unknown_arch);
        CHECK(r.err.find("mamba") != std::string::npos);
        r = run_tern(c.args(bad.vocab, dir.path()), s);
        check_error(r, 2, bad.vocab);
        CHECK(r.err.find("vocabulary-only") != std::string::npos);
    }
    // The commands that only read metadata or the vocabulary describe such files.
    CHECK(run_tern({"info", bad.unknown_arch}).code == 0);
    CHECK(run_tern({"info", bad.vocab}).code == 0);
    const Outcome ids = run_tern({"tokenize", "-m", bad.vocab, "-p", "hello", "--ids"});
    CHECK(ids.code == 0);
    CHECK(!ids.out.empty());
}

TEST_CASE("a context larger than memory fails before allocating: exit 3 naming -c, the need and the remedies") {
    if (!ready()) return;
    test::TempDir dir;
    write_file(dir / "text.txt", story_text(20));
    write_file(dir / "stdin.txt", "hello\n");
    const std::string c = "2000000000";   // 1.2 TB of f16 KV for stories260K
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"run", "-m", stories(), "-p", "Once", "-n", "4", "-c", c},
          std::vector<std::string>{"chat", "-m", stories(), "-n", "4", "-c", c},
          std::vector<std::string>{"bench", "-m", stories(), "-p", "8", "-n", "4", "-r", "1", "-c", c},
          std::vector<std::string>{"perplexity", "-m", stories(), "-f", (dir / "text.txt").string(), "-c", c}}) {
        CAPTURE(args[0]);
        const Outcome r = run_tern(args, Setup{(dir / "stdin.txt").string()});
        check_error(r, 3, "-c " + c);
        CHECK(r.err.find("is available") != std::string::npos);
        CHECK(r.err.find("--kv-type q8_0") != std::string::npos);
    }
    // An address-space limit (ulimit -v) is a limit too. ASan reserves terabytes of shadow
    // address space, so a sanitized tern cannot start under one at all.
    if (!kSanitized) {
        const Outcome r = run_tern({"run", "-m", stories(), "-p", "Once", "-n", "4", "-c", "2000000"},
                               Setup{"/dev/null", Stdout::file, "ulimit -v 1000000;"});
        check_error(r, 3, "-c 2000000");
        CHECK(r.err.find("RLIMIT_AS") != std::string::npos);
    }
}

TEST_CASE("a prompt longer than the context names -c (run: exit 1; perplexity: exit 2 naming the text file)") {
    if (!ready()) return;
    test::TempDir dir;
    write_file(dir / "long.txt", story_text(40));
    check_error(run_tern({"run", "-m", stories(), "-f", (dir / "long.txt").string(), "-c", "32", "-n", "4"}), 1,
                "--ctx-size");
    write_file(dir / "short.txt", "Once upon a time.\n");
    check_error(run_tern({"perplexity", "-m", stories(), "-f", (dir / "short.txt").string(), "-c", "64"}), 2,
                (dir / "short.txt").string());
    // tern chat keeps going after a turn that cannot fit (it is a conversation): the turn is
    // refused with a line naming -c, and the process ends normally at EOF.
    const Outcome r = run_tern({"chat", "-m", stories(), "-c", "32", "-n", "4", "--chat-template", "chatml"},
                           Setup{(dir / "long.txt").string()});
    CHECK(r.code == 0);
    CHECK(r.err.find("raise -c") != std::string::npos);
    check_no_crash_text(r);
}

TEST_CASE("invalid UTF-8 and binary data on stdin or in a file are text like any other: no crash, exit 0") {
    if (!ready()) return;
    test::TempDir dir;
    std::string binary(60, '\0');
    std::mt19937 rng(5);
    for (char& c : binary) c = static_cast<char>(rng());
    binary[7] = '\0';
    write_file(dir / "binary.bin", binary);
    write_file(dir / "invalid-utf8.txt", "abc\xff\xfe\xc0\x80 def \xed\xa0\x80 \xf4\x90\x80\x80 end\n");
    std::string big_binary;
    for (int i = 0; i < 40; ++i) big_binary += binary;
    write_file(dir / "big.bin", big_binary);
    for (const char* input : {"binary.bin", "invalid-utf8.txt"}) {
        CAPTURE(input);
        const Setup s{(dir / input).string()};
        Outcome r = run_tern({"run", "-m", stories(), "-n", "4", "--temp", "0"}, s);
        CHECK(r.code == 0);
        check_no_crash_text(r);
        r = run_tern({"run", "-m", stories(), "-n", "4", "--json"}, s);
        CHECK(r.code == 0);
        // Generated bytes that are not UTF-8 are replaced: the document always parses.
        CHECK(nlohmann::json::accept(r.out));
        r = run_tern({"chat", "-m", stories(), "-n", "4", "--chat-template", "chatml"}, s);
        CHECK(r.code == 0);
        check_no_crash_text(r);
        r = run_tern({"tokenize", "-m", stories(), "-f", "/dev/stdin", "--ids"}, s);
        CHECK(r.code == 0);
        CHECK(!r.out.empty());
        check_no_crash_text(r);
    }
    const Outcome r = run_tern({"perplexity", "-m", stories(), "-f", "/dev/stdin", "-c", "16", "--chunks", "4"},
                           Setup{(dir / "big.bin").string()});
    CHECK(r.code == 0);
    check_no_crash_text(r);
}

TEST_CASE("a closed stdout is an error (exit 3, one line); a reader that leaves early is not") {
    if (!ready()) return;
    test::TempDir dir;
    write_file(dir / "text.txt", story_text(20));
    write_file(dir / "stdin.txt", "hello\n");
    const std::vector<std::vector<std::string>> producers = {
        {"info", stories()},
        {"tokenize", "-m", stories(), "-p", "Once upon a time"},
        {"run", "-m", stories(), "-p", "Once", "-n", "4"},
        {"run", "-m", stories(), "-p", "Once", "-n", "4", "--json"},
        {"chat", "-m", stories(), "-n", "4", "--chat-template", "chatml"},
        {"bench", "-m", stories(), "-p", "8", "-n", "4", "-r", "1", "--json"},
        {"perplexity", "-m", stories(), "-f", (dir / "text.txt").string(), "-c", "16", "--chunks", "2"},
        {"quantize", llama2xs(), "--dry-run", "--type", "q8_0"},
        {"--version"},
    };
    for (const std::vector<std::string>& args : producers) {
        CAPTURE(args[0]);
        const Outcome r = run_tern(args, Setup{(dir / "stdin.txt").string(), Stdout::closed});
        CAPTURE(r.err);
        CHECK(r.code == 3);
        // Commands that report statistics on stderr before printing may have said so; the
        // error is the one line about stdout, and it is the last.
        const size_t last = r.err.rfind('\n', r.err.size() - 2);
        const std::string last_line = r.err.substr(last == std::string::npos ? 0 : last + 1);
        CHECK(last_line.find("stdout is closed") != std::string::npos);
        int stdout_lines = 0;
        for (size_t pos = 0; pos < r.err.size();) {
            const size_t end = r.err.find('\n', pos);
            stdout_lines += r.err.substr(pos, end - pos).find("stdout") != std::string::npos;
            pos = end == std::string::npos ? r.err.size() : end + 1;
        }
        CHECK(stdout_lines == 1);
        check_no_crash_text(r);
    }
    // 2 MB of ids through `head -c 1`: writes fail with EPIPE long before the end; that is the
    // reader's choice, so tern ends quietly with 0.
    write_file(dir / "big.txt", story_text(2000));
    const Outcome r = run_tern({"tokenize", "-m", stories(), "-f", (dir / "big.txt").string(), "--ids"},
                           Setup{"/dev/null", Stdout::pipe_closed_early});
    CHECK(r.code == 0);
    CHECK(r.err.empty());
    // A command that prints nothing does not care that stdout is closed.
    const Outcome q = run_tern({"quantize", llama2xs(), (dir / "q.gguf").string(), "--type", "q8_0"},
                           Setup{"/dev/null", Stdout::closed});
    CHECK(q.code == 0);
    CHECK(fs::exists(dir / "q.gguf"));
}

TEST_CASE("quantize and synth outputs: a missing or read-only directory, a full disk, an existing OUT") {
    if (!ready()) return;
    test::TempDir dir;
    write_file(dir / "plain-file", "not a directory\n");
    const std::string under_file = (dir / "plain-file" / "out.gguf").string();
    check_error(run_tern({"quantize", llama2xs(), under_file, "--type", "q8_0"}), 1, under_file);
    check_error(run_tern({"synth", under_file, "--shape", "tiny", "--type", "q8_0"}), 1, under_file);
    CHECK(dir_listing(dir.path()) == std::vector<std::string>{"plain-file"});

    // Read-only even for root: sysfs refuses new files.
    if (fs::is_directory("/sys/kernel")) {
        const Outcome r = run_tern({"quantize", llama2xs(), "/sys/kernel/tern-bad-input.gguf", "--type", "q8_0"});
        check_error(r, 3, "/sys/kernel/tern-bad-input.gguf");
        CHECK(!fs::exists("/sys/kernel/tern-bad-input.gguf.tmp"));
    }

    // A full disk, as a file-size limit (ulimit -f counts 1024-byte blocks): exit 3, and neither
    // OUT nor OUT.tmp is left behind.
    const Setup full{"/dev/null", Stdout::file, "ulimit -f 64;"};
    for (const std::vector<std::string>& args :
         {std::vector<std::string>{"quantize", llama2xs(), (dir / "q.gguf").string(), "--type", "q8_0"},
          std::vector<std::string>{"synth", (dir / "q.gguf").string(), "--shape", "tiny", "--type", "q8_0"}}) {
        CAPTURE(args[0]);
        check_error(run_tern(args, full), 3, (dir / "q.gguf.tmp").string());
        CHECK(dir_listing(dir.path()) == std::vector<std::string>{"plain-file"});
    }

    // An existing OUT is kept, byte for byte, without --force; OUT == IN is refused with it.
    write_file(dir / "keep.gguf", "precious");
    check_error(run_tern({"quantize", llama2xs(), (dir / "keep.gguf").string(), "--type", "q8_0"}), 1, "--force");
    CHECK(read_file(dir / "keep.gguf") == "precious");
    check_error(run_tern({"quantize", llama2xs(), llama2xs(), "--type", "q8_0", "--force"}), 1, llama2xs());
    CHECK(dir_listing(dir.path()) == std::vector<std::string>{"keep.gguf", "plain-file"});
}

TEST_CASE("a model written with general.alignment = 1 runs like the original (no misaligned loads under UBSan)") {
    if (!ready()) return;
    test::TempDir dir;
    // f32 and f16 rows are read in place from the mapping; with alignment 1 they start at any byte.
    for (const char* name : {"models/gguf/stories260K-f32.gguf", "models/gguf/stories260K-f16.gguf",
                             "models/gguf/babyllama-tok105-q8_0.gguf", "models/gguf/babyllama-tok105-q4_k_m.gguf"}) {
        CAPTURE(name);
        const std::string src = test::shared_path(name).string();
        const fs::path packed = dir / "packed.gguf";
        rewrite(src, packed, [](GgufWriter&) {}, 1);
        const GgufFile f = GgufFile::open(packed.string());
        REQUIRE(f.alignment() == 1);
        bool misaligned = false;
        for (const GgufTensor& t : f.tensors()) misaligned |= reinterpret_cast<uintptr_t>(t.data) % 4 != 0;
        REQUIRE(misaligned);
        // The loader hands the kernels aligned copies of such tensors; files with the default
        // alignment are used in place.
        const Model model = load_model(packed.string());
        CHECK(!model.weights.realigned.empty());
        const auto aligned = [](const WeightRef& w) {
            return !w.present() || reinterpret_cast<uintptr_t>(w.data) % kWeightAlignment == 0;
        };
        CHECK(aligned(model.weights.token_embd));
        CHECK(aligned(model.weights.output_norm));
        CHECK(aligned(model.weights.output));
        for (const LayerWeights& l : model.weights.layers)
            for (const WeightRef* w : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.ffn_norm, &l.w_gate, &l.w_up, &l.w_down})
                CHECK(aligned(*w));
        CHECK(load_model(src).weights.realigned.empty());
        const std::vector<std::string> args = {"-p", "Once upon a time", "-n", "12", "--temp", "0", "--no-prompt-cache"};
        std::vector<std::string> a = {"run", "-m", src};
        a.insert(a.end(), args.begin(), args.end());
        const Outcome want = run_tern(a);
        a[2] = packed.string();
        const Outcome got = run_tern(a);
        CAPTURE(got.err);
        CHECK(want.code == 0);
        CHECK(got.code == 0);
        check_no_crash_text(got);
        CHECK(got.out == want.out);
    }
}

namespace {

// No byte a terminal acts on: controls (newlines aside), DEL, and (unless `c1_ok`) C1 controls in
// UTF-8. JSON output keeps C1 characters as they are, as JSON allows.
void check_terminal_safe(const std::string& text, bool c1_ok = false) {
    CAPTURE(text);
    for (size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        const bool newline = c == '\n';
        CHECK_MESSAGE((newline || (c >= 0x20 && c != 0x7f)), "raw byte " << int(c) << " at " << i);
        if (c == 0xc2 && i + 1 < text.size() && !c1_ok)
            CHECK_MESSAGE(static_cast<unsigned char>(text[i + 1]) > 0x9f, "a C1 control at " << i);
    }
}

const std::string kEscape = "\x1b]0;owned\x07\x1b[31mred\xc2\x9b" "2J";

} // namespace

TEST_CASE("file-provided strings reach the terminal escaped: info's text, error lines, paths") {
    if (!ready()) return;
    test::TempDir dir;
    const fs::path named = dir / "named.gguf";
    rewrite(stories(), named, [](GgufWriter& w) {
        w.set("general.name", GgufValue::make_string("tiny" + kEscape));
        w.set("tokenizer.ggml.pre", GgufValue::make_string("pre" + kEscape));
    });
    Outcome r = run_tern({"info", named.string()});
    CHECK(r.code == 0);
    check_terminal_safe(r.out);
    CHECK(r.out.find("tiny\\x1b]0;owned\\x07\\x1b[31mred\\xc2\\x9b2J") != std::string::npos);
    // --json was already escaped by the JSON writer: the name reads back exactly.
    r = run_tern({"info", "--json", named.string()});
    CHECK(r.code == 0);
    check_terminal_safe(r.out, true);
    CHECK(nlohmann::json::parse(r.out)["name"] == "tiny" + kEscape);

    // A NUL and an escape in the architecture: the error line is whole and shows them as text.
    const fs::path arch = dir / "arch.gguf";
    rewrite(stories(), arch, [](GgufWriter& w) {
        w.set("general.architecture", GgufValue::make_string(std::string("lla\0ma", 6) + kEscape));
    });
    r = run_tern({"run", "-m", arch.string(), "-p", "Once", "-n", "2"});
    check_error(r, 2, "lla\\x00ma\\x1b]0;owned");
    check_terminal_safe(r.err);
    CHECK(r.err.find("is not supported") != std::string::npos);

    // The tokenizer's model name, through the tokenizer's own error.
    const fs::path tok = dir / "tok.gguf";
    rewrite(stories(), tok, [](GgufWriter& w) { w.set("tokenizer.ggml.model", GgufValue::make_string("bpe" + kEscape)); });
    r = run_tern({"tokenize", "-m", tok.string(), "-p", "hi"});
    check_error(r, 2, "\\x1b]0;owned");
    check_terminal_safe(r.err);

    // Tensor names are valid UTF-8 but may hold controls.
    const fs::path tensors = dir / "tensors.gguf";
    {
        const GgufFile src = GgufFile::open(stories());
        GgufWriter w;
        w.copy_metadata_from(src);
        for (const GgufTensor& t : src.tensors())
            w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims), {t.data, t.n_bytes});
        static const float extra[4] = {1, 2, 3, 4};
        w.add_tensor("extra\x1b[2J", GgmlType::F32, {4}, {reinterpret_cast<const uint8_t*>(extra), sizeof extra});
        w.write(tensors.string());
    }
    r = run_tern({"info", "--tensors", tensors.string()});
    CHECK(r.code == 0);
    check_terminal_safe(r.out);
    CHECK(r.out.find("extra\\x1b[2J") != std::string::npos);

    // A path with a newline and an escape in it (missing file): still one line.
    const std::string path = (dir / "evil\n\x1b[2Jname.gguf").string();
    r = run_tern({"run", "-m", path, "-p", "Once"});
    check_error(r, 2, "evil\\n\\x1b[2Jname.gguf");
    check_terminal_safe(r.err);
}

TEST_CASE("out-of-range flags are refused: exit 1, one line naming the flag and the subcommand's help") {
    if (!ready()) return;
    struct Case {
        std::vector<std::string> args;
        std::string flag;
    };
    const std::string m = stories();
    const std::vector<Case> cases = {
        {{"run", "-m", m, "-p", "Once", "-n", "-5"}, "--n-predict"},
        {{"run", "-m", m, "-p", "Once", "-n", "99999999999"}, "--n-predict"},
        {{"run", "-m", m, "-p", "Once", "-t", "100000"}, "--threads"},
        {{"run", "-m", m, "-p", "Once", "-t", "-2"}, "--threads"},
        {{"run", "-m", m, "-p", "Once", "--lookup", "1000"}, "--lookup"},
        {{"run", "-m", m, "-p", "Once", "--lookup", "0"}, "--lookup"},
        {{"run", "-m", m, "-p", "Once", "-ngl", "-5"}, "--gpu-layers"},
        {{"run", "-m", m, "-p", "Once", "--keep", "-7"}, "--keep"},
        {{"run", "-m", m, "-p", "Once", "--keep", "99999999"}, "--keep"},
        {{"run", "-m", m, "-p", "Once", "--chat", "--chat-template", "nosuch"}, "--chat-template"},
        {{"run", "-m", m, "-p", "Once", "--seed", "99999999999999999999"}, "--seed"},
        {{"run", "-m", m, "-p", "Once", "--seed", "-2"}, "--seed"},
        {{"run", "-m", m, "-p", "Once", "--draft-model", m, "--draft-max", "1000"}, "--draft-max"},
        {{"chat", "-m", m, "-n", "-5"}, "--n-predict"},
        {{"chat", "-m", m, "--chat-template", "nosuch"}, "--chat-template"},
        {{"chat", "-m", m, "-t", "100000"}, "--threads"},
        {{"bench", "-m", m, "-t", "100000"}, "--threads"},
        {{"perplexity", "-m", m, "-f", "/dev/null", "-t", "100000"}, "--threads"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.args);
        const Outcome r = run_tern(c.args);
        check_error(r, 1, c.flag);
    }
    // The hint points at the subcommand's own help; the unknown template lists the known names.
    Outcome r = run_tern({"run", "-m", m, "-p", "Once", "-n", "-5"});
    CHECK(r.err.find("'tern run --help'") != std::string::npos);
    r = run_tern({"chat", "-m", m, "--no-such-flag"});
    check_error(r, 1, "'tern chat --help'");
    r = run_tern({"chat", "-m", m, "--chat-template", "nosuch"});
    CHECK(r.err.find("chatml, ") != std::string::npos);
    CHECK(r.err.find("'tern chat --help'") != std::string::npos);
    r = run_tern({"--no-such-flag"});
    check_error(r, 1, "'tern --help'");
}

TEST_CASE("llama.cpp's meanings are accepted: -n -1, --temp below 0 (greedy), --top-k 0 (off), -ngl -1") {
    if (!ready()) return;
    const std::string m = stories();
    const std::vector<std::string> base = {"run", "-m", m, "-p", "Once upon a time", "--no-prompt-cache", "-n", "8"};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> a = base;
        a.insert(a.end(), extra.begin(), extra.end());
        return run_tern(a);
    };
    const Outcome greedy = with({"--temp", "0"});
    REQUIRE(greedy.code == 0);
    const Outcome below = with({"--temp", "-1", "--seed", "7"});
    CHECK(below.code == 0);
    CHECK(below.out == greedy.out);
    CHECK(with({"--top-k", "0", "--seed", "0"}).code == 0);
    CHECK(with({"-ngl", "-1", "--temp", "0"}).out == greedy.out);
    CHECK(with({"-t", "0", "--temp", "0", "--lookup", "--keep", "-1"}).out == greedy.out);
    CHECK(run_tern({"run", "-m", m, "-p", "Once", "-n", "-1", "-c", "32", "--temp", "0"}).code == 0);
}

TEST_CASE("help reads cleanly: --repeat-guard and --no-repeat-guard are two lines, no CLI11 default markers") {
    for (const char* sub : {"run", "chat"}) {
        CAPTURE(sub);
        const Outcome r = run_tern({sub, "--help"});
        CHECK(r.code == 0);
        CHECK(r.out.find("{false}") == std::string::npos);
        CHECK(r.out.find("INT:") == std::string::npos);   // no validator names after the types
        CHECK(r.out.find("--repeat-guard,") == std::string::npos);
        CHECK(r.out.find("  --no-repeat-guard") != std::string::npos);
    }
}

namespace {

// stories260K with `extra` more tokens in its vocabulary than token_embd.weight has rows.
void write_with_extra_tokens(const fs::path& out, int extra) {
    const GgufFile src = GgufFile::open(stories());
    rewrite(stories(), out, [&](GgufWriter& w) {
        std::vector<std::string> tokens;
        for (std::string_view t : src.get_string_array("tokenizer.ggml.tokens")) tokens.emplace_back(t);
        std::vector<float> scores = src.get_f32_array("tokenizer.ggml.scores");
        std::vector<int32_t> types;
        for (int64_t t : src.get_int_array("tokenizer.ggml.token_type")) types.push_back(static_cast<int32_t>(t));
        for (int k = 0; k < extra; ++k) {
            tokens.push_back("extra" + std::to_string(k));
            scores.push_back(-1000.0f - static_cast<float>(k));
            types.push_back(1);
        }
        w.set("tokenizer.ggml.tokens", GgufValue::make_string_array(tokens));
        w.set("tokenizer.ggml.scores", GgufValue::make_f32_array(scores));
        w.set("tokenizer.ggml.token_type", GgufValue::make_i32_array(types));
    });
}

} // namespace

TEST_CASE("a vocabulary that does not match token_embd.weight is refused at load: exit 2, the file and both sizes") {
    if (!ready()) return;
    test::TempDir dir;
    write_file(dir / "text.txt", story_text(8));
    const fs::path more = dir / "more-tokens.gguf";
    write_with_extra_tokens(more, 512);   // 1024 tokens over 512 rows
    for (const Command& c : model_commands(dir / "text.txt")) {
        // info refuses what run refuses at open (the same checks); tokenize, synth and quantize need no model.
        if (c.name == "tokenize" || c.name.starts_with("synth") || c.name == "quantize") continue;
        CAPTURE(c.name);
        write_file(dir / "stdin.txt", c.stdin_text);
        const Outcome r = run_tern(c.args(more.string(), dir.path()), Setup{(dir / "stdin.txt").string()});
        check_error(r, 2, more.string());
        CHECK(r.err.find("1024 tokens (tokenizer.ggml.tokens)") != std::string::npos);
        CHECK(r.err.find("token_embd.weight has 512 rows") != std::string::npos);
        CHECK(r.err.find("512..1023 have no embedding") != std::string::npos);
    }
    // The declared vocab_size must agree too.
    const fs::path declared = dir / "declared.gguf";
    rewrite(stories(), declared, [](GgufWriter& w) { w.set("llama.vocab_size", GgufValue::make_u32(256)); });
    const Outcome r = run_tern({"run", "-m", declared.string(), "-p", "Once", "-n", "2"});
    check_error(r, 2, "llama.vocab_size");
    CHECK(r.err.find("512 rows") != std::string::npos);
}

TEST_CASE("a model whose own context is too small says so, and names -c only when -c was given") {
    if (!ready()) return;
    test::TempDir dir;
    const fs::path tiny = dir / "ctx1.gguf";
    rewrite(stories(), tiny, [](GgufWriter& w) { w.set("llama.context_length", GgufValue::make_u32(1)); });
    Outcome r = run_tern({"run", "-m", tiny.string(), "-p", "Once upon a time", "-n", "4"});
    check_error(r, 2, tiny.string());
    CHECK(r.err.find("the model's own context length is 1 (llama.context_length") != std::string::npos);
    CHECK(r.err.find("--ctx-size") == std::string::npos);
    // Given -c, the same model runs.
    CHECK(run_tern({"run", "-m", tiny.string(), "-p", "Once upon a time", "-n", "4", "-c", "64"}).code == 0);
    r = run_tern({"run", "-m", stories(), "-p", "Once upon a time there was", "-n", "4", "-c", "2"});
    check_error(r, 1, "-c");
}

TEST_CASE("invalid UTF-8 in a metadata string: info and quantize refuse the file (exit 2, the key, the bytes)") {
    if (!ready()) return;
    test::TempDir dir;
    const fs::path bad = dir / "bad-utf8.gguf";
    // The writer refuses such a string too, so a valid placeholder is written and then overwritten
    // in the file's bytes.
    rewrite(stories(), bad, [](GgufWriter& w) {
        w.set("tokenizer.ggml.model", GgufValue::make_string("lla#ma"));
    });
    std::string bytes = read_file(bad);
    const size_t at = bytes.find("lla#ma");
    REQUIRE(at != std::string::npos);
    bytes[at + 3] = '\xff';
    write_file(bad, bytes);
    Outcome r = run_tern({"info", bad.string()});
    check_error(r, 2, "tokenizer.ggml.model");
    CHECK(r.err.find("lla\\xffma") != std::string::npos);
    r = run_tern({"quantize", bad.string(), (dir / "q.gguf").string(), "--type", "q8_0"});
    check_error(r, 2, "tokenizer.ggml.model");
    CHECK(!fs::exists(dir / "q.gguf"));
}
