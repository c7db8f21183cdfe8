// fuzz entry "tokenizer": every vocabulary in ../shared/models/vocab (loaded once per process)
// encodes the input as text, with and without special-token parsing and as a chat prompt's markup and
// content spans, decodes what it gave, and
// decodes the input read as a list of arbitrary token ids (negative and out-of-range ones too).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "engine/text/tokenizer.h"
#include "base/error.h"
#include "formats/gguf.h"
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {
namespace {

namespace fs = std::filesystem;

fs::path shared_dir() {
    if (const char* env = std::getenv("TERN_SHARED"); env && *env) return env;
    return TERN_SHARED_DIR;
}

// Every vocab file, sorted by name so runs are reproducible. A vocabulary tern refuses to build
// (an unsupported tokenizer kind) is left out; the tokenizer tests own that list.
const std::vector<std::unique_ptr<Tokenizer>>& vocabularies() {
    static const std::vector<std::unique_ptr<Tokenizer>> all = [] {
        std::vector<fs::path> files;
        const fs::path dir = shared_dir() / "models/vocab";
        std::error_code ec;
        for (const auto& e : fs::directory_iterator(dir, ec))
            if (e.path().extension() == ".gguf") files.push_back(e.path());
        std::sort(files.begin(), files.end());
        std::vector<std::unique_ptr<Tokenizer>> out;
        for (const fs::path& f : files) {
            try {
                out.push_back(Tokenizer::from_gguf(GgufFile::open(f.string())));
            } catch (const TernError&) {
            }
        }
        return out;
    }();
    return all;
}

std::vector<int32_t> ids_from_bytes(Input input) {
    std::vector<int32_t> ids(input.size() / 4);
    if (!ids.empty()) std::memcpy(ids.data(), input.data(), ids.size() * 4);
    return ids;
}

void exercise(const Tokenizer& tok, std::string_view text, Input input) {
    for (bool parse_special : {false, true}) {
        const std::vector<int32_t> ids = tok.encode(text, EncodeOptions{true, parse_special});
        for (int32_t id : ids)
            if (id < 0 || id >= tok.vocab_size()) __builtin_trap(); // encode must give valid ids
        (void)tok.decode(ids, parse_special);
    }
    (void)tok.encode(text, EncodeOptions{false, false});
    (void)tok.token_id(text);
    // As a chat prompt: the middle third a message's content, the rest markup around it. All markup reads
    // like text with specials, all content like text without.
    const size_t third = text.size() / 3;
    PromptText prompt;
    prompt.markup(text.substr(0, third)).content(text.substr(third, third)).markup(text.substr(2 * third));
    for (int32_t id : tok.encode_prompt(prompt, true))
        if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
    if (tok.encode_prompt(PromptText().markup(text), true) != tok.encode(text, EncodeOptions{true, true}))
        __builtin_trap();
    if (tok.encode_prompt(PromptText().content(text), true) != tok.encode(text, EncodeOptions{true, false}))
        __builtin_trap();

    // Arbitrary ids: raw (mostly far out of range) and folded into [-2, vocab + 2).
    std::vector<int32_t> ids = ids_from_bytes(input);
    for (bool special : {false, true}) {
        (void)tok.decode(ids, special);
        StreamDecoder stream(tok, special);
        for (int32_t id : ids)
            (void)stream.push(id);
        (void)stream.flush();
    }
    const int64_t span = static_cast<int64_t>(tok.vocab_size()) + 4;
    for (int32_t& id : ids)
        id = static_cast<int32_t>((static_cast<int64_t>(static_cast<uint32_t>(id)) % span) - 2);
    for (bool special : {false, true}) {
        (void)tok.decode(ids, special);
        StreamDecoder stream(tok, special);
        for (int32_t id : ids) {
            (void)stream.push(id);
            (void)tok.token_type(id);
            (void)tok.token_text(id);
        }
        (void)stream.flush();
    }
}

} // namespace

void tokenizer(Input input) {
    const std::string_view text(reinterpret_cast<const char*>(input.data()), input.size());
    for (const auto& tok : vocabularies()) {
        try {
            exercise(*tok, text, input);
        } catch (const TernError&) {
        }
    }
}

} // namespace tern::fuzz
