// Files tern reads are untrusted and may be anything: -f and /load take regular files only (a FIFO
// must not block, a directory must not read as empty text, /dev/zero must not be read until memory
// runs out) up to a cap; a conversation file's JSON is bounded in depth and size before it is
// parsed, and every malformed field is one line saying the file is damaged while the chat goes on;
// a model file truncated while mapped ends the run with one line and exit 3, not a silent SIGBUS.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/mapped_file.h"
#include "tests/spawn_support.h"
#include "tests/test_support.h"

using namespace tern;
using namespace tern::test;
namespace fs = std::filesystem;

namespace {


size_t lines(const std::string& s) {
    return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

// Runs tern in the background with a time limit, so a command that blocks (on a FIFO) fails the
// test instead of hanging it.
struct Finished {
    bool in_time = false;
    int code = -1;
    std::string out, err;
};
Finished run_limited(const std::vector<std::string>& args, const std::string& stdin_text = "", double seconds = 60) {
    Spawned p(args, true);
    p.write_stdin(stdin_text);
    p.close_stdin();
    Finished f;
    f.in_time = p.wait(seconds);
    f.code = p.exit_code();
    f.out = p.out();
    f.err = p.err();
    return f;
}

// A conversation file as /save writes it, taken apart so a test can change the JSON and put it
// back together with a valid checksum.
struct ConversationParts {
    std::string header; // magic, version, reserved (16 bytes)
    nlohmann::json doc;
    std::string kv; // u64 n_kv and the KV bytes
};

ConversationParts split(const std::string& bytes) {
    uint64_t n_json = 0;
    std::memcpy(&n_json, bytes.data() + 16, 8);
    ConversationParts p;
    p.header = bytes.substr(0, 16);
    p.doc = nlohmann::json::parse(bytes.substr(24, n_json));
    p.kv = bytes.substr(24 + n_json, bytes.size() - 8 - 24 - n_json);
    return p;
}

std::string join(const ConversationParts& p, const std::string& json_text) {
    std::string out = p.header;
    const uint64_t n = json_text.size();
    out.append(reinterpret_cast<const char*>(&n), 8);
    out += json_text;
    out += p.kv;
    const uint64_t sum = XXH3_64bits(out.data(), out.size());
    out.append(reinterpret_cast<const char*>(&sum), 8);
    return out;
}

std::vector<std::string> chat_args(const std::string& ctx = "256") {
    return {"chat", "-m", stories(), "--device", "cpu", "-t", "1", "--temp", "0", "-n", "8", "-c", ctx};
}

} // namespace

TEST_CASE("-f takes regular files only: /dev/zero, a directory, a FIFO are refused at once (exit 2, one line)") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string fifo = (dir / "fifo").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    const std::string sub = (dir / "texts").string();
    fs::create_directory(sub);
    struct Case {
        std::string file, kind;
    };
    for (const Case& c : {Case{"/dev/zero", "a device"}, Case{"/dev/urandom", "a device"}, Case{sub, "a directory"},
                          Case{fifo, "a FIFO"}}) {
        for (const std::vector<std::string>& cmd :
             {std::vector<std::string>{"run", "-m", stories(), "-n", "2", "-f", c.file},
              std::vector<std::string>{"tokenize", "-m", stories(), "-f", c.file},
              std::vector<std::string>{"perplexity", "-m", stories(), "-f", c.file}}) {
            CAPTURE(cmd[0]);
            CAPTURE(c.file);
            const Finished r = run_limited(cmd, "", 30);
            REQUIRE(r.in_time);
            CHECK(r.code == 2);
            CHECK(r.err.find(c.file) != std::string::npos);
            CHECK(r.err.find(c.kind) != std::string::npos);
            CHECK(lines(r.err) == 1);
            CHECK(r.out.empty());
        }
    }
}

TEST_CASE("-f: a text file over the 512 MiB cap is refused unread (exit 2, the size and the cap named)") {
    if (!shared_available()) return;
    TempDir dir;
    const fs::path big = dir / "big.txt";
    write_file(big, "x");
    fs::resize_file(big, (uint64_t{512} << 20) + 1); // sparse: no disk, no time
    for (const char* sub : {"run", "tokenize"}) {
        const CommandResult r = run_tern({sub, "-m", stories(), "-f", big.string()});
        CHECK(r.exit_code == 2);
        CHECK(r.err.find(big.string()) != std::string::npos);
        CHECK(r.err.find("512 MiB") != std::string::npos);
        CHECK(lines(r.err) == 1);
    }
}

TEST_CASE("run: a prompt on stdin over the cap is refused (exit 2) instead of filling memory") {
    if (!shared_available()) return;
    TempDir dir;
    // /dev/zero as stdin never ends: the read stops at the cap.
    const std::string err = (dir / "stderr").string();
    const std::string cmd = "timeout 120 '" + std::string(TERN_BIN) + "' run -m '" + stories() +
                            "' -n 1 --device cpu </dev/zero >/dev/null 2>'" + err + "'";
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    const std::string message = read_file(err);
    CHECK(message.find("stdin: the prompt is larger than the 512 MiB") != std::string::npos);
    CHECK(lines(message) == 1);
}

TEST_CASE("/load of anything but a sound conversation file: one line, the conversation goes on") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string good = (dir / "good.tern").string();
    {
        const CommandResult r = run_tern(chat_args(), "Once upon a time\n/save " + good + "\n");
        REQUIRE(r.exit_code == 0);
        REQUIRE(fs::exists(good));
    }
    const ConversationParts parts = split(read_file(good));

    const auto with = [&](const std::string& name, const std::function<void(nlohmann::json&)>& change) {
        nlohmann::json j = parts.doc;
        change(j);
        const std::string path = (dir / name).string();
        write_file(path, join(parts, j.dump()));
        return path;
    };
    // 200,000 levels of nesting inside an otherwise valid document, checksum recomputed.
    const std::string deep = (dir / "deep.tern").string();
    {
        std::string text = parts.doc.dump();
        text.pop_back();
        text += ",\"deep\":" + std::string(200000, '[') + std::string(200000, ']') + "}";
        write_file(deep, join(parts, text));
    }
    const std::string fifo = (dir / "fifo.tern").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    fs::create_directory(dir / "subdir");

    struct Case {
        std::string file, says;
    };
    const std::vector<Case> cases = {
        {deep, "deeper than"},
        {with("settings-null.tern", [](nlohmann::json& j) { j["settings"] = nullptr; }),
         "settings: expected an object"},
        {with("settings-string.tern", [](nlohmann::json& j) { j["settings"]["temp"] = "hot"; }),
         "settings.temp: expected a number"},
        {with("settings-huge.tern", [](nlohmann::json& j) { j["settings"]["top_k"] = 1e300; }), "settings.top_k"},
        {with("seed-negative.tern", [](nlohmann::json& j) { j["settings"]["seed"] = -5; }), "settings.seed"},
        {with("tokens-string.tern", [](nlohmann::json& j) { j["tokens"] = "many"; }), "tokens: expected an array"},
        {with("token-float.tern", [](nlohmann::json& j) { j["tokens"][0] = 1.5; }), "tokens: expected token ids"},
        {with("begin-string.tern", [](nlohmann::json& j) { j["messages"][0]["begin"] = "0"; }),
         "messages[].begin: expected an integer"},
        {with("message-null.tern", [](nlohmann::json& j) { j["messages"][0] = nullptr; }),
         "messages: expected objects"},
        {with("dropped-huge.tern", [](nlohmann::json& j) { j["dropped_turns"] = 1ull << 63; }), "dropped_turns"},
        {with("dropped-negative.tern", [](nlohmann::json& j) { j["dropped_tokens"] = -1; }), "dropped_tokens"},
        {with("kv-string.tern", [](nlohmann::json& j) { j["kv_tokens"] = "all"; }), "kv_tokens: expected an integer"},
        {with("stale-missing.tern", [](nlohmann::json& j) { j.erase("stale"); }), "stale: missing"},
        {with("root-array.tern",
              [](nlohmann::json& j) {
                  j = nlohmann::json::array({1, 2});
              }),
         "expected an object"},
        {"/dev/zero", "a device"},
        {(dir / "subdir").string(), "a directory"},
        {fifo, "a FIFO"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.file);
        const Finished r = run_limited(chat_args(), "Once upon a time\n/load " + c.file + "\nThe end\n", 60);
        REQUIRE(r.in_time);
        CHECK(r.code == 0);
        CHECK(r.err.find("tern: /load: " + c.file + ": ") != std::string::npos);
        CHECK(r.err.find(c.says) != std::string::npos);
        CHECK(r.err.find("internal error") == std::string::npos);
        CHECK(r.err.find("(the conversation is unchanged)") != std::string::npos);
        CHECK(lines(r.out) == 2); // both turns were answered
    }
}

TEST_CASE("/load with dropped_turns = INT_MAX, then turns that overflow the context: counts saturate, no UB") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string good = (dir / "good.tern").string();
    REQUIRE(run_tern(chat_args("128"), "Once upon a time\n/save " + good + "\n").exit_code == 0);
    ConversationParts parts = split(read_file(good));
    parts.doc["dropped_turns"] = INT_MAX;
    parts.doc["dropped_tokens"] = INT_MAX;
    const std::string file = (dir / "max.tern").string();
    write_file(file, join(parts, parts.doc.dump()));
    std::string script = "/load " + file + "\n";
    for (int i = 0; i < 12; ++i)
        script += "Tell me another story about the little dog and the big red ball\n";
    script += "/stats\n";
    const CommandResult r = run_tern(chat_args("128"), script);
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("(loaded " + file) != std::string::npos);
    CHECK(r.err.find("dropping its oldest turns") != std::string::npos);
    CHECK(r.err.find(std::to_string(INT_MAX) + " turns dropped") != std::string::npos);
}

TEST_CASE("a mapped file truncated under a read: one line naming it and exit 3, not SIGBUS") {
    TempDir dir;
    const std::string path = (dir / "model.gguf").string();
    write_file(path, std::string(1 << 20, 'g'));
    const std::string err = (dir / "stderr").string();
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        ::dup2(::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), 2);
        MappedFile m = MappedFile::open(path);
        if (::truncate(path.c_str(), 4096) != 0) _exit(20);
        volatile uint8_t sum = 0;
        for (size_t i = 0; i < m.size(); i += 4096)
            sum = static_cast<uint8_t>(sum + m.data()[i]);
        _exit(21); // not reached: the read past the new end faults
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
    const std::string message = read_file(err);
    CHECK(message.rfind("tern: " + path + ": ", 0) == 0);
    CHECK(message.find("truncated") != std::string::npos);
    CHECK(lines(message) == 1);
}

TEST_CASE("tern perplexity on a model file truncated while it runs: exit 3, one line naming the file") {
    if (!shared_available()) return;
    TempDir dir;
    const fs::path model = dir / "model.gguf";
    fs::copy_file(stories(), model);
    Spawned p({"perplexity", "-m", model.string(), "-f", wikitext(), "-c", "128", "-t", "1", "--device", "cpu",
               "--chunks", "3000"});
    // Once the run is under way (loaded and tokenized: well under a second), cut the file to its first page.
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    REQUIRE(p.running());
    REQUIRE(::truncate(model.c_str(), 4096) == 0);
    REQUIRE(p.wait(120));
    if (p.exit_code() == 0) {
        MESSAGE("skipped: the run had read all of the model before the truncation");
        return;
    }
    CHECK(p.exit_code() == 3);
    CHECK(p.err().find("tern: " + model.string() + ": the file became shorter") != std::string::npos);
}
