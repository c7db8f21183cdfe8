#pragma once
// The generated table behind unicode::nfd_first (see unicode_nfd.cpp for how it is made).
#include <cstddef>
#include <cstdint>

namespace tern::unicode {

struct NfdFirst {
    uint32_t cp;
    uint32_t first; // the first code point of cp's canonical decomposition
};
extern const NfdFirst kNfdFirst[];
extern const size_t kNfdFirstCount;

} // namespace tern::unicode
