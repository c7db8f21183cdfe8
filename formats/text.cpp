#include "formats/text.h"

#include <cstdint>

#include "base/terminal_text.h"

namespace tern {

bool is_valid_utf8(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        // ASCII runs dominate keys and names; skip them without the full decode.
        if (static_cast<uint8_t>(s[i]) < 0x80) {
            ++i;
            continue;
        }
        uint32_t cp = 0;
        const size_t n = text_detail::utf8_char_at(s, i, cp);
        if (n == 0) return false;
        i += n;
    }
    return true;
}

std::string printable(std::string_view s, size_t max_bytes) {
    std::string out;
    const size_t limit = s.size() > max_bytes ? max_bytes : s.size();
    out.reserve(limit + 8);
    text_detail::append_escaped(out, s, limit, true);
    if (s.size() > max_bytes) out += "...";
    return out;
}

} // namespace tern
