#pragma once
// What the three tokenizer kinds share: the vocabulary tables, the rules for special tokens in
// text, BOS/EOS, end-of-generation ids and the Tokenizer accessors. Internal to engine/.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/text/tokenizer.h"

namespace tern::detail {

struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// A piece of the input after special tokens were cut out: either plain text or one token.
struct Fragment {
    std::string_view text;
    int32_t token = -1; // >= 0: a special token found in the text
};

class VocabTokenizer : public Tokenizer {
public:
    explicit VocabTokenizer(VocabSpec spec);

    std::vector<int32_t> encode(std::string_view text, const EncodeOptions& opts) const override;
    std::vector<int32_t> encode_prompt(const PromptText& prompt, bool add_bos) const override;
    std::string token_to_piece(int32_t id, bool special) const override;

    int32_t vocab_size() const override { return static_cast<int32_t>(spec_.tokens.size()); }
    std::string_view kind() const override { return spec_.model; }
    std::string_view pre() const override { return spec_.pre; }
    int32_t bos() const override { return spec_.bos; }
    int32_t eos() const override { return spec_.eos; }
    bool is_eog(int32_t id) const override;
    int32_t token_id(std::string_view text) const override;
    int32_t unk() const override { return spec_.unk; }
    bool add_bos_token() const override { return add_bos_; }
    bool add_eos_token() const override { return add_eos_; }
    TokenType token_type(int32_t id) const override;
    std::string_view token_text(int32_t id) const override;

    // Splits `text` at special tokens. Control (and unknown) tokens count only with
    // parse_special, and with `spans` only where their whole text is markup; user-defined ones
    // always. Longer tokens are cut out first, over the whole text, then shorter ones in what is
    // left: the order llama.cpp uses, so ids agree.
    std::vector<Fragment> partition(std::string_view text, bool parse_special, const PromptText* spans = nullptr) const;

protected:
    // Tokenizes the fragments (specials already resolved) and appends the ids.
    virtual void encode_fragments(const std::vector<Fragment>& fragments, std::vector<int32_t>& out) const = 0;
    // The bytes of a normal token (kind-specific: U+2581 -> space, GPT-2 chars -> bytes, ...).
    virtual std::string normal_piece(int32_t id) const = 0;
    // What an EOS-style append uses (BERT appends [SEP]).
    virtual int32_t appended_eos() const { return spec_.eos; }

    bool valid_id(int32_t id) const { return id >= 0 && id < vocab_size(); }
    TokenType type_of(int32_t id) const { return static_cast<TokenType>(spec_.types[static_cast<size_t>(id)]); }

    VocabSpec spec_; // types and scores always sized like tokens after construction
    TokenMap token_to_id_;
    bool add_bos_ = false;
    bool add_eos_ = false;

private:
    std::vector<int32_t> encode_fragments_with_bos(const std::vector<Fragment>& fragments, bool add_bos,
                                                   size_t size_hint) const;
    struct TrieNode {
        std::vector<std::pair<uint8_t, int32_t>> next; // sorted by byte
        int32_t token = -1;
    };
    void build_specials();
    int32_t trie_step(int32_t node, uint8_t byte) const;

    std::vector<int32_t> specials_;        // ids, longest text first
    std::vector<TrieNode> trie_;           // over the texts of specials_
    std::vector<uint8_t> lstrip_, rstrip_; // per id: eat whitespace left / right of the token
    std::vector<int32_t> eog_;
};

// The three kinds; each checks what it needs beyond the shared checks.
std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabSpec spec);
std::unique_ptr<Tokenizer> make_bpe_tokenizer(VocabSpec spec);
std::unique_ptr<Tokenizer> make_wpm_tokenizer(VocabSpec spec);

[[noreturn]] void vocab_error(const VocabSpec& spec, const std::string& what);

} // namespace tern::detail
