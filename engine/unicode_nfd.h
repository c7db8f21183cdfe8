#pragma once
// The generated table behind unicode::append_stripped_nfd (see unicode_nfd.cpp for how it is made).
#include <cstddef>
#include <cstdint>

namespace tern::unicode {

struct NfdRow {
    uint32_t cp;
    uint32_t stripped[3]; // 0-padded
};
extern const NfdRow kNfdStripped[];
extern const size_t kNfdStrippedCount;

} // namespace tern::unicode
