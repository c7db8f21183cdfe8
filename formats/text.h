#pragma once
// Text checks shared by the GGUF reader and writer: UTF-8 validation for keys and tensor names,
// and a printable form for putting untrusted file content into one-line error messages.
#include <cstddef>
#include <string>
#include <string_view>

namespace tern {

// Strict UTF-8: no overlong forms, no surrogates (U+D800..DFFF), nothing above U+10FFFF.
bool is_valid_utf8(std::string_view s);

// `s` made safe for quoting in a one-line message: as terminal_safe() (base/terminal_text.h), and
// a backslash is doubled so the quote reads back unambiguously. Longer than `max_bytes` input bytes
// is cut with "..." (a 64 MiB key must not become a 64 MiB message).
std::string printable(std::string_view s, size_t max_bytes = 80);

} // namespace tern
