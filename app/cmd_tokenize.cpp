// tern tokenize: the ids a model's tokenizer gives a text (../shared/CLI.md). Default output is
// one token per line, "<id>\t'<piece>'" with control characters and stray bytes escaped so
// every line is readable; --ids prints the ids on one line, separated by single spaces.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>

#include "app/commands.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode.h"
#include "base/error.h"
#include "formats/input_file.h"
#include "formats/gguf.h"

namespace tern::app {

namespace {

struct TokenizeArgs {
    std::string model;
    std::string prompt;
    std::string file;
    bool ids = false;
    bool no_bos = false;
    bool parse_special = false;
    CLI::Option* prompt_opt = nullptr;
    CLI::Option* file_opt = nullptr;
};

// A piece as a quoted, single-line string: \n \r \t \\ \' spelled out, other control bytes and
// bytes that are not (yet) valid UTF-8, such as one byte of a split character, as \xNN.
std::string quote_piece(std::string_view piece) {
    std::string out = "'";
    size_t pos = 0;
    while (pos < piece.size()) {
        const size_t valid = unicode::valid_utf8_prefix(piece.substr(pos));
        for (size_t i = pos; i < pos + valid; ++i) {
            const char c = piece[i];
            switch (c) {
            case '\n':
                out += "\\n";
                break;
            case '\r':
                out += "\\r";
                break;
            case '\t':
                out += "\\t";
                break;
            case '\\':
                out += "\\\\";
                break;
            case '\'':
                out += "\\'";
                break;
            default:
                if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
                    char buf[8];
                    std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned char>(c));
                    out += buf;
                } else {
                    out += c;
                }
            }
        }
        pos += valid;
        if (pos < piece.size()) {
            char buf[8];
            std::snprintf(buf, sizeof(buf), "\\x%02X", static_cast<unsigned char>(piece[pos]));
            out += buf;
            ++pos;
        }
    }
    return out + "'";
}

std::string read_text(const TokenizeArgs& a) {
    if (a.prompt_opt->count() > 0) return a.prompt;
    // The file's bytes exactly, final newline included: tokenize shows what the tokenizer sees.
    return read_input_file(a.file, "the text file (-f)", kMaxTextFileBytes);
}

// All of stdin, bytes exactly as -f reads a file (`echo text | tern tokenize -m M` shows the final
// newline too: tokenize shows what the tokenizer is given).
std::string read_stdin_text() { return read_standard_input("the text to tokenize", kMaxTextFileBytes); }

} // namespace

Command add_tokenize_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("tokenize", "the token ids (and pieces) a model's tokenizer gives a text");
    auto a = std::make_shared<TokenizeArgs>();
    cmd->add_option("-m,--model", a->model, "GGUF file (its tokenizer.ggml.* vocabulary)")->required();
    a->prompt_opt = cmd->add_option("-p,--prompt", a->prompt, "text to tokenize (taken literally)");
    a->file_opt = cmd->add_option("-f,--file", a->file, "file whose bytes to tokenize (default: stdin when it is not a terminal)");
    a->prompt_opt->excludes(a->file_opt);
    cmd->add_flag("--ids", a->ids, "print only the ids, on one line, separated by single spaces");
    cmd->add_flag("--no-bos", a->no_bos, "do not add BOS (nor EOS) even where the vocabulary asks for them");
    cmd->add_flag("--parse-special", a->parse_special,
                  "recognise control-token texts such as <start_of_turn> in the text");
    return {cmd, [a] {
                const bool from_stdin = a->prompt_opt->count() == 0 && a->file_opt->count() == 0;
                if (from_stdin && isatty(STDIN_FILENO))
                    throw UsageError("tokenize: no text; give it with -p TEXT or -f FILE, or pipe it on stdin");
                const std::string text = from_stdin ? read_stdin_text() : read_text(*a);
                const GgufFile file = GgufFile::open(a->model);
                const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(file);
                const std::vector<int32_t> ids = tok->encode(text, EncodeOptions{!a->no_bos, a->parse_special});
                std::string out;
                if (a->ids) {
                    for (size_t i = 0; i < ids.size(); ++i)
                        out += (i ? " " : "") + std::to_string(ids[i]);
                    out += "\n";
                } else {
                    for (int32_t id : ids)
                        out += std::to_string(id) + "\t" + quote_piece(tok->token_to_piece(id, true)) + "\n";
                }
                std::cout << out;
                std::cout.flush(); // a closed pipe (`| head`) just ends the output
                return 0;
            }};
}

} // namespace tern::app
