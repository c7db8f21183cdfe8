#include "engine/prefix_cache/prefix_cache_entry.h"

#include <xxhash.h>

#include <cstring>

namespace tern {
namespace {

constexpr uint32_t kMagic = 0x31435054;   // "TPC1" little-endian

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
    const size_t at = out.size();
    out.resize(at + sizeof v);
    std::memcpy(out.data() + at, &v, sizeof v);
}

// Reads fixed-size fields from the front of a span; the caller has checked the length.
struct Reader {
    const uint8_t* p;
    template <typename T>
    T get() {
        T v;
        std::memcpy(&v, p, sizeof v);
        p += sizeof v;
        return v;
    }
};

bool fail(std::string* why, const char* reason) {
    if (why) *why = reason;
    return false;
}

} // namespace

std::vector<uint8_t> serialize_prefix_entry(const PrefixEntry& e) {
    std::vector<uint8_t> out;
    out.reserve(kPrefixEntryHeaderBytes + e.tokens.size() * 4 + e.payload.size() + kPrefixEntryChecksumBytes);
    put<uint32_t>(out, kMagic);
    put<uint32_t>(out, kPrefixEntryVersion);
    put<uint64_t>(out, e.identity);
    put<uint64_t>(out, e.chain);
    put<uint32_t>(out, e.block_index);
    put<uint32_t>(out, static_cast<uint32_t>(e.kv_type));
    put<uint32_t>(out, static_cast<uint32_t>(e.tokens.size()));
    put<uint64_t>(out, static_cast<uint64_t>(e.payload.size()));
    for (int32_t t : e.tokens) put<int32_t>(out, t);
    out.insert(out.end(), e.payload.begin(), e.payload.end());
    put<uint64_t>(out, XXH3_64bits(out.data(), out.size()));
    return out;
}

bool parse_prefix_entry(std::span<const uint8_t> bytes, PrefixEntry& out, std::string* why) {
    if (bytes.size() < kPrefixEntryHeaderBytes + kPrefixEntryChecksumBytes) return fail(why, "truncated header");
    Reader r{bytes.data()};
    if (r.get<uint32_t>() != kMagic) return fail(why, "not a tern prompt-cache entry (bad magic)");
    if (r.get<uint32_t>() != kPrefixEntryVersion) return fail(why, "unsupported format version");
    PrefixEntry e;
    e.identity = r.get<uint64_t>();
    e.chain = r.get<uint64_t>();
    e.block_index = r.get<uint32_t>();
    const uint32_t kv_type = r.get<uint32_t>();
    const uint32_t n_tokens = r.get<uint32_t>();
    const uint64_t payload = r.get<uint64_t>();
    if (kv_type > static_cast<uint32_t>(KvType::f8_e4m3)) return fail(why, "unknown KV type");
    if (n_tokens == 0 || n_tokens > kPrefixEntryMaxTokens) return fail(why, "bad token count");
    // Sizes in u64 with the payload bounded first, so no sum can wrap.
    const uint64_t fixed = kPrefixEntryHeaderBytes + uint64_t(n_tokens) * 4 + kPrefixEntryChecksumBytes;
    if (payload > bytes.size() || fixed > bytes.size() - payload) return fail(why, "truncated");
    if (fixed + payload != bytes.size()) return fail(why, "trailing bytes after the checksum");
    const size_t body = bytes.size() - kPrefixEntryChecksumBytes;
    uint64_t stored = 0;
    std::memcpy(&stored, bytes.data() + body, sizeof stored);
    if (XXH3_64bits(bytes.data(), body) != stored) return fail(why, "checksum mismatch");

    e.kv_type = static_cast<KvType>(kv_type);
    e.tokens.resize(n_tokens);
    std::memcpy(e.tokens.data(), r.p, size_t(n_tokens) * 4);
    r.p += size_t(n_tokens) * 4;
    e.payload.assign(r.p, r.p + payload);
    out = std::move(e);
    return true;
}

} // namespace tern
