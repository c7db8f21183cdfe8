// The signal matrix: SIGINT once and twice, SIGTERM and SIGHUP while quantize or synth write their
// output, while perplexity scores, and around chat's /save. Exit codes (../shared/CLI.md and
// formats/atomic_file.h): SIGINT exits 130; SIGTERM and SIGHUP end tern by the same signal (a
// shell shows 143 and 129). Every way of stopping leaves no temporary file and no partial OUT:
// nothing in the directory but what was there before (and a /save that had finished, whole).
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "tests/spawn_support.h"
#include "tests/test_support.h"

using namespace tern::test;
namespace fs = std::filesystem;

namespace {


struct Way {
    const char* name;
    std::vector<int> signals;
};
const std::vector<Way> kWays = {
    {"SIGINT", {SIGINT}}, {"SIGINT twice", {SIGINT, SIGINT}}, {"SIGTERM", {SIGTERM}}, {"SIGHUP", {SIGHUP}}};

void send(Spawned& p, const Way& way) {
    for (size_t i = 0; i < way.signals.size(); ++i) {
        if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        p.signal(way.signals[i]);
    }
}

// SIGINT: exit 130; SIGTERM / SIGHUP: ended by that signal.
void check_ended(Spawned& p, const Way& way) {
    REQUIRE(p.wait(120));
    if (way.signals[0] == SIGINT) {
        CHECK(p.exited());
        CHECK(p.exit_code() == 130);
    } else {
        CHECK(p.term_signal() == way.signals[0]);
    }
}

// True once a writer's temporary file in `dir` holds some bytes (the write is under way).
bool writing(const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir)) {
        std::error_code ec;
        if (e.path().filename().string().find(".tmp.") != std::string::npos && fs::file_size(e.path(), ec) > 0)
            return true;
    }
    return false;
}

} // namespace

TEST_CASE("signals while synth and quantize write OUT: the exit code of the signal, no temporary file, no OUT") {
    if (!shared_available()) return;
    TempDir in_dir;
    // An input big enough that writing its quantized copy takes seconds on one thread.
    const std::string big = (in_dir / "big.gguf").string();
    REQUIRE(run_tern({"synth", big, "--shape", "gemma3-270m", "--type", "q8_0"}).exit_code == 0);

    for (const Way& way : kWays) {
        CAPTURE(way.name);
        {
            TempDir dir;
            Spawned p({"synth", (dir / "out.gguf").string(), "--shape", "gemma3-270m", "--type", "q8_0", "-t", "1"});
            REQUIRE(p.wait_until([&] { return writing(dir.path()); }, 60));
            send(p, way);
            check_ended(p, way);
            CHECK(fs::is_empty(dir.path()));
        }
        {
            TempDir dir;
            Spawned p({"quantize", big, (dir / "out.gguf").string(), "--type", "q4_0", "-t", "1"});
            REQUIRE(p.wait_until([&] { return writing(dir.path()); }, 60));
            send(p, way);
            check_ended(p, way);
            CHECK(fs::is_empty(dir.path()));
        }
    }
    CHECK(names_in(in_dir.path()) == std::vector<std::string>{"big.gguf"});
}

TEST_CASE("signals while perplexity scores: the exit code of the signal, nothing written") {
    if (!shared_available()) return;
    for (const Way& way : kWays) {
        CAPTURE(way.name);
        TempDir dir;
        Spawned p({"perplexity", "-m", stories(), "-f", wikitext(), "-c", "128", "-t", "1", "--device", "cpu",
                   "--chunks", "3000"},
                  false, dir.path().string());
        // Loaded and scoring (it prints nothing before the end when stderr is not a terminal).
        std::this_thread::sleep_for(std::chrono::milliseconds(1000));
        REQUIRE(p.running());
        send(p, way);
        check_ended(p, way);
        CHECK(fs::is_empty(dir.path()));
    }
}

TEST_CASE("signals around chat's /save: the saved file whole, no temporary file, the exit code of the signal") {
    if (!shared_available()) return;
    for (const Way& way : kWays) {
        CAPTURE(way.name);
        TempDir dir;
        const fs::path file = dir / "chat.tern";
        Spawned p({"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n", "8"}, true);
        p.write_stdin("Once upon a time\n/save " + file.string() + "\n");
        REQUIRE(p.wait_until([&] { return p.err().find("(saved to") != std::string::npos; }, 60));
        send(p, way);
        p.write_stdin("And then\n"); // a scripted chat notices SIGINT at its next line
        check_ended(p, way);
        CHECK(names_in(dir.path()) == std::vector<std::string>{"chat.tern"});
        const std::string bytes = read_file(file);
        CHECK(bytes.rfind("TERNCHAT", 0) == 0);
        // Whole: it loads in a new chat.
        const CommandResult r =
            run_tern({"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n", "4"},
                     "/load " + file.string() + "\n");
        CHECK(r.exit_code == 0);
        CHECK(r.err.find("(loaded " + file.string()) != std::string::npos);
    }
}

TEST_CASE("two chats saving to one file at once: the file is one of them, whole") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string file = (dir / "chat.tern").string();
    for (int round = 0; round < 4; ++round) {
        CAPTURE(round);
        std::string script_a = "Once upon a time\n", script_b = "The little dog\nran home\n";
        for (int i = 0; i < 20; ++i) {
            script_a += "/save " + file + "\n";
            script_b += "/save " + file + "\n";
        }
        Spawned a({"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n", "8"}, true);
        Spawned b({"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n", "8"}, true);
        a.write_stdin(script_a);
        b.write_stdin(script_b);
        a.close_stdin();
        b.close_stdin();
        REQUIRE(a.wait(120));
        REQUIRE(b.wait(120));
        CHECK(a.exit_code() == 0);
        CHECK(b.exit_code() == 0);
        CHECK(a.err().find("cannot save") == std::string::npos);
        CHECK(b.err().find("cannot save") == std::string::npos);
        CHECK(names_in(dir.path()) == std::vector<std::string>{"chat.tern"});
        const CommandResult r =
            run_tern({"chat", "-m", stories(), "--device", "cpu", "-t", "1", "-n", "4"}, "/load " + file + "\n");
        CHECK(r.exit_code == 0);
        const bool one_message = r.err.find("(loaded " + file + ": 2 messages") != std::string::npos;
        const bool two_turns = r.err.find("(loaded " + file + ": 4 messages") != std::string::npos;
        CHECK((one_message || two_turns));
    }
}
