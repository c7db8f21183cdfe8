// Byte-level BPE ("gpt2" vocabularies: GPT-2, Llama 3, Qwen, DeepSeek, Falcon, StarCoder...).
// Text is cut into words by the pre-tokenizer's expressions, each word's bytes are spelled with
// GPT-2's printable stand-in characters, and the merge list is applied best rank first.
#include <queue>
#include <unordered_map>

#include "engine/text/pretokenizer.h"
#include "engine/text/tokenizer_impl.h"
#include "engine/text/unicode.h"

namespace tern::detail {

namespace {

class BpeTokenizer final : public VocabTokenizer {
public:
    explicit BpeTokenizer(VocabSpec spec) : VocabTokenizer(std::move(spec)) {
        add_bos_ = spec_.add_bos.value_or(false);
        add_eos_ = spec_.add_eos.value_or(false);
        // GLM's vocabularies name [gMASK] as BOS, but their chat format writes "[gMASK]<sop>" itself: llama.cpp
        // gives these pre-tokenizers no BOS whatever add_bos_token says, so a prompt does not start with two.
        if (spec_.pre == "glm4" || spec_.pre == "chatglm-bpe") add_bos_ = false;

        const std::vector<std::string> patterns = Pretokenizer::patterns_for(spec_.pre);
        if (patterns.empty()) {
            std::string known;
            for (const std::string& n : Pretokenizer::known_names())
                known += (known.empty() ? "" : ", ") + n;
            vocab_error(spec_, "tokenizer.ggml.pre '" + spec_.pre +
                                   "' is not a known pre-tokenizer, so its ids would be wrong (known: " + known + ")");
        }
        if (spec_.pre.empty()) spec_.pre = "default";
        pretok_ = std::make_unique<Pretokenizer>(patterns);
        // Llama 3's tokenizer looks a whole word up before merging (tiktoken's behaviour); for
        // words that are vocabulary entries this can differ from what the merges would build.
        ignore_merges_ = Pretokenizer::patterns_for(spec_.pre) == Pretokenizer::patterns_for("llama3");

        if (spec_.merges.empty())
            vocab_error(spec_, "tokenizer.ggml.merges is missing or empty (a byte-level BPE "
                               "vocabulary needs its merge list; re-convert the model)");
        ranks_.reserve(spec_.merges.size());
        for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
            const std::string& m = spec_.merges[rank];
            // "left right"; the left part is never empty, so search for the space from 1
            const size_t sp = m.find(' ', 1);
            if (sp == std::string::npos)
                vocab_error(spec_, "tokenizer.ggml.merges[" + std::to_string(rank) + "] '" + m +
                                       "' is not two parts separated by a space (corrupt metadata)");
            const int32_t l = token_id(std::string_view(m).substr(0, sp));
            const int32_t r = token_id(std::string_view(m).substr(sp + 1));
            if (l < 0 || r < 0) continue; // cannot apply: a part is not in the vocabulary
            const int32_t result = token_id(m.substr(0, sp) + m.substr(sp + 1));
            ranks_.emplace(pair_key(l, r), Merge{static_cast<int32_t>(rank), result}); // first rank wins
        }
    }

protected:
    void encode_fragments(const std::vector<Fragment>& fragments, std::vector<int32_t>& out) const override {
        // Natural text repeats words constantly; caching per call keeps encode() thread-safe.
        std::unordered_map<std::string_view, std::vector<int32_t>> cache;
        std::vector<int32_t> word_ids;
        for (const Fragment& f : fragments) {
            if (f.token >= 0) {
                out.push_back(f.token);
                continue;
            }
            for (const PretokenizerSpan& span : pretok_->split(f.text)) {
                const std::string_view word = f.text.substr(span.offset, span.length);
                auto it = cache.find(word);
                if (it == cache.end()) {
                    word_ids.clear();
                    encode_word(word, word_ids);
                    it = cache.emplace(word, word_ids).first;
                }
                out.insert(out.end(), it->second.begin(), it->second.end());
            }
        }
    }

    std::string normal_piece(int32_t id) const override {
        return unicode::bpe_to_bytes(spec_.tokens[static_cast<size_t>(id)]);
    }

private:
    struct Merge {
        int32_t rank;
        int32_t result; // -1 when the merged text is not itself an entry (a malformed vocabulary)
    };
    static uint64_t pair_key(int32_t l, int32_t r) {
        return (static_cast<uint64_t>(l) << 32) | static_cast<uint32_t>(r);
    }

    struct Symbol {
        int32_t prev, next;
        uint32_t start, len; // bytes of the encoded word; len 0 = merged away
        int32_t id;          // vocabulary id of the text, -1 when it has none
    };
    struct Candidate {
        int32_t rank, left, right;
        uint32_t len; // left.len + right.len when queued: stale entries no longer match
        bool operator>(const Candidate& o) const { return rank > o.rank || (rank == o.rank && left > o.left); }
    };

    // One word: a linked list of symbols and a priority queue of candidate merges, so a word of
    // n characters costs O(n log n) (a 10 kB run of one character must not take seconds).
    void encode_word(std::string_view raw, std::vector<int32_t>& out) const {
        const std::string word = unicode::bytes_to_bpe(raw);
        if (ignore_merges_) {
            if (const int32_t id = token_id(word); id >= 0) {
                out.push_back(id);
                return;
            }
        }
        std::vector<Symbol> sym;
        sym.reserve(word.size());
        for (uint32_t pos = 0; pos < word.size();) {
            const auto len = static_cast<uint32_t>(unicode::utf8_seq_len(static_cast<unsigned char>(word[pos])));
            const auto i = static_cast<int32_t>(sym.size());
            sym.push_back({i - 1, i + 1, pos, len, token_id(std::string_view(word).substr(pos, len))});
            pos += len;
        }
        if (sym.empty()) return;
        sym.back().next = -1;

        std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
        auto try_pair = [&](int32_t l, int32_t r) {
            if (l < 0 || r < 0) return;
            const Symbol& a = sym[static_cast<size_t>(l)];
            const Symbol& b = sym[static_cast<size_t>(r)];
            if (a.id < 0 || b.id < 0) return;
            auto it = ranks_.find(pair_key(a.id, b.id));
            if (it == ranks_.end()) return;
            queue.push({it->second.rank, l, r, a.len + b.len});
        };
        for (size_t i = 1; i < sym.size(); ++i)
            try_pair(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));

        while (!queue.empty()) {
            const Candidate c = queue.top();
            queue.pop();
            Symbol& l = sym[static_cast<size_t>(c.left)];
            Symbol& r = sym[static_cast<size_t>(c.right)];
            if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;
            l.id = ranks_.at(pair_key(l.id, r.id)).result;
            l.len += r.len;
            r.len = 0;
            l.next = r.next;
            if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
            try_pair(l.prev, c.left);
            try_pair(c.left, l.next);
        }

        for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
            const Symbol& s = sym[static_cast<size_t>(i)];
            if (s.id >= 0) {
                out.push_back(s.id);
                continue;
            }
            // A character the vocabulary lacks: its single bytes if those are entries (what
            // llama.cpp does), else UNK when there is one.
            const size_t before = out.size();
            for (char ch : std::string_view(word).substr(s.start, s.len))
                if (const int32_t id = token_id(std::string_view(&ch, 1)); id >= 0) out.push_back(id);
            if (out.size() == before && spec_.unk >= 0) out.push_back(spec_.unk);
        }
    }

    std::unique_ptr<Pretokenizer> pretok_;
    std::unordered_map<uint64_t, Merge> ranks_;
    bool ignore_merges_ = false;
};

} // namespace

std::unique_ptr<Tokenizer> make_bpe_tokenizer(VocabSpec spec) {
    return std::make_unique<BpeTokenizer>(std::move(spec));
}

} // namespace tern::detail
