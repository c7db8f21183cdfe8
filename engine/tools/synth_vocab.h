#pragma once
// The vocabulary of a synthetic model: either every tokenizer.* key of another GGUF file, or a
// built-in SentencePiece ("llama") vocabulary that both tern and llama.cpp accept.
#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "formats/gguf.h"

namespace tern {

struct SynthVocab {
    std::vector<GgufKv> keys;   // tokenizer.* in the order they are written
    int64_t n_tokens = 0;
};

// <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then word pieces ("▁a", "a", "▁b", ...,
// "▁aa", ...) with falling scores until n_tokens entries (n_tokens >= 259 + 1). The pieces give
// generated text something readable; the size gives the lm_head the real shape's cost.
SynthVocab builtin_vocab(int64_t n_tokens);

// A GGUF file asked to give the vocabulary that has none (no tokenizer.ggml.tokens).
struct NoVocabularyError : InputError {
    explicit NoVocabularyError(std::string path_)
        : InputError(path_ + ": the file has no tokenizer.ggml.tokens"), path(std::move(path_)) {}
    std::string path;
};

// Every tokenizer.* key of `path`. Throws InputError when the file is not a readable GGUF,
// NoVocabularyError when it has no tokenizer.ggml.tokens.
SynthVocab vocab_from_file(const std::string& path);

} // namespace tern
