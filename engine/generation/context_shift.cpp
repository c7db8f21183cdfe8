#include "engine/generation/context_shift.h"

#include <algorithm>

#include "engine/generation/session.h"

namespace tern {

int32_t context_shift_size(int32_t n_cached, int32_t n_keep) {
    const int32_t rest = n_cached - std::clamp(n_keep, 0, n_cached);
    if (rest <= 0) return 0;
    return std::max(rest / 2, 1);
}

int32_t shift_context(Session& session, int32_t n_keep) {
    const int32_t n_cached = static_cast<int32_t>(session.kv_tokens().size());
    const int32_t keep = std::clamp(n_keep, 0, n_cached);
    const int32_t drop = context_shift_size(n_cached, keep);
    if (drop > 0) session.erase(keep, keep + drop);
    return drop;
}

} // namespace tern
