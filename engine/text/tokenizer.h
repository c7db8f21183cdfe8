#pragma once
// Text <-> token ids, exactly as the model was trained, built from `tokenizer.ggml.*` metadata.
// Two families: SentencePiece-style ("llama": scores, byte fallback <0xXX>, U+2581 spaces) and
// byte-level BPE ("gpt2": merges, pre-tokenizer chosen by tokenizer.ggml.pre).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/prompt_text.h"

namespace tern {

class GgufFile;

// tokenizer.ggml.token_type values (the GGUF converters' numbering).
enum class TokenType : int32_t {
    undefined = 0,
    normal = 1,
    unknown = 2,
    control = 3,      // BOS, EOS, <start_of_turn>...: only parsed from text with parse_special
    user_defined = 4, // always matched in text as a whole (Gemma's "\n\n", runs of spaces)
    unused = 5,
    byte = 6, // SentencePiece byte fallback <0xXX>
};

// Everything a tokenizer is built from, in plain form: what from_gguf reads from the
// tokenizer.ggml.* keys, and what tests or `synth` can fill in by hand.
struct VocabSpec {
    std::string source;       // file name, for error messages
    std::string model;        // "llama" (SentencePiece), "gpt2" (byte-level BPE), "bert" (WordPiece)
    std::string pre;          // pre-tokenizer name; "" = "default"
    std::string general_name; // general.name (a few per-model quirks key on it, e.g. phi-3)
    std::vector<std::string> tokens;
    std::vector<float> scores;       // may be empty (all 0)
    std::vector<int32_t> types;      // TokenType values; may be empty (all normal)
    std::vector<std::string> merges; // "left right", BPE only, best first
    int32_t bos = -1, eos = -1, unk = -1, pad = -1, eot = -1, eom = -1, sep = -1, cls = -1, mask = -1;
    std::optional<bool> add_bos, add_eos, add_space_prefix; // unset = the model kind's default
    // tokenizer.ggml.normalizer.* (WordPiece): unset = lower-case, and strip accents when lower-casing.
    std::optional<bool> lowercase, strip_accents;
};

struct EncodeOptions {
    bool add_bos = true;        // also subject to the vocabulary's add_bos rule (see Tokenizer::encode)
    bool parse_special = false; // recognise control/user-defined token texts like "<start_of_turn>"
};

class Tokenizer {
public:
    // Throws InputError naming the file and key when the metadata is missing or inconsistent.
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);
    // Same checks as from_gguf, for a vocabulary given by hand. Throws InputError naming
    // spec.source when it is inconsistent.
    static std::unique_ptr<Tokenizer> from_vocab(VocabSpec spec);
    // Reads the tokenizer.ggml.* keys without building anything.
    static VocabSpec read_vocab(const GgufFile& file);
    virtual ~Tokenizer() = default;

    // BOS is prepended when opts.add_bos AND the vocabulary says to add it (add_bos_token);
    // EOS appended when opts.add_bos AND the vocabulary says add_eos_token (opts.add_bos is
    // llama.cpp's "add_special": --no-bos turns off both).
    virtual std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const = 0;
    // A chat prompt: control-token texts recognised in its markup only, its content read as plain text
    // (user-defined tokens, such as Gemma's runs of newlines, are matched in both, as in any text); BOS and
    // EOS as encode's opts.add_bos. Where the content holds no control-token text, the same tokens as
    // encode(prompt.text(), {add_bos, parse_special = true}).
    virtual std::vector<int32_t> encode_prompt(const PromptText& prompt, bool add_bos) const;
    // The bytes a token stands for (byte tokens -> their byte, U+2581 -> space, byte-level BPE
    // unicode -> raw bytes). Control tokens give "" unless `special` is true.
    virtual std::string token_to_piece(int32_t id, bool special = false) const = 0;
    std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

    virtual int32_t vocab_size() const = 0;
    virtual std::string_view kind() const = 0;                 // "llama" / "gpt2"
    virtual std::string_view pre() const = 0;                  // pre-tokenizer name ("default", "llama-bpe", ...)
    virtual int32_t bos() const = 0;                           // -1 when none
    virtual int32_t eos() const = 0;                           // -1 when none
    virtual bool is_eog(int32_t id) const = 0;                 // end of generation: EOS, EOT, EOM, <end_of_turn>...
    virtual int32_t token_id(std::string_view text) const = 0; // exact vocab entry, -1 if none

    // Additions (not pure, so fakes in other tests need not implement them).
    virtual int32_t unk() const { return -1; }           // -1 when none
    virtual bool add_bos_token() const { return false; } // the vocabulary's rule
    virtual bool add_eos_token() const { return false; }
    virtual TokenType token_type(int32_t /*id*/) const { return TokenType::normal; }
    virtual std::string_view token_text(int32_t /*id*/) const { return {}; } // raw vocab entry
    // True when encoding puts a space before the text (SentencePiece's add_space_prefix);
    // decode() then drops one leading space from the first piece so decode(encode(x)) == x.
    virtual bool add_space_prefix() const { return false; }
};

// Streaming decode: feed ids one at a time, get only complete UTF-8 characters back; bytes of a
// character split across tokens are held until it completes. flush() returns what is left
// (invalid sequences as U+FFFD).
class StreamDecoder {
public:
    explicit StreamDecoder(const Tokenizer& tok, bool special = false) : tok_(tok), special_(special) {}
    std::string push(int32_t id);
    std::string flush();

private:
    const Tokenizer& tok_;
    bool special_;
    std::string pending_;
};

} // namespace tern
