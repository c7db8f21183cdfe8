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

TEST_CASE("tern tokenize: WordPiece and phi-3 edge cases give llama.cpp's ids") {
    // Expected ids from llama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist): `printf '%s' TEXT |
    // llama-tokenize -m VOCAB --stdin --no-escape --ids --log-disable [--no-parse-special]`.
    if (!test::shared_available()) {
        MESSAGE("SKIPPED: ../shared not found");
        return;
    }
    // A decomposed accent (e + U+0301), Hangul syllables (leading jamo only), Devanagari with
    // spacing and non-spacing vowel signs (all dropped).
    auto r = test::run_tern({"tokenize", "-m", vocab("bert-bge"), "-p",
                             "Cafe\xCC\x81 au lait, \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 "
                             "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\xA8\xE0\xA5\x8D\xE0\xA4\xA6\xE0\xA5\x80",
                             "--ids"});
    CHECK(r.exit_code == 0);
    CHECK(r.out == "101 7668 8740 21110 2102 1010 1469 29991 29999 1339 29863 29861 102\n");
    // A 300-letter word: cut into pieces like any other, not one [UNK].
    std::string want = "101 19557";
    for (int i = 0; i < 148; ++i)
        want += " 3676";
    want += " 2497 102\n";
    std::string word;
    for (int i = 0; i < 150; ++i)
        word += "ab";
    r = test::run_tern({"tokenize", "-m", vocab("bert-bge"), "-p", word, "--ids"});
    CHECK(r.exit_code == 0);
    CHECK(r.out == want);
    // phi-3's </s> is typed user-defined but is an end-of-generation text, so control: literal
    // text unless --parse-special (llama-tokenize parses specials by default).
    r = test::run_tern({"tokenize", "-m", vocab("phi-3"), "-p", "a </s> b", "--ids"});
    CHECK(r.out == "1 263 1533 29879 29958 289\n");
    r = test::run_tern({"tokenize", "-m", vocab("phi-3"), "-p", "a </s> b", "--ids", "--parse-special"});
    CHECK(r.out == "1 263 29871 2 289\n");
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
