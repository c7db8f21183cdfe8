// Generated text on a terminal: control characters and bytes that are not UTF-8 never reach it
// (app/standard_streams.cpp through base/terminal_text.h terminal_display), while pipes get the
// model's bytes exactly. A
// random-weight model emits control bytes (ESC among them) within a few hundred tokens, which is
// how the end-to-end case below gets them.
#include <doctest/doctest.h>

#include <poll.h>
#include <pty.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "tests/test_support.h"
#include "base/terminal_text.h"

using namespace tern;

namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

// True when `s` holds a byte a terminal would act on: C0 controls but newline, carriage return
// (the pty turns "\n" into "\r\n") and tab, DEL, or a C1 control spelled in UTF-8.
bool has_terminal_control(const std::string& s) {
    for (size_t i = 0; i < s.size(); ++i) {
        const auto c = static_cast<unsigned char>(s[i]);
        if ((c < 0x20 && c != '\n' && c != '\r' && c != '\t') || c == 0x7F) return true;
        if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) < 0xA0) return true;
    }
    return false;
}

// Runs tern on a pseudo-terminal (stdout a terminal, as a user's) and returns what it printed.
std::string run_on_pty(const std::vector<std::string>& args) {
    int fd = -1;
    const pid_t pid = forkpty(&fd, nullptr, nullptr, nullptr);
    REQUIRE(pid >= 0);
    if (pid == 0) {
        std::vector<std::string> all = {TERN_BIN};
        all.insert(all.end(), args.begin(), args.end());
        std::vector<char*> argv;
        for (std::string& a : all) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::freopen("/dev/null", "w", stderr);   // only stdout is looked at
        execv(TERN_BIN, argv.data());
        _exit(127);
    }
    std::string out;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 200) > 0) {
            char buf[4096];
            const ssize_t n = ::read(fd, buf, sizeof buf);
            if (n <= 0) break;   // the child closed the terminal
            out.append(buf, static_cast<size_t>(n));
        }
        if (std::chrono::steady_clock::now() > end) {
            ::kill(pid, SIGKILL);
            FAIL_CHECK("tern did not finish on the pty");
            break;
        }
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ::close(fd);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    return out;
}

} // namespace

TEST_CASE("terminal_display keeps text, newlines and tabs; replaces controls and broken UTF-8") {
    CHECK(terminal_display("plain text\nnext\tline") == "plain text\nnext\tline");
    CHECK(terminal_display("caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\xA6\x99") == "caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\xA6\x99");
    CHECK(terminal_display("a\x1B[2Jb") == "a" + kReplacement + "[2Jb");   // ESC: clear screen
    CHECK(terminal_display("\r\x07\x7F") == kReplacement + kReplacement + kReplacement);
    CHECK(terminal_display("x\xC2\x9B" "31m") == "x" + kReplacement + "31m");   // U+009B, a C1 CSI
    CHECK(terminal_display("\xC2\xA0") == "\xC2\xA0");                         // U+00A0 is text
    CHECK(terminal_display("\xFF") == kReplacement);                           // never UTF-8
    CHECK(terminal_display("\xE2\x82") == kReplacement + kReplacement);        // a cut character
    CHECK(terminal_display("\xED\xA0\x80") == kReplacement + kReplacement + kReplacement);   // a surrogate
    CHECK(terminal_display("") == "");
}

TEST_CASE("a random-weight model's output: raw bytes on a pipe, nothing a terminal acts on on a pty") {
    test::TempDir dir;
    const std::string model = (dir / "random.gguf").string();
    REQUIRE(test::run_tern({"synth", model, "--shape", "tiny", "--type", "q8_0"}).exit_code == 0);
    const std::vector<std::string> args = {"run", "-m", model, "-p", "Hello", "-n", "300", "--temp", "1",
                                           "--seed", "1", "--no-prompt-cache", "--no-repeat-guard", "-t", "1"};
    const test::CommandResult piped = test::run_tern(args);
    REQUIRE(piped.exit_code == 0);
    REQUIRE(has_terminal_control(piped.out));   // the premise: this model does emit control bytes
    const std::string shown = run_on_pty(args);
    CHECK(!shown.empty());
    CHECK(!has_terminal_control(shown));
    CHECK(shown.find(kReplacement) != std::string::npos);
}
