#include "engine/backend.h"

#include <array>
#include <string>
#include <utility>

#include "base/error.h"

namespace tern {
namespace {

constexpr std::array<std::pair<KvType, std::string_view>, 5> kKvTypeNames = {{
    {KvType::f32, "f32"},
    {KvType::f16, "f16"},
    {KvType::bf16, "bf16"},
    {KvType::q8_0, "q8_0"},
    {KvType::f8_e4m3, "f8_e4m3"},
}};

} // namespace

std::string_view kv_type_name(KvType t) {
    for (const auto& [type, name] : kKvTypeNames)
        if (type == t) return name;
    return "unknown";
}

KvType kv_type_from_name(std::string_view name) {
    for (const auto& [type, n] : kKvTypeNames)
        if (n == name) return type;
    std::string choices;
    for (const auto& [type, n] : kKvTypeNames) {
        if (!choices.empty()) choices += ", ";
        choices += n;
    }
    throw UsageError("unknown KV cache type '" + std::string(name) + "' (choices: " + choices + ")");
}

} // namespace tern

namespace tern {

void Backend::kv_erase(int32_t begin, int32_t end) {
    throw RuntimeFailure(device_name() + ": this backend cannot shift its KV cache (erase of positions " +
                         std::to_string(begin) + ".." + std::to_string(end) + ")");
}

} // namespace tern

namespace tern {

KvSnapshot Backend::kv_save_range(int32_t begin, int32_t end) const {
    throw RuntimeFailure(device_name() + ": this backend cannot save a range of its KV cache (positions " +
                         std::to_string(begin) + ".." + std::to_string(end) + ")");
}

void Backend::kv_append(const KvSnapshot&) {
    throw RuntimeFailure(device_name() + ": this backend cannot append a saved range to its KV cache");
}

} // namespace tern

namespace tern {

void Backend::set_observer(ForwardObserver* observer) {
    if (observer) throw RuntimeFailure(device_name() + ": this backend cannot report its projection inputs");
}

} // namespace tern
