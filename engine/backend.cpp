#include "engine/backend.h"

#include <string>

#include "base/error.h"

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
