// `tern chat` end to end. On a pseudo-terminal (forkpty), as a user sees it: the prompt, two turns
// whose /stats show that turn 2 prefilled only its own tokens, a multi-line paste sent as one
// message, a Ctrl-C in the middle of a reply that returns to the prompt, /save then /load in a new
// process continuing with the same greedy reply as an uninterrupted run, colours only without
// NO_COLOR, errors in one line. With stdin not a terminal: one reply per input line on stdout and
// nothing else there. On stories260K (fast) and Gemma 3 270M (a real chat template; skipped when
// absent). The conversation logic itself is test_conversation.cpp.
#include <doctest/doctest.h>

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/test_support.h"
#include "tests/test_tokenizer_support.h"

using namespace tern::test;

namespace {

// Trained on a 128-token context, which a few chatml turns fill: the tests give it 512 so no turn
// is dropped unless a test wants that.

// A `tern chat` child on a pseudo-terminal, read and written like a user would.
class PtyChat {
public:
    PtyChat(const std::vector<std::string>& args, const std::string& state_dir, bool no_color = true) {
        winsize ws{};
        ws.ws_row = 40;
        ws.ws_col = 200;   // wide, so libedit never wraps a line the test looks for
        pid_ = forkpty(&fd_, nullptr, nullptr, &ws);
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            if (no_color) setenv("NO_COLOR", "1", 1);
            else unsetenv("NO_COLOR");
            setenv("XDG_STATE_HOME", state_dir.c_str(), 1);
            // Prefill counts are asserted: a prompt cache shared between the test's processes
            // would change them (the disk cache has its own tests, test_cli_prompt_cache).
            setenv("XDG_CACHE_HOME", state_dir.c_str(), 1);
            std::vector<std::string> all = {TERN_BIN, "chat", "--device", "cpu", "-t", "1", "--temp", "0",
                                            "--no-prompt-cache"};
            all.insert(all.end(), args.begin(), args.end());
            std::vector<char*> argv;
            for (std::string& a : all) argv.push_back(a.data());
            argv.push_back(nullptr);
            execv(TERN_BIN, argv.data());
            _exit(127);
        }
    }
    ~PtyChat() {
        if (pid_ > 0 && !exited_) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
        }
        if (fd_ >= 0) close(fd_);
    }

    // Everything up to and including `pattern` (the rest stays buffered); fails after `seconds`.
    std::string expect(const std::string& pattern, double seconds = 120) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        for (;;) {
            const size_t at = buffer_.find(pattern);
            if (at != std::string::npos) {
                std::string out = buffer_.substr(0, at + pattern.size());
                buffer_.erase(0, at + pattern.size());
                return out;
            }
            if (std::chrono::steady_clock::now() > end || !fill(200)) {
                FAIL_CHECK("no '" << pattern << "' from tern chat; got: " << buffer_);
                return std::exchange(buffer_, {});
            }
        }
    }
    // Waits until some output arrived (a reply has started).
    void wait_output(size_t bytes, double seconds = 120) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (buffer_.size() < bytes && std::chrono::steady_clock::now() < end && fill(200)) {
        }
    }
    // Types text once the editor is surely waiting (libedit switches the terminal to its own mode
    // right after drawing the prompt; input arriving before that is echoed twice).
    void type(const std::string& text) {
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        REQUIRE(write(fd_, text.data(), text.size()) == static_cast<ssize_t>(text.size()));
    }
    // A user turn: the reply is what comes between the echoed line and the next prompt.
    std::string turn(const std::string& line) {
        type(line + "\n");
        expect(line + "\r\n");
        std::string reply = expect(">>> ");
        return reply.substr(0, reply.size() - 4);
    }
    int wait_exit(double seconds = 30) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        int status = 0;
        while (std::chrono::steady_clock::now() < end) {
            fill(100);
            if (waitpid(pid_, &status, WNOHANG) == pid_) {
                exited_ = true;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
        }
        FAIL_CHECK("tern chat did not exit; output: " << buffer_);
        return -1;
    }
    const std::string& pending() const { return buffer_; }

private:
    bool fill(int timeout_ms) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, timeout_ms) <= 0) return true;   // nothing yet: keep waiting
        char buf[4096];
        const ssize_t n = read(fd_, buf, sizeof buf);
        if (n <= 0) return false;   // the child closed the terminal
        buffer_.append(buf, static_cast<size_t>(n));
        return true;
    }

    int fd_ = -1;
    pid_t pid_ = -1;
    bool exited_ = false;
    std::string buffer_;
};

struct Stats {
    long prompt = -1, reused = -1, prefilled = -1, generated = -1, turns = -1, context = -1;
};

// The two lines /stats prints: "last turn: prompt P tokens (R reused, F prefilled, ...), generated
// G tokens ..." and "totals: N turns, ...", "context: C of ...".
Stats stats(PtyChat& chat) {
    chat.type("/stats\n");
    const std::string out = chat.expect(">>> ");
    Stats s;
    std::smatch m;
    if (std::regex_search(out, m,
                          std::regex(R"(last turn: prompt (\d+) tokens \((\d+) reused, (\d+) prefilled.*generated (\d+) tokens)"))) {
        s.prompt = std::stol(m[1]);
        s.reused = std::stol(m[2]);
        s.prefilled = std::stol(m[3]);
        s.generated = std::stol(m[4]);
    }
    if (std::regex_search(out, m, std::regex(R"(totals: (\d+) turns?,)"))) s.turns = std::stol(m[1]);
    if (std::regex_search(out, m, std::regex(R"(context: (\d+) of)"))) s.context = std::stol(m[1]);
    CHECK_MESSAGE(s.prompt >= 0, out);
    return s;
}

} // namespace

TEST_CASE("terminal: two turns, /stats shows turn 2 prefilled only its own tokens, a paste is one message") {
    if (!shared_available()) return;
    TempDir state;
    PtyChat chat({"-m", stories(), "-n", "16", "-c", "512"}, state.path().string());
    chat.expect(">>> ");
    CHECK_FALSE(chat.turn("Once upon a time").empty());
    const Stats s1 = stats(chat);
    CHECK(s1.reused == 0);
    CHECK(s1.prefilled == s1.prompt);
    CHECK(chat.turn("The dog ran").size() > 0);
    const Stats s2 = stats(chat);
    // Turn 2's prompt starts with turn 1's prompt and reply, whose K/V stayed in the cache: all
    // but the reply's last token (sampled, never run through the model) are reused.
    // (all of them when it ended with an end-of-turn token, which the cache holds instead).
    CHECK(s2.reused >= s1.prompt + s1.generated - 1);
    CHECK(s2.reused <= s1.prompt + s1.generated);
    CHECK(s2.prefilled == s2.prompt - s2.reused);
    CHECK(s2.turns == 2);

    // Pasted lines arrive together: one message, one reply.
    chat.type("Lily saw a cat.\nThe cat was big.\nShe smiled.\n");
    chat.expect("She smiled.");
    chat.expect(">>> ");
    const Stats s3 = stats(chat);
    CHECK(s3.turns == 3);
    // A """ block is one message too.
    chat.type("\"\"\"\nfirst line\nsecond line\n\"\"\"\n");
    chat.expect("... \"\"\"");
    chat.expect(">>> ");
    CHECK(stats(chat).turns == 4);

    // Errors: one line, the conversation unchanged.
    chat.type("/frobnicate\n");
    CHECK(chat.expect(">>> ").find("unknown command /frobnicate (/help lists the commands)") != std::string::npos);
    const std::string bad = (state / "not-a-chat.tern").string();
    write_file(bad, "hello, not a conversation");
    chat.type("/load " + bad + "\n");
    const std::string refused = chat.expect(">>> ");
    CHECK(refused.find("not a tern conversation file") != std::string::npos);
    CHECK(refused.find("the conversation is unchanged") != std::string::npos);
    CHECK(stats(chat).context > 0);
    chat.type("\x04");   // Ctrl-D
    CHECK(chat.wait_exit() == 0);
    // The input history was written where XDG_STATE_HOME says.
    CHECK(read_file(state / "tern/chat_history").find("Once") != std::string::npos);
}

TEST_CASE("terminal: /save then /load in a new process gives the same reply as going on") {
    if (!shared_available()) return;
    TempDir state;
    const std::string file = (state / "story.tern").string();
    std::string uninterrupted, resumed;
    long prefilled_uninterrupted = -1;
    {
        PtyChat chat({"-m", stories(), "-n", "24", "-c", "512"}, state.path().string());
        chat.expect(">>> ");
        chat.turn("Once upon a time");
        chat.turn("Tom had a ball");
        chat.type("/save " + file + "\n");
        CHECK(chat.expect(">>> ").find("saved to") != std::string::npos);
        uninterrupted = chat.turn("Then it rained");
        prefilled_uninterrupted = stats(chat).prefilled;
        chat.type("/exit\n");
        CHECK(chat.wait_exit() == 0);
    }
    {
        PtyChat chat({"-m", stories(), "-n", "8", "-c", "512"}, state.path().string());   // -n comes from the file
        chat.expect(">>> ");
        chat.type("/load " + file + "\n");
        CHECK(chat.expect(">>> ").find("loaded") != std::string::npos);
        resumed = chat.turn("Then it rained");
        const Stats s = stats(chat);
        CHECK(s.prefilled == prefilled_uninterrupted);   // the KV came from the file
        CHECK(s.reused > 0);
        chat.type("/exit\n");
        CHECK(chat.wait_exit() == 0);
    }
    CHECK_FALSE(uninterrupted.empty());
    CHECK(resumed == uninterrupted);
}

TEST_CASE("terminal: colours only without NO_COLOR") {
    if (!shared_available()) return;
    TempDir state;
    PtyChat colored({"-m", stories(), "-n", "4"}, state.path().string(), /*no_color=*/false);
    CHECK(colored.expect(">>> ").find("\033[") != std::string::npos);
    colored.type("\x04");
    CHECK(colored.wait_exit() == 0);
    PtyChat plain({"-m", stories(), "-n", "4"}, state.path().string(), /*no_color=*/true);
    CHECK(plain.expect(">>> ").find("\033[") == std::string::npos);
    plain.type("\x04");
    CHECK(plain.wait_exit() == 0);
}

TEST_CASE("terminal, Gemma 3 270M: Ctrl-C stops a reply and the next turn works; Ctrl-C twice quits") {
    const std::string gemma = find_gemma_model();
    if (gemma.empty()) {
        MESSAGE("skipped: Gemma 3 270M not found (set TERN_GEMMA)");
        return;
    }
    TempDir state;
    PtyChat chat({"-m", gemma, "-n", "400", "-c", "2048"}, state.path().string());
    chat.expect(">>> ");
    CHECK_FALSE(chat.turn("What is the capital of France?").empty());
    const Stats s1 = stats(chat);
    chat.type("Write a very long story about a dog.\n");
    chat.expect("dog.\r\n");
    chat.wait_output(20);   // the reply has started
    chat.type("\x03");
    const std::string stopped = chat.expect(">>> ", 60);
    CHECK(stopped.find("^C") != std::string::npos);
    const Stats s2 = stats(chat);
    CHECK(s2.generated < 400);
    CHECK(s2.reused >= s1.prompt + s1.generated - 1);
    CHECK(s2.prefilled == s2.prompt - s2.reused);
    // The conversation goes on after the interrupted reply.
    chat.type("/set n-predict 8\n");
    chat.expect(">>> ");
    CHECK_FALSE(chat.turn("Thanks!").empty());
    CHECK(stats(chat).turns == 3);
    chat.type("\x03");
    CHECK(chat.expect(">>> ").find("Ctrl-C again") != std::string::npos);
    chat.type("\x03");
    CHECK(chat.wait_exit() == 0);
}

TEST_CASE("stdin not a terminal: one reply per line on stdout, nothing else; errors on stderr") {
    if (!shared_available()) return;
    const CommandResult r = run_tern({"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n", "12"},
                                     "Once upon a time\n/frobnicate\n/load /nonexistent/chat.tern\nThe dog ran\n");
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("tern: turn 1:") != std::string::npos);
    CHECK(r.err.find("tern: turn 2:") != std::string::npos);
    CHECK(r.err.find("tern: turn 3:") == std::string::npos);
    CHECK(r.err.find("unknown command /frobnicate") != std::string::npos);
    CHECK(r.err.find("tern: /load: /nonexistent/chat.tern: cannot open") != std::string::npos);
    // Turn 1 is what `tern run --chat` gives for the same message (same template, same tokens).
    const CommandResult one = run_tern({"run", "--chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0",
                                        "-n", "12", "-p", "Once upon a time"});
    REQUIRE(one.exit_code == 0);
    REQUIRE(r.out.size() > one.out.size());
    CHECK(r.out.substr(0, one.out.size() + 1) == one.out + "\n");
    CHECK(r.out.back() == '\n');
    CHECK(r.out.find("tern:") == std::string::npos);
}

TEST_CASE("stdin not a terminal, --json: one JSON object per reply, one per line, whatever the reply holds") {
    if (!shared_available()) return;
    const std::vector<std::string> args = {"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0",
                                           "-n", "24"};
    const std::string script = "Once upon a time\n/stats\nThe dog ran\n";
    std::vector<std::string> with_json = args;
    with_json.push_back("--json");
    const CommandResult r = run_tern(with_json, script);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const CommandResult plain = run_tern(args, script);
    REQUIRE(plain.exit_code == 0);
    // /stats says "1 turn" after the first turn, not "1 turns".
    CHECK(r.err.find("totals: 1 turn,") != std::string::npos);

    std::vector<nlohmann::json> replies;
    size_t begin = 0;
    for (size_t end = r.out.find('\n'); end != std::string::npos; begin = end + 1, end = r.out.find('\n', begin))
        replies.push_back(nlohmann::json::parse(r.out.substr(begin, end - begin)));
    CHECK(begin == r.out.size());   // nothing after the last line
    REQUIRE(replies.size() == 2);
    std::string texts;
    for (size_t i = 0; i < replies.size(); ++i) {
        CHECK(replies[i]["turn"] == i + 1);
        CHECK(replies[i]["n_gen"].get<size_t>() == replies[i]["tokens"].size());
        CHECK(replies[i]["n_gen"].get<int>() > 0);
        CHECK(replies[i]["stop_reason"].is_string());
        texts += replies[i]["text"].get<std::string>() + "\n";
    }
    // The same replies as the plain framing prints, byte for byte (which may hold newlines).
    CHECK(texts == plain.out);

    // On a terminal there is nothing to frame: refused before the model loads.
    TempDir state;
    PtyChat chat({"-m", stories(), "--json"}, state.path().string());
    CHECK(chat.wait_exit() == 1);
    CHECK(chat.pending().find("--json") != std::string::npos);
}

TEST_CASE("a scripted conversation far beyond the context runs to the end") {
    if (!shared_available()) return;
    // 120 turns of ~80 tokens each (prompt and reply) through a 256-token context: about 40
    // contexts' worth, so the oldest turns are dropped over and over.
    std::string script;
    for (int i = 1; i <= 120; ++i) script += "Tell me story number " + std::to_string(i) + " about a cat.\n";
    const CommandResult r = run_tern({"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n",
                                      "32", "-c", "256", "--no-repeat-guard"},
                                     script);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("tern: turn 120:") != std::string::npos);
    size_t notices = 0;
    for (size_t at = r.err.find("dropping its oldest turns"); at != std::string::npos;
         at = r.err.find("dropping its oldest turns", at + 1))
        ++notices;
    CHECK(notices == 1);
    CHECK(r.err.find("stop: context") == std::string::npos);
    // Late turns still reuse the cache: only the new turn is prefilled, not the kept window.
    const size_t last = r.err.find("tern: turn 120:");
    std::smatch m;
    const std::string line = r.err.substr(last, r.err.find('\n', last) - last);
    REQUIRE(std::regex_search(line, m, std::regex(R"(\((\d+) reused, (\d+) prefilled)")));
    CHECK(std::stol(m[1]) > 0);
    CHECK(std::stol(m[2]) < 128);
}
