#pragma once
// A tokenizer for tests that need only pieces: token i's piece is pieces[i], token 1 is BOS and
// token 2 the end-of-generation token; encode() gives nothing (the tests hand over token ids).
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/text/tokenizer.h"

namespace tern::test {

class FakeTokenizer : public Tokenizer {
public:
    std::vector<std::string> pieces;
    explicit FakeTokenizer(std::vector<std::string> p) : pieces(std::move(p)) {}
    std::vector<int32_t> encode(std::string_view, const EncodeOptions&) const override { return {}; }
    std::string token_to_piece(int32_t id, bool) const override { return pieces.at(static_cast<size_t>(id)); }
    int32_t vocab_size() const override { return static_cast<int32_t>(pieces.size()); }
    std::string_view kind() const override { return "fake"; }
    std::string_view pre() const override { return "default"; }
    int32_t bos() const override { return 1; }
    int32_t eos() const override { return 2; }
    bool is_eog(int32_t id) const override { return id == 2; }
    int32_t token_id(std::string_view) const override { return -1; }
};

} // namespace tern::test
