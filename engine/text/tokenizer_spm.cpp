// SentencePiece-style tokenizer ("llama" vocabularies: Llama 1/2, Mistral v1, Phi-3, Gemma...).
// Spaces become U+2581; starting from single characters, the adjacent pair whose concatenation is
// the best-scoring vocabulary entry is merged until no pair forms an entry. Characters left
// without an entry fall back to <0xXX> byte tokens, or UNK when the vocabulary has none.
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/unicode.h"

namespace tern::detail {

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81"; // U+2581 LOWER ONE EIGHTH BLOCK

class SpmTokenizer final : public VocabTokenizer {
public:
    explicit SpmTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec)) {
        add_bos_ = spec_.add_bos.value_or(true);
        add_eos_ = spec_.add_eos.value_or(false);
        add_space_prefix_ = spec_.add_space_prefix.value_or(true);
        for (int b = 0; b < 256; ++b) {
            static const char hex[] = "0123456789ABCDEF";
            const std::string name = std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
            int32_t id = token_id(name);
            if (id < 0) id = token_id(std::string(1, static_cast<char>(b))); // a few vocabs list raw bytes
            byte_ids_[b] = id;
        }
        // Which characters some entry joins to a following U+2581 ("d▁" in "end▁of", Gemma's
        // ">▁</"). Before any other character a U+2581 starts a piece no entry reaches across,
        // so the text can be cut there and each word merged (and cached) on its own: the
        // result is identical and 1.3 MB takes milliseconds instead of seconds.
        for (const std::string& t : spec_.tokens) {
            for (size_t at = t.find(kSpace, 1); at != std::string::npos; at = t.find(kSpace, at + 1)) {
                size_t start = at - 1;
                while (start > 0 && (static_cast<unsigned char>(t[start]) & 0xC0) == 0x80)
                    --start;
                size_t pos = start;
                const uint32_t cp = unicode::decode_utf8(t, pos);
                if (t.compare(start, kSpace.size(), kSpace) != 0) joins_space_.insert(cp);
            }
        }
    }

    bool add_space_prefix() const override { return add_space_prefix_; }

protected:
    void encode_fragments(const std::vector<Fragment>& fragments, std::vector<int32_t>& out) const override {
        // The space prefix goes before the text at the start and after every special token,
        // matching how the model saw text that followed its control tokens in training.
        bool after_special = true;
        std::string escaped;
        std::unordered_map<std::string, std::vector<int32_t>> cache;
        for (const Fragment& f : fragments) {
            if (f.token >= 0) {
                out.push_back(f.token);
                after_special = true;
                continue;
            }
            escaped.clear();
            if (add_space_prefix_ && after_special) escaped += kSpace;
            for (char c : f.text) {
                if (c == ' ')
                    escaped += kSpace;
                else
                    escaped += c;
            }
            encode_words(escaped, cache, out);
            after_special = false;
        }
    }

    std::string normal_piece(int32_t id) const override {
        const std::string& text = spec_.tokens[static_cast<size_t>(id)];
        std::string out;
        out.reserve(text.size());
        for (size_t i = 0; i < text.size();) {
            if (text.compare(i, kSpace.size(), kSpace) == 0) {
                out += ' ';
                i += kSpace.size();
            } else {
                out += text[i++];
            }
        }
        return out;
    }

private:
    struct Symbol {
        int32_t prev, next;
        uint32_t start, len; // bytes of the escaped text; len 0 = merged away
    };
    struct Bigram {
        int32_t left, right;
        float score;
        uint32_t len; // left.len + right.len when queued: stale entries no longer match
        bool operator<(const Bigram& o) const {
            // priority_queue pops the largest: best score first, then the leftmost pair
            return score < o.score || (score == o.score && left > o.left);
        }
    };

    void encode_words(std::string_view text, std::unordered_map<std::string, std::vector<int32_t>>& cache,
                      std::vector<int32_t>& out) const {
        size_t word_start = 0;
        uint32_t prev = 0x2581;
        auto flush = [&](size_t end) {
            if (end == word_start) return;
            const std::string word(text.substr(word_start, end - word_start));
            auto it = cache.find(word);
            if (it == cache.end()) {
                std::vector<int32_t> ids;
                encode_word(word, ids);
                it = cache.emplace(word, std::move(ids)).first;
            }
            out.insert(out.end(), it->second.begin(), it->second.end());
            word_start = end;
        };
        for (size_t pos = 0; pos < text.size();) {
            const size_t at = pos;
            const uint32_t cp = unicode::decode_utf8(text, pos);
            if (cp == 0x2581 && prev != 0x2581 && !joins_space_.count(prev)) flush(at);
            prev = cp;
        }
        flush(text.size());
    }

    void encode_word(std::string_view text, std::vector<int32_t>& out) const {
        std::vector<Symbol> sym;
        sym.reserve(text.size());
        for (uint32_t pos = 0; pos < text.size();) {
            const auto len = static_cast<uint32_t>(
                std::min<size_t>(unicode::utf8_seq_len(static_cast<unsigned char>(text[pos])), text.size() - pos));
            const auto i = static_cast<int32_t>(sym.size());
            sym.push_back({i - 1, i + 1, pos, len});
            pos += len;
        }
        if (sym.empty()) return;
        sym.back().next = -1;

        std::priority_queue<Bigram> queue;
        auto try_pair = [&](int32_t l, int32_t r) {
            if (l < 0 || r < 0) return;
            const Symbol& a = sym[static_cast<size_t>(l)];
            const Symbol& b = sym[static_cast<size_t>(r)];
            const int32_t id = token_id(text.substr(a.start, a.len + b.len));
            if (id < 0) return;
            queue.push({l, r, spec_.scores[static_cast<size_t>(id)], a.len + b.len});
        };
        for (size_t i = 1; i < sym.size(); ++i)
            try_pair(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));

        while (!queue.empty()) {
            const Bigram bg = queue.top();
            queue.pop();
            Symbol& l = sym[static_cast<size_t>(bg.left)];
            Symbol& r = sym[static_cast<size_t>(bg.right)];
            if (l.len == 0 || r.len == 0 || l.len + r.len != bg.len || l.next != bg.right) continue;
            l.len += r.len;
            r.len = 0;
            l.next = r.next;
            if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = bg.left;
            try_pair(l.prev, bg.left);
            try_pair(bg.left, l.next);
        }

        for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
            const Symbol& s = sym[static_cast<size_t>(i)];
            const std::string_view piece = text.substr(s.start, s.len);
            // Merges only ever form vocabulary entries, so a symbol without an id is a single
            // character the vocabulary lacks.
            if (const int32_t id = token_id(piece); id >= 0) {
                out.push_back(id);
                continue;
            }
            bool all_bytes = true;
            for (char c : piece)
                all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
            if (all_bytes) {
                for (char c : piece)
                    out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
            } else if (spec_.unk >= 0) {
                out.push_back(spec_.unk);
            }
        }
    }

    bool add_space_prefix_ = true;
    int32_t byte_ids_[256];
    std::unordered_set<uint32_t> joins_space_;
};

} // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(VocabSpec spec) {
    return std::make_unique<SpmTokenizer>(std::move(spec));
}

} // namespace tern::detail
