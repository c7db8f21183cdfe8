#pragma once
// Recognises the files people most often pass by mistake instead of a GGUF model, so that the
// error can say what the file really is: a web page saved instead of the download, a git-LFS
// pointer checked out without `git lfs pull`, a pre-GGUF ggml model, a zero-filled or empty file.
#include <cstdint>
#include <span>
#include <string>

namespace tern {

// A short description such as "an HTML page, not a GGUF model (...)", or "" when the bytes are
// none of the known wrong kinds.
std::string describe_non_gguf(std::span<const uint8_t> bytes);

} // namespace tern
