#include "kernels/kv_format.h"

#include <string>

#include "base/error.h"

namespace tern {

std::string_view kv_type_name(KvType t) {
    for (const KvFormatInfo& f : kKvFormats)
        if (f.type == t) return f.name;
    return "unknown";
}

KvType kv_type_from_name(std::string_view name) {
    for (const KvFormatInfo& f : kKvFormats)
        if (f.name == name) return f.type;
    std::string choices;
    for (const KvFormatInfo& f : kKvFormats) {
        if (!choices.empty()) choices += ", ";
        choices += f.name;
    }
    throw UsageError("unknown KV cache type '" + std::string(name) + "' (choices: " + choices + ")");
}

} // namespace tern
