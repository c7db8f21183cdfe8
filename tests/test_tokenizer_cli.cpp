// `tern tokenize` end to end: output shapes (--ids on one line, the readable default), BOS and
// special-token flags, -f reading the file's exact bytes, and the CLI.md error contract.
#include <doctest/doctest.h>

#include <string>

#include "tests/test_support.h"

using namespace tern;

namespace {

std::string vocab(const std::string& name) {
    return test::shared_path("models/vocab/ggml-vocab-" + name + ".gguf").string();
}

} // namespace

TEST_CASE("tern tokenize: --ids, the default listing, BOS and special flags") {
    if (!test::shared_available()) {
        MESSAGE("SKIPPED: ../shared not found");
        return;
    }
    auto r = test::run_tern({"tokenize", "-m", vocab("llama-spm"), "-p", "Hello world", "--ids"});
    CHECK(r.exit_code == 0);
    CHECK(r.out == "1 15043 3186\n");
    r = test::run_tern({"tokenize", "-m", vocab("llama-spm"), "-p", "Hello world", "--ids", "--no-bos"});
    CHECK(r.out == "15043 3186\n");
    r = test::run_tern({"tokenize", "-m", vocab("llama-spm"), "-p", "<s>Hi", "--ids", "--no-bos", "--parse-special"});
    CHECK(r.out.rfind("1 ", 0) == 0);

    r = test::run_tern({"tokenize", "-m", vocab("llama-spm"), "-p", "Hello\n\xF0\x9F\xA6\x99"});
    CHECK(r.exit_code == 0);
    CHECK(r.out == "1\t'<s>'\n15043\t' Hello'\n13\t'\\n'\n243\t'\\xF0'\n162\t'\\x9F'\n169\t'\\xA6'\n"
                   "156\t'\\x99'\n");

    test::TempDir dir;
    test::write_file(dir / "t.txt", "Hello world\n");
    r = test::run_tern({"tokenize", "-m", vocab("gpt-2"), "-f", (dir / "t.txt").string(), "--ids"});
    CHECK(r.exit_code == 0);
    CHECK(r.out == "15496 995 198\n"); // the final newline is part of the text

    // Without -p or -f the text comes from stdin, bytes exactly as -f reads them.
    r = test::run_tern({"tokenize", "-m", vocab("gpt-2"), "--ids"}, "Hello world\n");
    CHECK(r.exit_code == 0);
    CHECK(r.out == "15496 995 198\n");
}

TEST_CASE("tern tokenize: errors are one line with the CLI.md exit codes") {
    auto r = test::run_tern({"tokenize", "-m", vocab("gpt-2"), "-p", "a", "-f", "b"});
    CHECK(r.exit_code == 1);
    r = test::run_tern({"tokenize", "-m", "/nonexistent/model.gguf", "-p", "a"});
    CHECK(r.exit_code == 2);
    r = test::run_tern({"tokenize", "-m", vocab("gpt-2"), "-f", "/nonexistent/text.txt"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("/nonexistent/text.txt") != std::string::npos);
    CHECK(r.err.find('\n') == r.err.size() - 1); // one line
}
