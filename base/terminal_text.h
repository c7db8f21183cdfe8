#pragma once
// Text from files (metadata strings, tensor names, paths) reaches a terminal in error lines and in
// `tern info`. A terminal acts on some of those bytes: ESC and the C1 controls start escape
// sequences (colour, cursor moves, window titles, clipboard writes), a NUL or a newline breaks the
// one-line error contract, and bidirectional overrides make the line read differently than it is.
// terminal_safe() keeps every other valid UTF-8 character and writes the rest as escapes; it is
// header-only because every TernError runs it (base/error.h), in libraries that link nothing else.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tern {
namespace text_detail {

// Length of the valid UTF-8 sequence at s[i] with its code point in `cp`, or 0 when the bytes there
// are not one (overlong forms, surrogates and values above U+10FFFF are invalid).
inline size_t utf8_char_at(std::string_view s, size_t i, uint32_t& cp) {
    const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
    const uint8_t c = byte(i);
    size_t n;
    if (c < 0x80) {
        cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        cp = c & 0x1Fu;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        cp = c & 0x0Fu;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        cp = c & 0x07u;
    } else {
        return 0;
    }
    if (i + n > s.size()) return 0;
    for (size_t k = 1; k < n; ++k) {
        const uint8_t cc = byte(i + k);
        if ((cc & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (cc & 0x3Fu);
    }
    if (n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    return n;
}

// Valid characters a terminal must not receive raw: C1 controls (U+0080..U+009F; 0x9B is CSI on
// some terminals), line and paragraph separators, and the bidirectional embeddings, overrides
// and isolates.
inline bool is_unsafe_code_point(uint32_t cp) {
    return (cp >= 0x80 && cp <= 0x9F) || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202A && cp <= 0x202E) ||
           (cp >= 0x2066 && cp <= 0x2069);
}

inline void append_hex_byte(std::string& out, uint8_t c) {
    static constexpr char kHex[] = "0123456789abcdef";
    out += "\\x";
    out += kHex[c >> 4];
    out += kHex[c & 15];
}

// Appends s[i..] escaped up to `limit` input bytes; `escape_backslash` doubles backslashes so the
// result reads back unambiguously (for quoting file content inside a message).
inline void append_escaped(std::string& out, std::string_view s, size_t limit, bool escape_backslash) {
    for (size_t i = 0; i < limit;) {
        const uint8_t c = static_cast<uint8_t>(s[i]);
        if (c >= 0x20 && c < 0x7F) {
            if (c == '\\' && escape_backslash) out += '\\';
            out += static_cast<char>(c);
            ++i;
            continue;
        }
        if (c == '\n' || c == '\r' || c == '\t') {
            out += c == '\n' ? "\\n" : c == '\r' ? "\\r" : "\\t";
            ++i;
            continue;
        }
        uint32_t cp = 0;
        const size_t n = c >= 0x80 ? utf8_char_at(s, i, cp) : 0;
        if (n > 0 && i + n <= limit && !is_unsafe_code_point(cp)) {
            out.append(s.substr(i, n));
            i += n;
            continue;
        }
        // A control, an invalid byte, or an unsafe character: every byte of it as \xNN.
        const size_t bytes = n > 0 && i + n <= limit ? n : 1;
        for (size_t k = 0; k < bytes; ++k)
            append_hex_byte(out, static_cast<uint8_t>(s[i + k]));
        i += bytes;
    }
}

} // namespace text_detail

// `s` as one line a terminal shows literally: printable ASCII and valid UTF-8 are kept (backslashes
// too, so text already escaped by printable() is not escaped twice), \n \r \t become two-character
// escapes, other controls, invalid bytes and the characters above become \xNN.
inline std::string terminal_safe(std::string_view s) {
    size_t i = 0;
    while (i < s.size() && static_cast<uint8_t>(s[i]) >= 0x20 && static_cast<uint8_t>(s[i]) < 0x7F)
        ++i;
    if (i == s.size()) return std::string(s); // the common case: plain ASCII
    std::string out(s.substr(0, i));
    out.reserve(s.size() + 16);
    text_detail::append_escaped(out, s.substr(i), s.size() - i, false);
    return out;
}

// Generated text as a terminal may show it: the model's newlines and tabs stay, as do valid UTF-8
// characters, but the other C0 controls, DEL, the C1 controls (U+009B is CSI on some terminals)
// and bytes that are not UTF-8 each become U+FFFD. A model, random weights above all, can emit ESC
// or a byte token that would otherwise move the cursor, recolour or retitle the user's terminal.
// Unlike terminal_safe(), nothing is escaped: the text reads as the model wrote it.
inline std::string terminal_display(std::string_view s) {
    static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        uint32_t cp = 0;
        const size_t n = text_detail::utf8_char_at(s, i, cp);
        const bool control = (cp < 0x20 && cp != '\n' && cp != '\t') || (cp >= 0x7F && cp <= 0x9F);
        if (n == 0 || control) {
            out += kReplacement;   // one per invalid byte, one per control character
            i += n == 0 ? 1 : n;
        } else {
            out.append(s.substr(i, n));
            i += n;
        }
    }
    return out;
}

} // namespace tern
