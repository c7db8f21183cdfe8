// fuzz entry "prefix_entry": the prompt-cache entry reader (engine/prefix_cache/prefix_cache_entry.h) over
// arbitrary bytes, twice: as given, and with the trailing checksum recomputed so that mutations
// reach the checks behind it. Whatever it accepts must serialize back to the very same bytes.
#include <cstring>
#include <string>
#include <vector>
#include <xxhash.h>

#include "engine/prefix_cache/prefix_cache_entry.h"
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {
namespace {

void parse_and_check(std::span<const uint8_t> bytes) {
    PrefixEntry entry;
    std::string why;
    if (!parse_prefix_entry(bytes, entry, &why)) {
        if (why.empty()) __builtin_trap(); // a refusal always says why
        return;
    }
    const std::vector<uint8_t> again = serialize_prefix_entry(entry);
    if (again.size() != bytes.size() || std::memcmp(again.data(), bytes.data(), bytes.size()) != 0)
        __builtin_trap(); // parse and serialize disagree on the format
}

} // namespace

void prefix_entry(Input input) {
    parse_and_check(input);
    if (input.size() < kPrefixEntryChecksumBytes) return;
    std::vector<uint8_t> fixed(input.begin(), input.end());
    const size_t body = fixed.size() - kPrefixEntryChecksumBytes;
    const uint64_t sum = XXH3_64bits(fixed.data(), body);
    std::memcpy(fixed.data() + body, &sum, sizeof sum);
    parse_and_check(fixed);
}

} // namespace tern::fuzz
