#include "engine/text/unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <clocale>
#include <cwctype>
#include <locale.h>
#include <vector>

#include "engine/text/unicode_nfd.h"

namespace tern::unicode {

size_t utf8_seq_len(unsigned char lead) {
    if (lead < 0x80) return 1;
    if ((lead & 0xE0) == 0xC0) return 2;
    if ((lead & 0xF0) == 0xE0) return 3;
    if ((lead & 0xF8) == 0xF0) return 4;
    return 1;
}

namespace {

// Length of the valid sequence at `pos`, 0 when invalid, and sets `incomplete` when the bytes run
// out while the sequence is still a valid prefix. Follows RFC 3629: no overlongs, no surrogates,
// nothing above U+10FFFF.
size_t valid_seq_at(std::string_view s, size_t pos, bool& incomplete) {
    incomplete = false;
    const auto b0 = static_cast<unsigned char>(s[pos]);
    if (b0 < 0x80) return 1;
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF; // allowed range of the second byte
    if (b0 >= 0xC2 && b0 <= 0xDF)
        n = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        n = 3;
        if (b0 == 0xE0) lo = 0xA0;
        if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        n = 4;
        if (b0 == 0xF0) lo = 0x90;
        if (b0 == 0xF4) hi = 0x8F;
    } else {
        return 0;
    }
    for (size_t k = 1; k < n; ++k) {
        if (pos + k >= s.size()) {
            incomplete = true;
            return 0;
        }
        const auto b = static_cast<unsigned char>(s[pos + k]);
        const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (b < l || b > h) return 0;
    }
    return n;
}

} // namespace

uint32_t decode_utf8(std::string_view s, size_t& pos) {
    bool incomplete = false;
    const size_t n = valid_seq_at(s, pos, incomplete);
    if (n == 0) {
        ++pos;
        return 0xFFFD;
    }
    const auto* p = reinterpret_cast<const unsigned char*>(s.data() + pos);
    uint32_t cp;
    switch (n) {
    case 1:
        cp = p[0];
        break;
    case 2:
        cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
        break;
    case 3:
        cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
        break;
    default:
        cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
        break;
    }
    pos += n;
    return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
    if (cp < 0x80) {
        out += static_cast<char>(cp);
    } else if (cp < 0x800) {
        out += static_cast<char>(0xC0 | (cp >> 6));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += static_cast<char>(0xE0 | (cp >> 12));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
        out += static_cast<char>(0xF0 | (cp >> 18));
        out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
        out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
        out += static_cast<char>(0x80 | (cp & 0x3F));
    }
}

size_t valid_utf8_prefix(std::string_view s) {
    size_t pos = 0;
    bool incomplete = false;
    while (pos < s.size()) {
        const size_t n = valid_seq_at(s, pos, incomplete);
        if (n == 0) break;
        pos += n;
    }
    return pos;
}

size_t incomplete_utf8_tail(std::string_view s) {
    // A multi-byte sequence is at most 4 bytes, so only the last 3 can be an unfinished one.
    const size_t from = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t start = from; start < s.size(); ++start) {
        bool incomplete = false;
        if (valid_seq_at(s, start, incomplete) == 0 && incomplete) return s.size() - start;
    }
    return 0;
}

std::string sanitize_utf8(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    size_t pos = 0;
    bool incomplete = false;
    while (pos < s.size()) {
        const size_t n = valid_seq_at(s, pos, incomplete);
        if (n == 0) {
            out += "\xEF\xBF\xBD";
            // A truncated but valid prefix counts as one bad sequence, not one per byte.
            size_t skip = 1;
            if (incomplete) skip = s.size() - pos;
            pos += skip;
            continue;
        }
        out.append(s.substr(pos, n));
        pos += n;
    }
    return out;
}

namespace {

struct ByteMap {
    std::array<std::string, 256> to_char;
    std::array<int16_t, 512> from_cp; // every stand-in is below U+0200

    ByteMap() {
        from_cp.fill(-1);
        int next = 0;
        for (int b = 0; b < 256; ++b) {
            const bool self = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
            const uint32_t cp = self ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + next++);
            append_utf8(to_char[b], cp);
            from_cp[cp] = static_cast<int16_t>(b);
        }
    }
};

const ByteMap& byte_map() {
    static const ByteMap map;
    return map;
}

} // namespace

const std::string& byte_to_bpe_char(uint8_t byte) {
    return byte_map().to_char[byte];
}

int bpe_char_to_byte(uint32_t cp) {
    return cp < 512 ? byte_map().from_cp[cp] : -1;
}

std::string bytes_to_bpe(std::string_view bytes) {
    const ByteMap& m = byte_map();
    std::string out;
    out.reserve(bytes.size() * 2);
    for (char c : bytes)
        out += m.to_char[static_cast<uint8_t>(c)];
    return out;
}

std::string bpe_to_bytes(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
        const size_t start = pos;
        const uint32_t cp = decode_utf8(text, pos);
        const int b = bpe_char_to_byte(cp);
        if (b >= 0)
            out += static_cast<char>(b);
        else
            out.append(text.substr(start, pos - start));
    }
    return out;
}

namespace {

// One flag byte per code point, filled by running PCRE2's Unicode properties over a string of
// every code point: the category data stays PCRE2's, this only caches it (1.1 MB, built once).
std::vector<uint8_t> build_flag_table() {
    std::vector<uint8_t> flags(0x110000, 0);
    std::string all;
    all.reserve(0x110000 * 4);
    for (uint32_t cp = 0; cp < 0x110000; ++cp) {
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            flags[cp] = cp_control; // surrogates (Cs) cannot appear in UTF-8
            continue;
        }
        append_utf8(all, cp);
    }
    const std::pair<const char*, uint8_t> classes[] = {
        {"\\p{L}+", cp_letter},  {"\\p{N}+", cp_number},  {"\\p{P}+", cp_punct}, {"\\p{S}+", cp_symbol},
        {"\\s+", cp_whitespace}, {"\\p{C}+", cp_control}, {"\\p{M}+", cp_mark},  {"\\p{Cn}+", cp_unassigned},
    };
    for (const auto& [pattern, flag] : classes) {
        int err = 0;
        PCRE2_SIZE err_off = 0;
        pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                       PCRE2_UTF | PCRE2_UCP, &err, &err_off, nullptr);
        if (!re) continue;
        pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
        pcre2_match_data* md = pcre2_match_data_create_from_pattern(re, nullptr);
        PCRE2_SIZE start = 0;
        while (start < all.size()) {
            const int rc = pcre2_match(re, reinterpret_cast<PCRE2_SPTR>(all.data()), all.size(), start,
                                       PCRE2_NO_UTF_CHECK, md, nullptr);
            if (rc < 0) break;
            const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
            size_t pos = ov[0];
            while (pos < ov[1])
                flags[decode_utf8(all, pos)] |= flag;
            start = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
        }
        pcre2_match_data_free(md);
        pcre2_code_free(re);
    }
    return flags;
}

} // namespace

uint8_t cp_flags(uint32_t cp) {
    static const std::vector<uint8_t> table = build_flag_table();
    return cp < table.size() ? table[cp] : static_cast<uint8_t>(cp_control);
}

uint32_t to_lower(uint32_t cp) {
    if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    // glibc's C.UTF-8 carries the full simple case mapping; a private locale object keeps the
    // process locale untouched.
    static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
    if (!loc) return cp;
    return static_cast<uint32_t>(towlower_l(static_cast<wint_t>(cp), loc));
}

uint32_t nfd_first(uint32_t cp) {
    // Hangul syllables decompose arithmetically (Unicode ch. 3.12); the leading consonant comes first.
    constexpr uint32_t s_base = 0xAC00, l_base = 0x1100, n_count = 21 * 28, s_count = 19 * n_count;
    if (cp >= s_base && cp < s_base + s_count) return l_base + (cp - s_base) / n_count;
    const NfdFirst* end = kNfdFirst + kNfdFirstCount;
    const NfdFirst* row = std::lower_bound(kNfdFirst, end, cp, [](const NfdFirst& r, uint32_t v) { return r.cp < v; });
    return row != end && row->cp == cp ? row->first : cp;
}

} // namespace tern::unicode
