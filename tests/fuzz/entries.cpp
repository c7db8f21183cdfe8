// The table of fuzz entries that tests/fuzz/test_fuzz_regressions.cpp walks.
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {

std::span<const Entry> entries() {
    static const Entry table[] = {
        {"gguf", gguf},
        {"tokenizer", tokenizer},
        {"chat_template", chat_template},
        {"model_load", model_load},
        {"prefix_entry", prefix_entry},
        {"http_request", http_request},
        {"request_fields", request_fields},
    };
    return table;
}

} // namespace tern::fuzz
