#pragma once
// UTF-8 helpers and the few Unicode facts the tokenizers need: the GPT-2 byte<->character map of
// byte-level BPE, general-category flags (derived once from PCRE2's own tables, so we maintain no
// category data), lower-casing and the accent stripping BERT's normaliser does.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tern::unicode {

// Length of the sequence a lead byte starts (1 for ASCII and for bytes that cannot start one).
size_t utf8_seq_len(unsigned char lead);

// Decodes one code point at `pos` and advances it. An invalid or truncated sequence gives
// U+FFFD and advances by one byte, so every input terminates.
uint32_t decode_utf8(std::string_view s, size_t& pos);
void append_utf8(std::string& out, uint32_t cp);

// Length of the longest prefix of `s` that is valid UTF-8 (stops at the first bad byte).
size_t valid_utf8_prefix(std::string_view s);

// How `s` ends: the number of trailing bytes that form an incomplete but so far valid multi-byte
// sequence (0..3). Streaming holds exactly these bytes back until the next token completes them.
size_t incomplete_utf8_tail(std::string_view s);

// Replaces every invalid sequence with U+FFFD (one per maximal invalid subpart).
std::string sanitize_utf8(std::string_view s);

// Byte-level BPE (GPT-2): every byte has a printable stand-in character so that merges never
// see raw control bytes or spaces. Bytes 33..126, 161..172 and 174..255 stand for themselves;
// the other 68 bytes map to U+0100 onwards in byte order.
const std::string& byte_to_bpe_char(uint8_t byte); // UTF-8 of the stand-in character
int bpe_char_to_byte(uint32_t cp);                 // -1 when cp stands for no byte
std::string bytes_to_bpe(std::string_view bytes);
// Inverse of bytes_to_bpe; characters outside the map are kept as they are.
std::string bpe_to_bytes(std::string_view text);

enum CpFlags : uint8_t {
    cp_letter = 1,       // \p{L}
    cp_number = 2,       // \p{N}
    cp_punct = 4,        // \p{P}
    cp_symbol = 8,       // \p{S}
    cp_whitespace = 16,  // \s (Unicode White_Space as PCRE2 sees it)
    cp_control = 32,     // \p{C}: Cc, Cf, Cn, Co, Cs
    cp_mark = 64,        // \p{M}: Mn, Mc, Me (combining marks, Devanagari vowel signs...)
    cp_unassigned = 128, // \p{Cn} (also counted in cp_control)
};
uint8_t cp_flags(uint32_t cp);

uint32_t to_lower(uint32_t cp);

// The first code point of the canonical decomposition (NFD) of `cp`, or `cp` itself when it has
// none: 'Ä' -> 'A', U+212B ANGSTROM SIGN -> 'A', a Hangul syllable -> its leading consonant jamo.
// This is the WordPiece normaliser's accent stripping as llama.cpp does it: one code point in, one
// out, the rest of the decomposition dropped (for a precomposed Latin letter the rest is its marks;
// for Hangul it is the vowel and final consonant), then marks removed by the caller.
uint32_t nfd_first(uint32_t cp);

} // namespace tern::unicode
