// The tokenizer factory and what every kind shares: reading tokenizer.ggml.*, special tokens in
// text, BOS/EOS, pieces, decode and streaming decode.
#include "engine/text/tokenizer.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "engine/text/tokenizer_impl.h"
#include "engine/text/unicode.h"
#include "base/error.h"
#include "formats/gguf.h"

namespace tern {

namespace detail {

void vocab_error(const VocabSpec& spec, const std::string& what) {
    throw InputError((spec.source.empty() ? std::string("vocabulary") : spec.source) + ": " + what);
}

namespace {

// Marker texts that llama.cpp treats as control tokens whatever type the vocabulary gives them
// (converters often type them user-defined or normal). A control token is only recognised in text
// with parse_special, so following llama.cpp here keeps the ids users compare identical.
//
// Turn ends: the first one present becomes EOT when the metadata names none.
constexpr const char* kEotTexts[] = {
    "<|eot_id|>",         "<|im_end|>", "<|end|>", "<end_of_turn>",
    "<|endoftext|>",      "<EOT>",      "_<EOT>",  "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
};
// Everything that ends generation when present (in addition to EOS, EOT and EOM).
constexpr const char* kEogTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>",      "<|call|>",           "<end_of_turn>", "<|endoftext|>",
    "<|eom_id|>", "<EOT>",      "_<EOT>",  "<|end_of_text|>", "<end_of_utterance>", "</s>",
    "<turn|>",   // gemma4
};
// Fill-in-the-middle markers, one role per row: the first text present in each row.
constexpr std::array<std::array<const char*, 7>, 6> kFimTexts = {{
    {"<|fim_prefix|>", "<fim-prefix>", "<｜fim▁begin｜>", "<fim_prefix>", "<PRE>", "▁<PRE>", "<|code_prefix|>"},
    {"<|fim_suffix|>", "<fim-suffix>", "<｜fim▁hole｜>", "<fim_suffix>", "<SUF>", "▁<SUF>", "<|code_suffix|>"},
    {"<|fim_middle|>", "<fim-middle>", "<｜fim▁end｜>", "<fim_middle>", "<MID>", "▁<MID>", "<|code_middle|>"},
    {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", nullptr, nullptr, nullptr, nullptr},
    {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", nullptr, nullptr},
    {"<|file_sep|>", nullptr, nullptr, nullptr, nullptr, nullptr, nullptr},
}};

bool is_space_byte(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

} // namespace

VocabTokenizer::VocabTokenizer(VocabSpec spec) : spec_(std::move(spec)) {
    const size_t n = spec_.tokens.size();
    if (n == 0) vocab_error(spec_, "tokenizer.ggml.tokens is empty (the file carries no vocabulary)");
    if (n > static_cast<size_t>(INT32_MAX)) vocab_error(spec_, "tokenizer.ggml.tokens has too many entries");
    if (spec_.scores.empty()) spec_.scores.assign(n, 0.0f);
    if (spec_.types.empty()) spec_.types.assign(n, static_cast<int32_t>(TokenType::normal));
    if (spec_.scores.size() != n)
        vocab_error(spec_, "tokenizer.ggml.scores has " + std::to_string(spec_.scores.size()) +
                               " entries but there are " + std::to_string(n) +
                               " tokens (corrupt or mismatched metadata)");
    if (spec_.types.size() != n)
        vocab_error(spec_, "tokenizer.ggml.token_type has " + std::to_string(spec_.types.size()) +
                               " entries but there are " + std::to_string(n) +
                               " tokens (corrupt or mismatched metadata)");
    for (int32_t& t : spec_.types)
        if (t < 0 || t > static_cast<int32_t>(TokenType::byte)) t = static_cast<int32_t>(TokenType::normal);

    const std::pair<int32_t*, const char*> ids[] = {
        {&spec_.bos, "tokenizer.ggml.bos_token_id"},     {&spec_.eos, "tokenizer.ggml.eos_token_id"},
        {&spec_.unk, "tokenizer.ggml.unknown_token_id"}, {&spec_.eot, "tokenizer.ggml.eot_token_id"},
        {&spec_.eom, "tokenizer.ggml.eom_token_id"},     {&spec_.sep, "tokenizer.ggml.seperator_token_id"},
        {&spec_.cls, "tokenizer.ggml.cls_token_id"},     {&spec_.pad, "tokenizer.ggml.padding_token_id"},
        {&spec_.mask, "tokenizer.ggml.mask_token_id"},
    };
    for (auto [id, key] : ids) {
        if (*id < -1 || *id >= static_cast<int32_t>(n))
            vocab_error(spec_, std::string(key) + " is " + std::to_string(*id) + " but the vocabulary has " +
                                   std::to_string(n) + " tokens (corrupt or mismatched metadata)");
    }

    token_to_id_.reserve(n);
    // A repeated text maps to its last id, as llama.cpp's table does, so both agree on ids.
    for (size_t i = 0; i < n; ++i)
        token_to_id_[spec_.tokens[i]] = static_cast<int32_t>(i);

    auto make_control = [&](int32_t id) {
        spec_.types[static_cast<size_t>(id)] = static_cast<int32_t>(TokenType::control);
    };
    if (spec_.eot < 0) {
        for (const char* t : kEotTexts) {
            if (int32_t id = token_id(t); id >= 0) {
                spec_.eot = id;
                break;
            }
        }
    }
    if (spec_.eom < 0) spec_.eom = token_id("<|eom_id|>");
    for (int32_t id : {spec_.eot, spec_.eom})
        if (id >= 0) make_control(id);
    for (const auto& row : kFimTexts) {
        for (const char* t : row) {
            if (!t) break;
            if (int32_t id = token_id(t); id >= 0) {
                make_control(id);
                break;
            }
        }
    }
    for (int32_t id : {spec_.eos, spec_.eot, spec_.eom})
        if (id >= 0) eog_.push_back(id);
    for (const char* t : kEogTexts) {
        if (int32_t id = token_id(t); id >= 0) {
            make_control(id);
            eog_.push_back(id);
        }
    }
    // Harmony (gpt-oss): <|end|> closes a message, not the answer (the analysis channel's message ends with it and
    // the final channel follows); <|return|> and <|call|> end generation. llama.cpp drops it from its list alike.
    if (const int32_t end = token_id("<|end|>"); end >= 0 && token_id("<|return|>") >= 0 && token_id("<|call|>") >= 0)
        std::erase(eog_, end);
    std::sort(eog_.begin(), eog_.end());
    eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

    build_specials();
}

void VocabTokenizer::build_specials() {
    const size_t n = spec_.tokens.size();
    lstrip_.assign(n, 0);
    rstrip_.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
        const auto t = static_cast<TokenType>(spec_.types[i]);
        if ((t == TokenType::control || t == TokenType::user_defined || t == TokenType::unknown) &&
            !spec_.tokens[i].empty())
            specials_.push_back(static_cast<int32_t>(i));
    }
    std::stable_sort(specials_.begin(), specials_.end(), [&](int32_t a, int32_t b) {
        return spec_.tokens[static_cast<size_t>(a)].size() > spec_.tokens[static_cast<size_t>(b)].size();
    });

    // Phi-3's chat tokens swallow the whitespace after them (its tokenizer.json marks them
    // rstrip); the GGUF has no per-token flags, so key on the model name as llama.cpp does.
    std::string name = spec_.general_name;
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
        for (int32_t id : specials_)
            rstrip_[static_cast<size_t>(id)] = 1;
        for (const char* t : {"<unk>", "<s>", "<|endoftext|>"})
            if (int32_t id = token_id(t); id >= 0) rstrip_[static_cast<size_t>(id)] = 0;
        if (int32_t id = token_id("</s>"); id >= 0) rstrip_[static_cast<size_t>(id)] = 1;
    }

    trie_.assign(1, TrieNode{});
    for (int32_t id : specials_) {
        int32_t node = 0;
        for (char c : spec_.tokens[static_cast<size_t>(id)]) {
            const auto b = static_cast<uint8_t>(c);
            int32_t child = trie_step(node, b);
            if (child < 0) {
                child = static_cast<int32_t>(trie_.size());
                auto& next = trie_[static_cast<size_t>(node)].next;
                next.insert(std::lower_bound(next.begin(), next.end(), std::make_pair(b, int32_t{-1})),
                            std::make_pair(b, child));
                trie_.emplace_back();
            }
            node = child;
        }
        trie_[static_cast<size_t>(node)].token = id;
    }
}

int32_t VocabTokenizer::trie_step(int32_t node, uint8_t byte) const {
    const auto& next = trie_[static_cast<size_t>(node)].next;
    auto it = std::lower_bound(next.begin(), next.end(), std::make_pair(byte, int32_t{-1}));
    return it != next.end() && it->first == byte ? it->second : -1;
}

std::vector<Fragment> VocabTokenizer::partition(std::string_view text, bool parse_special,
                                                const PromptText* spans) const {
    std::vector<Fragment> frags;
    if (text.empty()) return frags;
    frags.push_back({text, -1});

    // Whether the special token `id` counts where it was found, at byte `at` of `text`.
    auto eligible = [&](int32_t id, size_t at) {
        if (type_of(id) == TokenType::user_defined) return true;
        if (!parse_special) return false;
        return !spans || spans->is_markup(at, at + spec_.tokens[static_cast<size_t>(id)].size());
    };
    // One pass over the text with the trie finds which special tokens occur at all; only those
    // take part in the longest-first cutting below (Gemma has 6400 specials; most texts hold none).
    std::vector<uint8_t> present(specials_.empty() ? 0 : spec_.tokens.size(), 0);
    bool any = false;
    if (!trie_.empty() && !trie_[0].next.empty()) {
        for (size_t i = 0; i < text.size(); ++i) {
            int32_t node = 0;
            for (size_t j = i; j < text.size(); ++j) {
                node = trie_step(node, static_cast<uint8_t>(text[j]));
                if (node < 0) break;
                const int32_t id = trie_[static_cast<size_t>(node)].token;
                if (id >= 0 && eligible(id, i)) {
                    present[static_cast<size_t>(id)] = 1;
                    any = true;
                }
            }
        }
    }
    if (!any) return frags;

    std::vector<Fragment> next;
    for (int32_t id : specials_) {
        if (!present[static_cast<size_t>(id)]) continue;
        const std::string& tok = spec_.tokens[static_cast<size_t>(id)];
        next.clear();
        for (const Fragment& f : frags) {
            if (f.token >= 0) {
                next.push_back(f);
                continue;
            }
            std::string_view rest = f.text;
            size_t from = 0; // where in `rest` to look: past an occurrence that is content
            while (!rest.empty()) {
                const size_t at = rest.find(tok, from);
                if (at == std::string_view::npos) break;
                if (!eligible(id, static_cast<size_t>(rest.data() + at - text.data()))) {
                    from = at + 1;
                    continue;
                }
                from = 0;
                std::string_view left = rest.substr(0, at);
                if (lstrip_[static_cast<size_t>(id)])
                    while (!left.empty() && is_space_byte(left.back()))
                        left.remove_suffix(1);
                if (!left.empty()) next.push_back({left, -1});
                next.push_back({{}, id});
                rest.remove_prefix(at + tok.size());
                if (rstrip_[static_cast<size_t>(id)])
                    while (!rest.empty() && is_space_byte(rest.front()))
                        rest.remove_prefix(1);
            }
            if (!rest.empty()) next.push_back({rest, -1});
        }
        frags.swap(next);
    }
    return frags;
}

std::vector<int32_t> VocabTokenizer::encode(std::string_view text, const EncodeOptions& opts) const {
    return encode_fragments_with_bos(partition(text, opts.parse_special), opts.add_bos, text.size());
}

std::vector<int32_t> VocabTokenizer::encode_prompt(const PromptText& prompt, bool add_bos) const {
    return encode_fragments_with_bos(partition(prompt.text(), true, &prompt), add_bos, prompt.size());
}

std::vector<int32_t> VocabTokenizer::encode_fragments_with_bos(const std::vector<Fragment>& fragments, bool add_bos,
                                                               size_t size_hint) const {
    std::vector<int32_t> out;
    out.reserve(size_hint / 3 + 2);
    if (add_bos && add_bos_ && spec_.bos >= 0) out.push_back(spec_.bos);
    encode_fragments(fragments, out);
    if (add_bos && add_eos_ && appended_eos() >= 0) out.push_back(appended_eos());
    return out;
}

std::string VocabTokenizer::token_to_piece(int32_t id, bool special) const {
    if (!valid_id(id)) return {};
    const std::string& text = spec_.tokens[static_cast<size_t>(id)];
    switch (type_of(id)) {
    case TokenType::normal:
    case TokenType::undefined:
        return normal_piece(id);
    case TokenType::user_defined:
        return text;
    case TokenType::unknown:
        return special ? text : std::string("\xE2\x96\x85"); // U+2585, as llama.cpp shows it
    case TokenType::byte: {
        // "<0xAB>" -> the byte 0xAB
        if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
            const std::string hex = text.substr(3, 2);
            if (std::isxdigit(static_cast<unsigned char>(hex[0])) && std::isxdigit(static_cast<unsigned char>(hex[1])))
                return std::string(1, static_cast<char>(std::stoi(hex, nullptr, 16)));
        }
        return normal_piece(id);
    }
    case TokenType::control:
    case TokenType::unused:
        return special ? text : std::string();
    }
    return {};
}

bool VocabTokenizer::is_eog(int32_t id) const {
    return std::binary_search(eog_.begin(), eog_.end(), id);
}

int32_t VocabTokenizer::token_id(std::string_view text) const {
    auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
}

TokenType VocabTokenizer::token_type(int32_t id) const {
    return valid_id(id) ? type_of(id) : TokenType::undefined;
}

std::string_view VocabTokenizer::token_text(int32_t id) const {
    return valid_id(id) ? std::string_view(spec_.tokens[static_cast<size_t>(id)]) : std::string_view();
}

} // namespace detail

VocabSpec Tokenizer::read_vocab(const GgufFile& file) {
    VocabSpec s;
    s.source = file.path();
    if (!file.has("tokenizer.ggml.model"))
        throw InputError(file.path() +
                         ": no tokenizer.ggml.model key, so the file has no vocabulary (a vocabulary-less "
                         "export? use the model's full GGUF)");
    s.model = file.get_string("tokenizer.ggml.model");
    s.pre = file.get_string("tokenizer.ggml.pre", "");
    s.general_name = file.get_string("general.name", "");
    if (!file.has("tokenizer.ggml.tokens"))
        throw InputError(file.path() +
                         ": no tokenizer.ggml.tokens key (the vocabulary is missing; re-convert the model)");
    for (std::string_view t : file.get_string_array("tokenizer.ggml.tokens"))
        s.tokens.emplace_back(t);
    if (file.has("tokenizer.ggml.scores")) s.scores = file.get_f32_array("tokenizer.ggml.scores");
    if (file.has("tokenizer.ggml.token_type")) {
        for (int64_t t : file.get_int_array("tokenizer.ggml.token_type"))
            s.types.push_back(t < 0 || t > 6 ? static_cast<int32_t>(TokenType::normal) : static_cast<int32_t>(t));
    }
    if (file.has("tokenizer.ggml.merges"))
        for (std::string_view m : file.get_string_array("tokenizer.ggml.merges"))
            s.merges.emplace_back(m);
    auto id = [&](const char* key) {
        const int64_t v = file.get_int(key, -1);
        return v < -1 || v > INT32_MAX ? static_cast<int32_t>(INT32_MAX) : static_cast<int32_t>(v);
    };
    s.bos = id("tokenizer.ggml.bos_token_id");
    s.eos = id("tokenizer.ggml.eos_token_id");
    s.unk = id("tokenizer.ggml.unknown_token_id");
    s.pad = id("tokenizer.ggml.padding_token_id");
    s.eot = id("tokenizer.ggml.eot_token_id");
    s.eom = id("tokenizer.ggml.eom_token_id");
    s.sep = id("tokenizer.ggml.seperator_token_id");
    s.cls = id("tokenizer.ggml.cls_token_id");
    s.mask = id("tokenizer.ggml.mask_token_id");
    // Optional ids that point past the vocabulary are common in the wild (a pad id = n_vocab);
    // they are dropped, while BOS/EOS/UNK stay strict (checked when building).
    const int32_t n = static_cast<int32_t>(s.tokens.size());
    for (int32_t* opt : {&s.pad, &s.sep, &s.cls, &s.mask})
        if (*opt >= n) *opt = -1;
    if (file.has("tokenizer.ggml.add_bos_token")) s.add_bos = file.get_bool("tokenizer.ggml.add_bos_token");
    if (file.has("tokenizer.ggml.add_eos_token")) s.add_eos = file.get_bool("tokenizer.ggml.add_eos_token");
    if (file.has("tokenizer.ggml.add_space_prefix"))
        s.add_space_prefix = file.get_bool("tokenizer.ggml.add_space_prefix");
    if (file.has("tokenizer.ggml.normalizer.lowercase"))
        s.lowercase = file.get_bool("tokenizer.ggml.normalizer.lowercase");
    if (file.has("tokenizer.ggml.normalizer.strip_accents"))
        s.strip_accents = file.get_bool("tokenizer.ggml.normalizer.strip_accents");
    return s;
}

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const GgufFile& file) {
    return from_vocab(read_vocab(file));
}

std::unique_ptr<Tokenizer> Tokenizer::from_vocab(VocabSpec spec) {
    if (spec.model == "llama") return detail::make_spm_tokenizer(std::move(spec));
    if (spec.model == "gpt2") return detail::make_bpe_tokenizer(std::move(spec));
    if (spec.model == "bert") return detail::make_wpm_tokenizer(std::move(spec));
    if (spec.model == "no_vocab" || spec.model == "none")
        detail::vocab_error(spec, "tokenizer.ggml.model is '" + spec.model +
                                      "': the file has no vocabulary (use the model's full GGUF)");
    detail::vocab_error(spec, "tokenizer.ggml.model '" + spec.model +
                                  "' is not supported (supported: llama (SentencePiece), gpt2 (byte-level BPE), bert "
                                  "(WordPiece))");
}

std::vector<int32_t> Tokenizer::encode_prompt(const PromptText& prompt, bool add_bos) const {
    // Span by span: right for markup and content, though text is not merged across a boundary as
    // VocabTokenizer's single pass does (only stand-ins for a vocabulary take this path).
    std::vector<int32_t> out;
    const std::string_view text = prompt.text();
    const auto put = [&](size_t begin, size_t end, bool markup) {
        if (begin >= end) return;
        const std::vector<int32_t> ids = encode(text.substr(begin, end - begin), EncodeOptions{add_bos, markup});
        out.insert(out.end(), ids.begin(), ids.end());
        add_bos = false;
    };
    size_t at = 0;
    for (const auto& [begin, end] : prompt.content_ranges()) {
        put(at, begin, true);
        put(begin, end, false);
        at = end;
    }
    put(at, text.size(), true);
    if (out.empty() && add_bos) out = encode("", EncodeOptions{true, true});
    return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
    std::string out;
    bool strip = add_space_prefix();
    for (int32_t id : ids) {
        std::string piece = token_to_piece(id, special);
        if (piece.empty()) continue;
        if (strip && piece.front() == ' ') piece.erase(0, 1);
        strip = false;
        out += piece;
    }
    return out;
}

std::string StreamDecoder::push(int32_t id) {
    pending_ += tok_.token_to_piece(id, special_);
    const size_t hold = unicode::incomplete_utf8_tail(pending_);
    std::string out = unicode::sanitize_utf8(std::string_view(pending_).substr(0, pending_.size() - hold));
    pending_.erase(0, pending_.size() - hold);
    return out;
}

std::string StreamDecoder::flush() {
    std::string out = unicode::sanitize_utf8(pending_);
    pending_.clear();
    return out;
}

} // namespace tern
