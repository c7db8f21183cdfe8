#include "formats/gguf_sniff.h"

#include <algorithm>
#include <cctype>
#include <string_view>

namespace tern {
namespace {

std::string_view as_text(std::span<const uint8_t> bytes, size_t max) {
    return {reinterpret_cast<const char*>(bytes.data()), std::min(bytes.size(), max)};
}

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
    if (s.size() < prefix.size()) return false;
    for (size_t i = 0; i < prefix.size(); ++i)
        if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
    return true;
}

bool looks_like_html(std::span<const uint8_t> bytes) {
    std::string_view s = as_text(bytes, 4096);
    // Skip a UTF-8 byte order mark and leading whitespace, as servers and editors emit them.
    if (s.substr(0, 3) == "\xEF\xBB\xBF") s.remove_prefix(3);
    while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front())))
        s.remove_prefix(1);
    return starts_with_nocase(s, "<!doctype") || starts_with_nocase(s, "<html") || starts_with_nocase(s, "<?xml") ||
           starts_with_nocase(s, "<head") || starts_with_nocase(s, "<!--");
}

uint32_t u32_le(std::span<const uint8_t> b) {
    return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 | static_cast<uint32_t>(b[2]) << 16 |
           static_cast<uint32_t>(b[3]) << 24;
}

} // namespace

std::string describe_non_gguf(std::span<const uint8_t> bytes) {
    if (bytes.empty()) return "the file is empty (0 bytes); expected a GGUF model (interrupted download?)";

    if (looks_like_html(bytes))
        return "this is an HTML page, not a GGUF model (the download saved a web page: use the direct "
               "file link, e.g. Hugging Face's /resolve/ URL rather than /blob/)";
    if (as_text(bytes, 64).starts_with("version https://git-lfs"))
        return "this is a git-LFS pointer file, not the model (run 'git lfs pull' in the repository or "
               "download the file itself)";

    // The pre-GGUF formats began with a u32 magic written little-endian: 'ggml' (unversioned),
    // 'ggmf' and 'ggjt' (versioned), so the first bytes read "lmgg", "fmgg", "tjgg".
    if (bytes.size() >= 4) {
        switch (u32_le(bytes)) {
        case 0x67676d6c:
            return "this is an old unversioned GGML model (pre-GGUF, 2023); convert it to GGUF";
        case 0x67676d66:
            return "this is an old GGMF model (pre-GGUF, 2023); convert it to GGUF";
        case 0x67676a74:
            return "this is an old GGJT model (pre-GGUF, 2023); convert it to GGUF";
        default:
            break;
        }
    }
    // A safetensors file starts with a u64 header length and then a JSON object.
    if (bytes.size() >= 10 && bytes[8] == '{' && bytes[9] == '"')
        return "this looks like a safetensors file, not GGUF; convert it to GGUF first";
    if (bytes.size() >= 4 && bytes[0] == 'P' && bytes[1] == 'K' && bytes[2] == 3 && bytes[3] == 4)
        return "this is a zip archive (a PyTorch checkpoint?), not GGUF; convert it to GGUF first";

    // Preallocated or failed downloads are often all zeros. Looking at the first MiB is enough to
    // say so without reading a multi-GB file on the error path.
    const size_t probe = std::min<size_t>(bytes.size(), 1 << 20);
    if (std::all_of(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(probe),
                    [](uint8_t b) { return b == 0; })) {
        if (probe == bytes.size())
            return "the file contains only zero bytes, not a GGUF model (an incomplete or preallocated download?)";
        return "the file starts with " + std::to_string(probe) +
               " zero bytes, not a GGUF model (an incomplete or preallocated download?)";
    }
    return "";
}

} // namespace tern
