// WordPiece ("bert" vocabularies: BERT, BGE and other embedding models), with the normaliser
// llama.cpp applies, so that ids agree with it: each code point is replaced by the first code point
// of its canonical decomposition and combining marks are dropped (strip accents), control
// characters are dropped, CJK ideographs and punctuation become words of their own, text is
// lower-cased and split on whitespace; then each word is cut greedily into the longest vocabulary
// entries. The GGUF converters spell word-initial entries with a U+2581 prefix and continuations
// bare (BERT's "##x" becomes "x").
#include <algorithm>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/unicode.h"

namespace tern::detail {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81"; // U+2581
// Up to this entry length (bytes) the longest match is found by hash lookups of each candidate
// length (real vocabularies stay far below: BERT's longest entries are ~20 bytes).
constexpr size_t kHashedMatchLimit = 64;

bool is_cjk(uint32_t cp) {
    // The ranges of HF's BertPreTokenizer, which llama.cpp copies: its extension-E range starts at
    // U+2B920 where the Unicode block starts at U+2B820; the ids follow the tokenizer, not the block.
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) || (cp >= 0x20000 && cp <= 0x2A6DF) ||
           (cp >= 0x2A700 && cp <= 0x2B73F) || (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// Unicode's White_Space property (PropList.txt, unchanged since Unicode 6.3): the set llama.cpp
// splits words on, spelled out so it does not depend on the regex library's Unicode version.
bool is_white_space(uint32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
           cp == 0x3000;
}

class WpmTokenizer final : public VocabTokenizer {
public:
    explicit WpmTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec)) {
        // BERT frames a sequence as [CLS] ... [SEP].
        if (spec_.bos < 0) spec_.bos = spec_.cls;
        add_bos_ = spec_.add_bos.value_or(spec_.bos >= 0);
        add_eos_ = spec_.add_eos.value_or(appended_eos() >= 0);
        // BertNormalizer's options; an absent strip_accents follows lowercase, as in HF and llama.cpp.
        lowercase_ = spec_.lowercase.value_or(true);
        strip_accents_ = spec_.strip_accents.value_or(lowercase_);
        for (const std::string& t : spec_.tokens)
            max_token_len_ = std::max(max_token_len_, t.size());
        if (max_token_len_ > kHashedMatchLimit) {
            sorted_.reserve(spec_.tokens.size());
            for (const std::string& t : spec_.tokens)
                if (!t.empty()) sorted_.emplace_back(t);
            std::sort(sorted_.begin(), sorted_.end());
            sorted_.erase(std::unique(sorted_.begin(), sorted_.end()), sorted_.end());
        }
    }

    bool add_space_prefix() const override { return true; }

protected:
    int32_t appended_eos() const override { return spec_.sep >= 0 ? spec_.sep : spec_.eos; }

    void encode_fragments(const std::vector<Fragment>& fragments, std::vector<int32_t>& out) const override {
        for (const Fragment& f : fragments) {
            if (f.token >= 0)
                out.push_back(f.token);
            else
                for (const std::string& w : split_words(f.text))
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
    // The normalised words of `text`, UTF-8.
    std::vector<std::string> split_words(std::string_view text) const {
        std::vector<std::string> words(1);
        auto finish_word = [&] {
            if (!words.back().empty()) words.emplace_back();
        };
        for (size_t pos = 0; pos < text.size();) {
            uint32_t cp = unicode::decode_utf8(text, pos);
            // One code point in, one out: a decomposition's tail (accents, a Hangul syllable's vowel
            // and final consonant) is dropped with it.
            if (strip_accents_) cp = unicode::nfd_first(cp);
            const uint8_t flags = unicode::cp_flags(cp);
            if (is_white_space(cp)) {
                finish_word();
                continue;
            }
            // Unassigned code points are no control characters in llama.cpp's tables: they stay.
            const bool control = (flags & unicode::cp_control) && !(flags & unicode::cp_unassigned);
            if (cp == 0 || cp == 0xFFFD || control) continue;
            if (strip_accents_ && (flags & unicode::cp_mark)) continue;
            // Punctuation in BERT's sense includes the ASCII symbols ($, +, <, ^, `...).
            const bool isolate =
                (flags & unicode::cp_punct) || (cp < 0x7F && (flags & unicode::cp_symbol)) || is_cjk(cp);
            if (isolate) finish_word();
            unicode::append_utf8(words.back(), lowercase_ ? unicode::to_lower(cp) : cp);
            if (isolate) words.emplace_back();
        }
        if (words.back().empty()) words.pop_back();
        return words;
    }

    // Greedy longest match from the left, over bytes, of "▁" + word; no length limit on the word
    // (llama.cpp has none; HF's 100-character limit is not applied). A position where nothing
    // matches makes the whole word UNK.
    void encode_word(const std::string& word, std::vector<int32_t>& out) const {
        const std::string text = std::string(kSpace) + word;
        const size_t before = out.size();
        for (size_t start = 0; start < text.size();) {
            const std::string_view rest = std::string_view(text).substr(start);
            const size_t len = longest_entry(rest);
            if (len == 0) {
                out.resize(before);
                if (spec_.unk >= 0) out.push_back(spec_.unk);
                return;
            }
            out.push_back(token_id(rest.substr(0, len)));
            start += len;
        }
    }

    // The byte length of the longest vocabulary entry `text` starts with, 0 if none.
    size_t longest_entry(std::string_view text) const {
        if (sorted_.empty()) { // every entry is short: look each candidate length up, longest first
            for (size_t len = std::min(text.size(), max_token_len_); len > 0; --len)
                if (token_id(text.substr(0, len)) >= 0) return len;
            return 0;
        }
        // Some entry is long (a crafted vocabulary): trying every length would cost its length
        // squared at each position. Walk the sorted entries like a trie instead, narrowing to
        // those that share the next byte, so the cost grows with the match only.
        auto lo = sorted_.begin(), hi = sorted_.end();
        size_t best = 0;
        for (size_t d = 0; d < text.size() && lo != hi; ++d) {
            // [lo, hi) share text[0, d); the one equal to it, if any, sorts first.
            const auto c = static_cast<unsigned char>(text[d]);
            lo = std::lower_bound(lo, hi, c, [d](std::string_view t, unsigned char v) {
                return t.size() <= d || static_cast<unsigned char>(t[d]) < v;
            });
            hi = std::upper_bound(
                lo, hi, c, [d](unsigned char v, std::string_view t) { return v < static_cast<unsigned char>(t[d]); });
            if (lo != hi && lo->size() == d + 1) best = d + 1;
        }
        return best;
    }

    bool lowercase_ = true;
    bool strip_accents_ = true;
    size_t max_token_len_ = 0;
    std::vector<std::string_view> sorted_; // when some entry is long: the distinct entries in byte order
};

} // namespace

std::unique_ptr<Tokenizer> make_wpm_tokenizer(VocabSpec spec) {
    return std::make_unique<WpmTokenizer>(std::move(spec));
}

} // namespace tern::detail
