#pragma once
// The fuzzed surfaces as plain functions over a byte span: the libFuzzer executables
// (tests/fuzz/fuzz_*.cpp) call one each, and tests/fuzz/test_fuzz_regressions.cpp replays every saved
// crashing input (tests/data/fuzz/<name>/) through the same function in the normal test builds.
// Each returns normally when tern rejects the input with a TernError (the expected answer to bad
// input); anything else (another exception, a sanitizer report, a hang) is a finding.
#include <cstdint>
#include <span>
#include <string_view>

namespace tern::fuzz {

using Input = std::span<const uint8_t>;

void gguf(Input input);           // GgufFile::parse + every getter over what it holds
void tokenizer(Input input);      // encode/decode with every vocabulary in ../shared/models/vocab
void chat_template(Input input);  // detection over the input as Jinja text, rendering for every family
void model_load(Input input);     // `tern info` and load_model's checks, from the bytes (no forward)
void prefix_entry(Input input);   // the prompt-cache entry reader (engine/prefix_cache/prefix_cache_entry.h)
void http_request(Input input);   // `tern serve`'s request head parser and body decoders, whole and split
void request_fields(Input input); // a request body or batch line: parse_request_json + read_generation_request

struct Entry {
    std::string_view name; // the target's name without "fuzz_", and its tests/data/fuzz/ folder
    void (*run)(Input);
};
// Every entry above, for the regression replay.
std::span<const Entry> entries();

} // namespace tern::fuzz
