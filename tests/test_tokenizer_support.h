#pragma once
// Shared by the tokenizer tests (header-only: tests/CMakeLists.txt turns every test_*.cpp into
// its own executable): the llama.cpp vocabulary test pairs in ../shared/models/vocab and where
// the Gemma 3 model lives.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/text/tokenizer.h"
#include "tests/test_support.h"

namespace tern::test {

struct VocabCase {
    std::string text;
    std::vector<int32_t> ids;
};

// <name>.inp holds the strings, each followed by a line "__ggml_vocab_test__"; <name>.out has one
// line of space-separated ids per string (no BOS: the reference tokenized without specials).
inline std::vector<VocabCase> read_vocab_cases(const std::filesystem::path& inp, const std::filesystem::path& out) {
    const std::string text = read_file(inp);
    const std::string sep = "\n__ggml_vocab_test__\n";
    std::vector<std::string> strings;
    for (size_t pos = 0; pos < text.size();) {
        const size_t at = text.find(sep, pos);
        if (at == std::string::npos) {
            strings.push_back(text.substr(pos));
            break;
        }
        strings.push_back(text.substr(pos, at - pos));
        pos = at + sep.size();
    }
    std::vector<VocabCase> cases;
    std::istringstream lines(read_file(out));
    std::string line;
    for (size_t i = 0; i < strings.size() && std::getline(lines, line); ++i) {
        VocabCase c{strings[i], {}};
        std::istringstream ids(line);
        int32_t id;
        while (ids >> id)
            c.ids.push_back(id);
        cases.push_back(std::move(c));
    }
    return cases;
}

// TERN_GEMMA, then ~/.cache/tern/models/gemma-3-270m-q4_k_m.gguf, then /tmp/gemma/...; "" if none.
inline std::string find_gemma_model() {
    namespace fs = std::filesystem;
    if (const char* env = std::getenv("TERN_GEMMA"); env && *env && fs::exists(env)) return env;
    if (const char* home = std::getenv("HOME"); home && *home) {
        const fs::path p = fs::path(home) / ".cache/tern/models/gemma-3-270m-q4_k_m.gguf";
        if (fs::exists(p)) return p.string();
    }
    const fs::path tmp = "/tmp/gemma/gemma-3-270m-q4_k_m.gguf";
    return fs::exists(tmp) ? tmp.string() : std::string();
}

// A SentencePiece vocabulary with Gemma's turn markers as control tokens, "\n\n" as a user-defined one and
// byte fallback for everything else: enough to tell a marker from its text without a model file.
// Ids: 0 <unk>, 1 <s>, 2 </s>, 3 <start_of_turn>, 4 <end_of_turn>, 5 "\n\n", then normal pieces, then bytes.
inline std::unique_ptr<Tokenizer> marker_vocab() {
    VocabSpec spec;
    spec.source = "markers";
    spec.model = "llama";
    spec.tokens = {"<unk>",        "<s>",  "</s>",  "<start_of_turn>", "<end_of_turn>",    "\n\n",
                   "\xE2\x96\x81", "user", "model", "hello",           "\xE2\x96\x81hello"};
    spec.types = {2, 3, 3, 3, 3, 4, 1, 1, 1, 1, 1};
    for (int b = 0; b < 256; ++b) {
        char name[8];
        std::snprintf(name, sizeof name, "<0x%02X>", b);
        spec.tokens.emplace_back(name);
        spec.types.push_back(6);
    }
    spec.unk = 0;
    spec.bos = 1;
    spec.eos = 2;
    return Tokenizer::from_vocab(spec);
}

inline std::string ids_to_string(const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t id : ids) {
        if (!s.empty()) s += ' ';
        s += std::to_string(id);
    }
    return s;
}

} // namespace tern::test
