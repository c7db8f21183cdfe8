#pragma once
// Byte-level BPE splits text into "words" with regular expressions before any merge; which
// expressions depends on how the model was trained (tokenizer.ggml.pre). Several expressions are
// applied in sequence: each one splits every piece the previous one left, and both the matches
// and the text between them become pieces (HF tokenizers' "Isolated" split behaviour).
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tern {

struct PretokenizerSpan {
    size_t offset = 0;
    size_t length = 0;
};

class Pretokenizer {
public:
    // The expressions for a tokenizer.ggml.pre value, or an empty list when the name is unknown.
    static std::vector<std::string> patterns_for(std::string_view pre);
    // Every pre name patterns_for knows (for messages and tests).
    static std::vector<std::string> known_names();

    // Compiles with PCRE2 (UTF + UCP, JIT when available). Throws std::invalid_argument with the
    // PCRE2 message when an expression does not compile.
    explicit Pretokenizer(const std::vector<std::string>& patterns);
    ~Pretokenizer();
    Pretokenizer(const Pretokenizer&) = delete;
    Pretokenizer& operator=(const Pretokenizer&) = delete;

    // Splits `text` into consecutive spans that cover it exactly. Invalid UTF-8 bytes never reach
    // the regex engine: each becomes a span of its own.
    std::vector<PretokenizerSpan> split(std::string_view text) const;

private:
    struct Compiled;
    std::vector<std::unique_ptr<Compiled>> regexes_;
};

} // namespace tern
