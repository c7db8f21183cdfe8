// `tern run --batch FILE` end to end on the smallest shared model (llama2xs-tok512-q4_0): each output
// line equals a single `tern run` of the same prompt and seed, input order (and --unordered), a bad
// line among good ones gets its own "error" line, and the input file is checked like every input.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/spawn_support.h"
#include "tests/test_support.h"

using namespace tern::test;
using nlohmann::json;

namespace {

std::string model_path() { return shared_path("models/gguf/llama2xs-tok512-q4_0.gguf").string(); }

CommandResult run(std::vector<std::string> args, const std::string& stdin_text = "") {
    std::vector<std::string> all = {"run", "-m", model_path(), "--device", "cpu", "-t", "1", "--no-prompt-cache"};
    all.insert(all.end(), args.begin(), args.end());
    return run_tern(all, stdin_text);
}

std::vector<json> json_lines(const std::string& out) {
    std::vector<json> lines;
    std::istringstream in(out);
    for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
    return lines;
}

// The completion a single `tern run` prints for `args`.
std::string single(std::vector<std::string> args) {
    const CommandResult r = run(args);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    return r.out;
}

const char* kBatch =
    R"({"id": "greedy", "prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}
{"id": "sampled", "prompt": "The little dog", "max_tokens": 20, "seed": 11, "temperature": 0.9}
{"prompt": "Tom and Lily", "max_tokens": 16, "seed": 5}

{"id": 4, "prompt": "x", "max_tokens": "many"}
{"id": "stop", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": ["girl"]}
not json at all
{"id": "long", "prompt": "Once upon a time", "max_tokens": 100000}
)";

} // namespace

TEST_CASE("run --batch: lines in input order, each equal to a single run with the same seed; bad lines get errors") {
    if (!shared_available()) return;
    TempDir dir;
    write_file(dir / "in.jsonl", kBatch);
    const CommandResult r = run({"--batch", (dir / "in.jsonl").string()});
    CHECK_MESSAGE(r.exit_code == 2, r.err);   // some lines were refused
    const std::vector<json> out = json_lines(r.out);
    REQUIRE(out.size() == 7);

    CHECK(out[0]["id"] == "greedy");
    CHECK(out[0]["text"] == single({"-p", "Once upon a time", "-n", "24", "--temp", "0"}));
    CHECK(out[0]["n_gen"] == 24);
    CHECK(out[0]["stop_reason"] == "length");
    CHECK(out[0]["n_prompt"] == 5);
    CHECK_FALSE(out[0].contains("seed"));   // greedy: no seed to report

    CHECK(out[1]["id"] == "sampled");
    CHECK(out[1]["seed"] == 11);
    CHECK(out[1]["text"] == single({"-p", "The little dog", "-n", "20", "--seed", "11", "--temp", "0.9"}));

    CHECK(out[2]["id"] == 3);   // no id: the line number
    CHECK(out[2]["text"] == single({"-p", "Tom and Lily", "-n", "16", "--seed", "5"}));

    CHECK(out[3]["id"] == 4);   // its own id
    CHECK(out[3]["error"]["param"] == "max_tokens");
    CHECK(out[3]["error"]["message"] == "max_tokens: expected an integer, got a string");

    CHECK(out[4]["id"] == "stop");
    CHECK(out[4]["text"] == single({"-p", "Once upon a time", "-n", "40", "--temp", "0", "--stop", "girl"}));

    CHECK(out[5]["id"] == 7);   // not JSON: its line number (the blank line 4 counts, though it is no request)
    CHECK(out[5]["error"]["code"] == "invalid_json");
    CHECK(out[6]["error"]["code"] == "context_length_exceeded");

    CHECK(r.err.find("tern: batch: 7 of 7 requests, 3 refused") != std::string::npos);
}

TEST_CASE("run --batch: a number beyond a double refuses its own line only, naming the field") {
    if (!shared_available()) return;
    const CommandResult r =
        run({"--batch", "-"}, R"({"id": "a", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
{"id": "b", "prompt": "x", "temperature": 1e400}
{"prompt": "x", "max_tokens": -1e999999}
{"id": "d", "prompt": "The little dog", "max_tokens": 4, "temperature": 0}
)");
    CHECK_MESSAGE(r.exit_code == 2, r.err); // some lines were refused, the others served
    const std::vector<json> out = json_lines(r.out);
    REQUIRE(out.size() == 4);
    CHECK(out[0]["id"] == "a");
    CHECK(out[0]["n_gen"] == 4);
    CHECK(out[1]["id"] == 2); // the line could not be read, so its id is its line number
    CHECK(out[1]["error"]["type"] == "invalid_request_error");
    CHECK(out[1]["error"]["param"] == "temperature");
    CHECK(out[1]["error"]["message"].get<std::string>().find("temperature: 1e400 is beyond the range of a double") ==
          0);
    CHECK(out[2]["error"]["param"] == "max_tokens");
    CHECK(out[3]["id"] == "d");
    CHECK(out[3]["n_gen"] == 4);
    CHECK(r.err.find("tern: batch: 4 of 4 requests, 2 refused") != std::string::npos);
}

TEST_CASE("run --batch: a prompt line's control-token text is the token, text with --no-parse-special") {
    if (!shared_available()) return;
    const std::string line = R"({"prompt": "</s>", "max_tokens": 1, "temperature": 0})"
                             "\n";
    const CommandResult special = run({"--batch", "-"}, line);
    const CommandResult text = run({"--batch", "-", "--no-parse-special"}, line);
    REQUIRE_MESSAGE(special.exit_code == 0, special.err);
    REQUIRE_MESSAGE(text.exit_code == 0, text.err);
    CHECK(json_lines(special.out)[0]["n_prompt"] == 2); // BOS and </s>
    CHECK(json_lines(text.out)[0]["n_prompt"].get<int>() > 2);
    CHECK(run({"--batch", "-", "--chat", "--no-parse-special"}, line).exit_code == 1);
}

TEST_CASE("run --batch --unordered --parallel: the same lines, as they finish; stdin with -") {
    if (!shared_available()) return;
    const CommandResult ordered = run({"--batch", "-"}, kBatch);
    const CommandResult unordered = run({"--batch", "-", "--unordered", "--parallel", "4"}, kBatch);
    CHECK(unordered.exit_code == 2);
    std::vector<std::string> a, b;
    for (const json& j : json_lines(ordered.out)) a.push_back(j.dump());
    for (json j : json_lines(unordered.out)) {
        if (j.contains("timings")) j.erase("timings");
        b.push_back(j.dump());
    }
    for (std::string& s : a) {
        json j = json::parse(s);
        if (j.contains("timings")) j.erase("timings");
        s = j.dump();
    }
    REQUIRE(a.size() == b.size());
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    CHECK(a == b);
}

TEST_CASE("run --batch: good lines only exit 0; messages go through the chat template; --chat wraps prompts") {
    if (!shared_available()) return;
    const std::string in = R"({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}
{"messages": [{"role": "system", "content": "Be nice."}, {"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
)";
    const CommandResult r = run({"--batch", "-"}, in);
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const std::vector<json> out = json_lines(r.out);
    REQUIRE(out.size() == 2);
    // The model has no template: chatml with a note, as `run --chat` does.
    const std::string chat = single({"-p", "Hi", "--chat", "--system", "Be nice.", "-n", "8", "--temp", "0"});
    CHECK(out[1]["text"] == chat);
    CHECK(r.err.find("chat template") != std::string::npos);

    const CommandResult wrapped = run({"--batch", "-", "--chat", "--system", "Be nice."},
                                      R"({"prompt": "Hi", "max_tokens": 8, "temperature": 0})");
    REQUIRE(wrapped.exit_code == 0);
    CHECK(json_lines(wrapped.out)[0]["text"] == chat);
}

TEST_CASE("run --batch: the input file is checked like every input; flags that cannot apply are refused") {
    if (!shared_available()) return;
    TempDir dir;
    CommandResult r = run({"--batch", (dir / "missing.jsonl").string()});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("missing.jsonl: cannot open the batch file (--batch)") != std::string::npos);
    CHECK(r.out.empty());

    r = run({"--batch", dir.path().string()});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("is a directory") != std::string::npos);

    const std::string fifo = (dir / "fifo").string();
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    r = run({"--batch", fifo});   // refused at once, never blocking on the open
    CHECK(r.exit_code == 2);

    write_file(dir / "in.jsonl", "{\"prompt\": \"a\"}\n");
    const std::string in = (dir / "in.jsonl").string();
    CHECK(run({"--batch", in, "-p", "x"}).exit_code == 1);
    r = run({"--batch", in, "--json"});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("--json: not with --batch") != std::string::npos);
    CHECK(run({"--batch", in, "--lookup"}).exit_code == 1);
    CHECK(run({"-p", "x", "--unordered"}).exit_code == 1);
    CHECK(run({"-p", "x", "--parallel", "2"}).exit_code == 1);
    CHECK(run({"--batch", in, "--parallel", "0"}).exit_code == 1);

    // An empty file: nothing to do, nothing printed on stdout.
    write_file(dir / "empty.jsonl", "\n\n");
    r = run({"--batch", (dir / "empty.jsonl").string()});
    CHECK(r.exit_code == 0);
    CHECK(r.out.empty());
}

TEST_CASE("run --batch: Ctrl-C writes the lines finished so far and exits 130") {
    if (!shared_available()) return;
    TempDir dir;
    std::string in;
    for (int i = 0; i < 40; ++i)
        in += "{\"prompt\": \"Once upon a time\", \"max_tokens\": 2000, \"temperature\": 0.8, \"seed\": " +
              std::to_string(i) + "}\n";
    write_file(dir / "in.jsonl", in);
    Spawned p({"run", "-m", model_path(), "--device", "cpu", "-t", "1", "--no-prompt-cache", "-c", "2048",
               "--no-repeat-guard", "--batch", (dir / "in.jsonl").string()});
    REQUIRE(p.wait_until([&] { return !p.out().empty(); }, 60));
    p.signal(SIGINT);
    REQUIRE(p.wait(30));
    CHECK(p.exit_code() == 130);
    const std::vector<json> out = json_lines(p.out());
    CHECK(out.size() >= 1);
    CHECK(out.size() < 40);
    for (const json& j : out) CHECK(j.contains("text"));
    CHECK(p.err().find("interrupted") != std::string::npos);
}
