// A mapped file rewritten in place while tern uses it (formats/mapped_file.h): MappedFile::changed and
// check_mapped_files on files written, grown, touched and replaced by rename; then `tern run`, `tern chat` and
// `tern serve` (over loopback) on a copy of stories260K rewritten in place under them: one line naming the file
// and exit 3, the server's request a 500 naming it.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "formats/mapped_file.h"
#include "tests/gguf_rewrite.h"
#include "tests/spawn_support.h"
#include "tests/test_support.h"

using namespace tern;
using namespace tern::test;

namespace {

// Sets the file's modification time to an hour ago: a write after it changes the time whatever the file
// system's timestamp granularity (a write within the same clock tick as the open could keep it).
void age(const std::filesystem::path& p) {
    struct timespec times[2];
    ::clock_gettime(CLOCK_REALTIME, &times[0]);
    times[0].tv_sec -= 3600;
    times[1] = times[0];
    REQUIRE(::utimensat(AT_FDCWD, p.c_str(), times, 0) == 0);
}

// Writes `bytes` at `offset` into the file in place (no truncation, no rename).
void write_in_place(const std::filesystem::path& p, off_t offset, const std::string& bytes) {
    const int fd = ::open(p.c_str(), O_WRONLY);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), offset) == static_cast<ssize_t>(bytes.size()));
    ::close(fd);
}

std::string changed_message(const std::string& path) {
    return path + ": the file changed while tern was using it (rewritten in place: its size or modification time "
                  "is not what it was when it was opened), so what was computed from it since may be wrong; write "
                  "model files to a new name and rename them";
}

} // namespace

TEST_CASE("MappedFile notices a write in place, a growth and a touch, never a replacement by rename") {
    TempDir dir;
    const std::filesystem::path p = dir / "data.bin";
    const std::string original(8192, 'a');

    SUBCASE("written in place") {
        write_file(p, original);
        age(p);
        const MappedFile m = MappedFile::open(p.string());
        CHECK(!m.changed());
        CHECK_NOTHROW(check_mapped_files());
        write_in_place(p, 100, "zzzz");
        CHECK(m.changed());
        try {
            check_mapped_files();
            FAIL("check_mapped_files did not throw");
        } catch (const FileChanged& e) {
            CHECK(e.path == p.string());
            CHECK(e.code() == ExitCode::runtime);
            CHECK(std::string(e.what()) == changed_message(p.string()));
        }
    }
    SUBCASE("grown") {
        write_file(p, original);
        const MappedFile m = MappedFile::open(p.string());
        REQUIRE(::truncate(p.c_str(), 16384) == 0);
        CHECK(m.changed());
        CHECK_THROWS_AS(check_mapped_files(), FileChanged);
    }
    SUBCASE("touched: a new modification time counts, as nothing else tells a rewrite of the same bytes") {
        write_file(p, original);
        age(p);
        const MappedFile m = MappedFile::open(p.string());
        REQUIRE(::utimensat(AT_FDCWD, p.c_str(), nullptr, 0) == 0);
        CHECK(m.changed());
    }
    SUBCASE("replaced by rename, renamed, chmod-ed: the mapped file is unchanged") {
        write_file(p, original);
        age(p);
        const MappedFile m = MappedFile::open(p.string());
        write_file(dir / "new.bin", std::string(100, 'b'));
        std::filesystem::rename(dir / "new.bin", p);
        REQUIRE(::chmod(p.c_str(), 0600) == 0);
        CHECK(!m.changed());
        CHECK_NOTHROW(check_mapped_files());
        CHECK(m.bytes()[0] == 'a');
    }
    SUBCASE("a closed file is no longer watched; a moved one still is") {
        write_file(p, original);
        age(p);
        {
            MappedFile m = MappedFile::open(p.string());
            const MappedFile moved = std::move(m);
            write_in_place(p, 0, "x");
            CHECK(moved.changed());
            CHECK(!m.changed()); // NOLINT: the moved-from file watches nothing
            CHECK_THROWS_AS(check_mapped_files(), FileChanged);
        }
        CHECK_NOTHROW(check_mapped_files());
    }
}

// ---- A model rewritten in place under a running tern ----------------------------------------------

namespace {

// A copy of stories260K that never ends a reply by itself (its end-of-text id points at a token the model
// does not write), aged so that the rewrite is seen whatever the timestamp granularity.
std::string endless_copy(const TempDir& dir) {
    const std::string path = rewrite_gguf(dir, stories(), "model.gguf", [](GgufWriter& w) {
        w.set("tokenizer.ggml.eos_token_id", GgufValue::make_u32(0));
    });
    age(path);
    return path;
}

// Zeros over the middle of the file (tensor data), its size unchanged: what a copy over the old file does.
void zero_middle(const std::string& path) {
    const auto size = std::filesystem::file_size(path);
    write_in_place(path, static_cast<off_t>(size / 2), std::string(4096, '\0'));
}

} // namespace

TEST_CASE("tern run on a model rewritten in place mid-run: one line naming the file, exit 3") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string model = endless_copy(dir);
    Spawned run({"run", "-m", model, "-p", "Once upon a time", "-n", "-1", "--temp", "0.8", "--device", "cpu", "-t",
                 "1", "--no-prompt-cache", "--no-repeat-guard"});
    // Mid-run: some text is out.
    REQUIRE(run.wait_until([&] { return run.out().size() > 40; }, 30));
    zero_middle(model);
    REQUIRE(run.wait(30));
    CHECK(run.exit_code() == 3);
    CHECK(run.err() == "tern: " + changed_message(model) + "\n");
}

TEST_CASE("tern chat: a rewrite between turns ends the next turn before its first token") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string model = endless_copy(dir);
    Spawned chat({"chat", "-m", model, "-n", "8", "--device", "cpu", "-t", "1", "--no-prompt-cache", "--json"}, true);
    chat.write_stdin("Hello\n");
    // The first turn's JSON line, whole.
    REQUIRE(chat.wait_until([&] { return chat.out().find('\n') != std::string::npos; }, 30));
    const size_t before = chat.out().size();
    zero_middle(model);
    chat.write_stdin("Tell me more\n");
    chat.close_stdin();
    REQUIRE(chat.wait(30));
    CHECK(chat.exit_code() == 3);
    CHECK(chat.err().find("tern: " + changed_message(model) + "\n") != std::string::npos);
    CHECK(chat.out().size() == before); // nothing of the second turn was printed
}

namespace {

// One HTTP/1.1 request to 127.0.0.1:port with Connection: close; the whole answer, "" when none came in 30 s.
std::string http_post(int port, const std::string& target, const std::string& body) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    const timeval timeout{30, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0);
    const std::string request =
        "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
        "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    REQUIRE(::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size()));
    std::string answer;
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
        answer.append(buf, static_cast<size_t>(n));
    ::close(fd);
    return answer;
}

} // namespace

TEST_CASE("tern serve: a request after the model was rewritten in place fails naming it; the server exits 3") {
    if (!shared_available()) return;
    TempDir dir;
    const std::string model = endless_copy(dir);
    Spawned serve({"serve", "-m", model, "--port", "0", "--device", "cpu", "-t", "1", "--no-prompt-cache"});
    int port = 0;
    REQUIRE(serve.wait_until(
        [&] {
            const std::string err = serve.err();
            const size_t at = err.find("at http://127.0.0.1:");
            if (at == std::string::npos) return false;
            port = std::stoi(err.substr(at + 20));
            return true;
        },
        30));
    const std::string body = R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})";
    const std::string fine = http_post(port, "/v1/completions", body);
    CHECK(fine.rfind("HTTP/1.1 200", 0) == 0);

    zero_middle(model);
    const std::string failed = http_post(port, "/v1/completions", body);
    // A whole (not streamed) answer is written once its result is known: the failure has its own status.
    CHECK(failed.rfind("HTTP/1.1 500", 0) == 0);
    const size_t open = failed.find('{'), close = failed.rfind('}');
    REQUIRE_MESSAGE((open != std::string::npos && close != std::string::npos), failed);
    const nlohmann::json error = nlohmann::json::parse(failed.substr(open, close - open + 1))["error"];
    CHECK(error["message"] == "generation failed: " + changed_message(model));
    CHECK(error["type"] == "server_error");
    REQUIRE(serve.wait(30));
    CHECK(serve.exit_code() == 3);
    const std::string err = serve.err();
    CHECK(err.substr(err.rfind("tern: ")) == "tern: " + changed_message(model) + "\n");
}
