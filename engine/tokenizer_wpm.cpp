// WordPiece ("bert" vocabularies: BERT, BGE and other embedding models), as BERT's uncased
// tokenizer does it: drop control characters, isolate CJK ideographs and punctuation, strip
// accents (NFD minus non-spacing marks), lower-case, split on whitespace, then cut each word
// greedily into the longest vocabulary entries. The GGUF converters spell word-initial entries
// with a U+2581 prefix and continuations bare (BERT's "##x" becomes "x").
#include "engine/tokenizer_impl.h"
#include "engine/unicode.h"

namespace tern::detail {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81"; // U+2581
constexpr size_t kMaxWordChars = 100;               // BERT's max_input_chars_per_word

bool is_cjk(uint32_t cp) {
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

class WpmTokenizer final : public VocabTokenizer {
public:
    explicit WpmTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec)) {
        // BERT frames a sequence as [CLS] ... [SEP].
        if (spec_.bos < 0) spec_.bos = spec_.cls;
        add_bos_ = spec_.add_bos.value_or(spec_.bos >= 0);
        add_eos_ = spec_.add_eos.value_or(appended_eos() >= 0);
        for (const std::string& t : spec_.tokens)
            max_token_len_ = std::max(max_token_len_, t.size());
    }

    bool add_space_prefix() const override { return true; }

protected:
    int32_t appended_eos() const override { return spec_.sep >= 0 ? spec_.sep : spec_.eos; }

    void encode_fragments(const std::vector<Fragment>& fragments, std::vector<int32_t>& out) const override {
        for (const Fragment& f : fragments) {
            if (f.token >= 0)
                out.push_back(f.token);
            else
                for (const std::u32string& w : split_words(f.text))
                    encode_word(w, out);
        }
    }

    std::string normal_piece(int32_t id) const override {
        const std::string& text = spec_.tokens[static_cast<size_t>(id)];
        if (text.compare(0, kSpace.size(), kSpace) != 0) return text;
        std::string out(" ");
        out.append(text, kSpace.size(), std::string::npos);
        return out;
    }

private:
    static std::vector<std::u32string> split_words(std::string_view text) {
        std::vector<std::u32string> words(1);
        std::u32string stripped;
        for (size_t pos = 0; pos < text.size();) {
            const uint32_t cp = unicode::decode_utf8(text, pos);
            const uint8_t flags = unicode::cp_flags(cp);
            if (cp == '\t' || cp == '\n' || cp == '\r' || (flags & unicode::cp_whitespace)) {
                if (!words.back().empty()) words.emplace_back();
                continue;
            }
            if (cp == 0 || cp == 0xFFFD || (flags & unicode::cp_control)) continue;
            // Punctuation in BERT's sense includes the ASCII symbols ($, +, <, ^, `...).
            const bool isolate =
                is_cjk(cp) || (flags & unicode::cp_punct) || (cp < 0x80 && (flags & unicode::cp_symbol));
            stripped.clear();
            unicode::append_stripped_nfd(stripped, cp);
            for (char32_t c : stripped) {
                const uint32_t lower = unicode::to_lower(static_cast<uint32_t>(c));
                if (isolate) {
                    if (!words.back().empty()) words.emplace_back();
                    words.back() += static_cast<char32_t>(lower);
                    words.emplace_back();
                } else {
                    words.back() += static_cast<char32_t>(lower);
                }
            }
        }
        if (words.back().empty()) words.pop_back();
        return words;
    }

    void encode_word(const std::u32string& word, std::vector<int32_t>& out) const {
        if (word.size() > kMaxWordChars) {
            if (spec_.unk >= 0) out.push_back(spec_.unk);
            return;
        }
        std::string utf8(kSpace);
        std::vector<size_t> char_end; // byte offset after each character
        for (char32_t c : word) {
            unicode::append_utf8(utf8, static_cast<uint32_t>(c));
            char_end.push_back(utf8.size());
        }
        const size_t before = out.size();
        size_t start = 0; // byte offset; the first piece includes the U+2581 prefix
        size_t first_char = 0;
        while (first_char < word.size()) {
            int32_t found = -1;
            size_t end_char = word.size();
            for (; end_char > first_char; --end_char) {
                const size_t len = char_end[end_char - 1] - start;
                if (len > max_token_len_) continue;
                found = token_id(std::string_view(utf8).substr(start, len));
                if (found >= 0) break;
            }
            if (found < 0) { // a piece matches nothing: the whole word is unknown
                out.resize(before);
                if (spec_.unk >= 0) out.push_back(spec_.unk);
                return;
            }
            out.push_back(found);
            start = char_end[end_char - 1];
            first_char = end_char;
        }
    }

    size_t max_token_len_ = 0;
};

} // namespace

std::unique_ptr<Tokenizer> make_wpm_tokenizer(VocabSpec spec) {
    return std::make_unique<WpmTokenizer>(std::move(spec));
}

} // namespace tern::detail
