#pragma once
// Text <-> token ids, exactly as the model was trained, built from `tokenizer.ggml.*` metadata.
// Two families: SentencePiece-style ("llama": scores, byte fallback <0xXX>, U+2581 spaces) and
// byte-level BPE ("gpt2": merges, pre-tokenizer chosen by tokenizer.ggml.pre).
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tern {

class GgufFile;

struct EncodeOptions {
    bool add_bos = true;          // also subject to the vocabulary's add_bos rule (see Tokenizer::encode)
    bool parse_special = false;   // recognise control/user-defined token texts like "<start_of_turn>"
};

class Tokenizer {
public:
    // Throws InputError naming the file and key when the metadata is missing or inconsistent.
    static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& file);
    virtual ~Tokenizer() = default;

    // BOS is prepended when opts.add_bos AND the vocabulary says to add it (add_bos_token);
    // EOS appended when the vocabulary says add_eos_token.
    virtual std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts = {}) const = 0;
    // The bytes a token stands for (byte tokens -> their byte, U+2581 -> space, byte-level BPE
    // unicode -> raw bytes). Control tokens give "" unless `special` is true.
    virtual std::string token_to_piece(int32_t id, bool special = false) const = 0;
    std::string decode(const std::vector<int32_t>& ids, bool special = false) const;

    virtual int32_t vocab_size() const = 0;
    virtual std::string_view kind() const = 0;     // "llama" / "gpt2"
    virtual std::string_view pre() const = 0;      // pre-tokenizer name ("default", "llama-bpe", ...)
    virtual int32_t bos() const = 0;               // -1 when none
    virtual int32_t eos() const = 0;               // -1 when none
    virtual bool is_eog(int32_t id) const = 0;     // end of generation: EOS, EOT, EOM, <end_of_turn>...
    virtual int32_t token_id(std::string_view text) const = 0;   // exact vocab entry, -1 if none
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
