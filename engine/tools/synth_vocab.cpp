#include "engine/tools/synth_vocab.h"

#include <cstdio>
#include <string_view>

#include "base/error.h"

namespace tern {

namespace {

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;

// The n-th string over a-z in length-then-lexicographic order: a..z, aa..zz, aaa...
std::string letters(int64_t n) {
    int64_t len = 1, count = 26;
    while (n >= count) {
        n -= count;
        ++len;
        count *= 26;
    }
    std::string s(static_cast<size_t>(len), 'a');
    for (int64_t i = len - 1; i >= 0; --i) {
        s[static_cast<size_t>(i)] = static_cast<char>('a' + n % 26);
        n /= 26;
    }
    return s;
}

} // namespace

SynthVocab builtin_vocab(int64_t n_tokens) {
    constexpr std::string_view kSpace = "\xE2\x96\x81";   // U+2581, SentencePiece's word-start mark
    std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
    std::vector<float> scores = {0.0f, 0.0f, 0.0f};
    std::vector<int32_t> types = {kUnknown, kControl, kControl};
    for (int b = 0; b < 256; ++b) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
        tokens.emplace_back(buf);
        scores.push_back(0.0f);
        types.push_back(kByte);
    }
    // Word pieces, each with and without the word-start mark. Shorter pieces score higher, as in a
    // trained SentencePiece model, so the tokenizer prefers merging letters into longer pieces.
    tokens.emplace_back(kSpace);
    scores.push_back(-1.0f);
    types.push_back(kNormal);
    for (int64_t n = 0; static_cast<int64_t>(tokens.size()) < n_tokens; ++n) {
        const std::string word = letters(n / 2);
        tokens.push_back(n % 2 == 0 ? std::string(kSpace) + word : word);
        scores.push_back(-2.0f - static_cast<float>(n));
        types.push_back(kNormal);
    }
    tokens.resize(static_cast<size_t>(n_tokens));
    scores.resize(static_cast<size_t>(n_tokens));
    types.resize(static_cast<size_t>(n_tokens));

    SynthVocab v;
    v.n_tokens = n_tokens;
    v.keys = {
        {"tokenizer.ggml.model", GgufValue::make_string("llama")},
        {"tokenizer.ggml.pre", GgufValue::make_string("default")},
        {"tokenizer.ggml.tokens", GgufValue::make_string_array(tokens)},
        {"tokenizer.ggml.scores", GgufValue::make_f32_array(scores)},
        {"tokenizer.ggml.token_type", GgufValue::make_i32_array(types)},
        {"tokenizer.ggml.bos_token_id", GgufValue::make_u32(1)},
        {"tokenizer.ggml.eos_token_id", GgufValue::make_u32(2)},
        {"tokenizer.ggml.unknown_token_id", GgufValue::make_u32(0)},
        {"tokenizer.ggml.add_bos_token", GgufValue::make_bool(true)},
        {"tokenizer.ggml.add_eos_token", GgufValue::make_bool(false)},
    };
    return v;
}

SynthVocab vocab_from_file(const std::string& path) {
    const GgufFile f = GgufFile::open(path);   // InputError for a missing or malformed file
    const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
    if (!tokens || tokens->type != GgufType::array || tokens->elem_type != GgufType::string || tokens->array.empty())
        throw NoVocabularyError(path);
    SynthVocab v;
    v.n_tokens = static_cast<int64_t>(tokens->array.size());
    for (const GgufKv& kv : f.metadata())
        if (kv.key.starts_with("tokenizer.")) v.keys.push_back(kv);
    return v;
}

} // namespace tern
