#include "engine/text/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <stdexcept>

#include "engine/text/unicode.h"

namespace tern {

namespace {

// The expressions below are the split patterns the models' own tokenizer configurations use
// (HF tokenizer.json "pre_tokenizer" sections), grouped by the tokenizer.ggml.pre names the GGUF
// converters write.

// GPT-2's original expression; many later vocabularies reuse it.
constexpr const char* kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

// Llama 3 (tiktoken cl100k style): case-insensitive contractions, numbers in groups of up to 3.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama 3 but every digit on its own.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-4o / Llama 4: case-aware letter runs with optional contractions.
constexpr const char* kGpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Mistral's Tekken: like GPT-4o without contractions.
constexpr const char* kTekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// CJK ideographs, a wide block below them, and Hangul, as DeepSeek's tokenizers isolate them.
constexpr const char* kDeepseekCjk = R"([一-龥ࠀ-一가-퟿]+)";

// DeepSeek LLM: letters of cased scripts (the list its tokenizer.json spells out), ASCII and
// full-width punctuation runs, trailing whitespace, CJK, digit runs.
constexpr const char* kDeepseekLetters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-)"
    R"(\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-)"
    R"(\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-)"
    R"(\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77})"
    R"(\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-)"
    R"(\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-)"
    R"(\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4})"
    R"(\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128})"
    R"(\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184})"
    R"(\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-)"
    R"(\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06})"
    R"(\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-)"
    R"(\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr const char* kDeepseekPunct = R"(\s?[!-/:-~！-／：-～‘-‟　-。]+)";

struct PreEntry {
    std::vector<const char*> names;
    std::vector<const char*> patterns;
};

const std::vector<PreEntry>& pre_table() {
    static const std::vector<PreEntry> table = {
        // Used when tokenizer.ggml.pre is absent or "default": punctuation runs first, then
        // GPT-2's expression, then digit runs cut into groups of three.
        {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
        {{"gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion", "phi-2", "roberta-bpe", "gigachat", "jina-es", "jina-de",
          "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code"},
         {kGpt2}},
        {{"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe", "chatglm-bpe",
          "glm4", "seed-coder", "kimi-k2"},
         {kLlama3}},
        {{"qwen2", "stablelm2", "hunyuan", "deepseek-r1-qwen", "megrez", "qwen35"}, {kQwen2}},
        {{"gpt-4o", "llama4", "minimax-m2"}, {kGpt4o}},
        {{"tekken"}, {kTekken}},
        {{"deepseek-llm"}, {R"([\r\n])", kDeepseekLetters, kDeepseekPunct, R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
        {{"deepseek-coder"}, {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
        {{"deepseek-v3"},
         {R"(\p{N}{1,3})", R"([一-龥぀-ゟ゠-ヿ]+)",
          R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
        {{"falcon"}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
        // Code models: every digit alone, then GPT-2's expression.
        {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {R"(\p{N})", kGpt2}},
        {{"poro-chat", "bloom", "gpt3-finnish"}, {R"( ?[^(\s|.,!?…。，、।۔،)]+)"}},
        {{"viking"}, {R"( ?[^(\s|.,!?…。，、।۔،)]+)", R"(\p{N})"}},
    };
    return table;
}

} // namespace

std::vector<std::string> Pretokenizer::patterns_for(std::string_view pre) {
    if (pre.empty()) pre = "default";
    for (const PreEntry& e : pre_table())
        for (const char* n : e.names)
            if (pre == n) return {e.patterns.begin(), e.patterns.end()};
    return {};
}

std::vector<std::string> Pretokenizer::known_names() {
    std::vector<std::string> out;
    for (const PreEntry& e : pre_table())
        out.insert(out.end(), e.names.begin(), e.names.end());
    return out;
}

struct Pretokenizer::Compiled {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Compiled() {
        if (code) pcre2_code_free(code);
    }
};

Pretokenizer::Pretokenizer(const std::vector<std::string>& patterns) {
    for (const std::string& p : patterns) {
        int err = 0;
        PCRE2_SIZE err_off = 0;
        auto c = std::make_unique<Compiled>();
        c->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), PCRE2_UTF | PCRE2_UCP, &err, &err_off,
                                nullptr);
        if (!c->code) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof(msg));
            throw std::invalid_argument("pre-tokenizer expression does not compile at offset " +
                                        std::to_string(err_off) + ": " + reinterpret_cast<const char*>(msg));
        }
        c->jit = pcre2_jit_compile(c->code, PCRE2_JIT_COMPLETE) == 0;
        regexes_.push_back(std::move(c));
    }
}

Pretokenizer::~Pretokenizer() = default;

std::vector<PretokenizerSpan> Pretokenizer::split(std::string_view text) const {
    struct Piece {
        size_t offset, length;
        bool raw; // an invalid UTF-8 byte: kept whole, never given to PCRE2
    };
    std::vector<Piece> pieces;
    for (size_t pos = 0; pos < text.size();) {
        const size_t n = unicode::valid_utf8_prefix(text.substr(pos));
        if (n > 0) {
            pieces.push_back({pos, n, false});
            pos += n;
        } else {
            pieces.push_back({pos, 1, true});
            pos += 1;
        }
    }

    std::vector<Piece> next;
    for (const auto& re : regexes_) {
        pcre2_match_data* md = pcre2_match_data_create_from_pattern(re->code, nullptr);
        if (!md) throw std::bad_alloc();
        next.clear();
        next.reserve(pieces.size() * 2);
        for (const Piece& piece : pieces) {
            if (piece.raw) {
                next.push_back(piece);
                continue;
            }
            // Each piece is its own subject, so lookaheads and `$` see the piece's end, as in the
            // tokenizers these expressions come from.
            const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data() + piece.offset);
            size_t start = 0, emitted = 0;
            while (start < piece.length) {
                const int rc =
                    re->jit ? pcre2_jit_match(re->code, subject, piece.length, start, 0, md, nullptr)
                            : pcre2_match(re->code, subject, piece.length, start, PCRE2_NO_UTF_CHECK, md, nullptr);
                if (rc < 0) break; // no further match (or a resource limit: keep the rest whole)
                const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
                const size_t m0 = ov[0], m1 = ov[1];
                if (m1 == m0) { // an empty match: step over one character
                    start = m0 + unicode::utf8_seq_len(static_cast<unsigned char>(text[piece.offset + m0]));
                    continue;
                }
                if (m0 > emitted) next.push_back({piece.offset + emitted, m0 - emitted, false});
                next.push_back({piece.offset + m0, m1 - m0, false});
                emitted = start = m1;
            }
            if (emitted < piece.length) next.push_back({piece.offset + emitted, piece.length - emitted, false});
        }
        pcre2_match_data_free(md);
        pieces.swap(next);
    }

    std::vector<PretokenizerSpan> out;
    out.reserve(pieces.size());
    for (const Piece& p : pieces)
        out.push_back({p.offset, p.length});
    return out;
}

} // namespace tern
