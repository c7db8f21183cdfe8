#include "formats/text.h"

#include <cstdint>

namespace tern {
namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when the bytes there are not one.
size_t utf8_sequence_length(std::string_view s, size_t i) {
    const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const uint8_t c = byte(i);
    if (c < 0x80) return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1F;
    } // 0xC0/0xC1 would be overlong
    else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07;
    } else
        return 0;
    if (i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k) {
        const uint8_t cc = byte(i + k);
        if ((cc & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (cc & 0x3F);
    }
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

} // namespace

bool is_valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        // ASCII runs dominate keys and names; skip them without the full decode.
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        const size_t n = utf8_sequence_length(s, i);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string printable(std::string_view s, size_t max_bytes) {
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    const size_t limit = s.size() > max_bytes ? max_bytes : s.size();
    out.reserve(limit + 8);
    for (size_t i = 0; i < limit;) {
        const uint8_t c = static_cast<uint8_t>(s[i]);
        if (c == '\n') {
            out += "\\n";
            ++i;
            continue;
        }
        if (c == '\r') {
            out += "\\r";
            ++i;
            continue;
        }
        if (c == '\t') {
            out += "\\t";
            ++i;
            continue;
        }
        if (c == '\\') {
            out += "\\\\";
            ++i;
            continue;
        }
        if (c >= 0x20 && c < 0x7F) {
            out += static_cast<char>(c);
            ++i;
            continue;
        }
        const size_t n = c >= 0x80 ? utf8_sequence_length(s, i) : 0;
        if (n > 0 && i + n <= limit) {
            out.append(s.substr(i, n));
            i += n;
            continue;
        }
        out += "\\x";
        out += kHex[c >> 4];
        out += kHex[c & 15];
        ++i;
    }
    if (s.size() > max_bytes) out += "...";
    return out;
}

} // namespace tern
