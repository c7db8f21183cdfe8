#include "engine/backend.h"

#include <string>

#include "base/error.h"

namespace tern {

void check_forward_batch(const ForwardBatch& batch, int32_t n_past, int32_t n_ctx, int32_t vocab) {
    const int64_t n = static_cast<int64_t>(batch.tokens.size());
    const int32_t pos0 = batch.pos0;
    if (n == 0) throw UsageError("forward: empty batch");
    if (pos0 != n_past)
        throw UsageError("forward: batch starts at position " + std::to_string(pos0) + " but the KV cache holds " +
                         std::to_string(n_past) + " positions");
    if (pos0 + n > n_ctx)
        throw UsageError("forward: positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) +
                         " do not fit the context of " + std::to_string(n_ctx) + " positions");
    for (int32_t t : batch.tokens)
        if (t < 0 || t >= vocab)
            throw UsageError("forward: token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                             std::to_string(vocab - 1) + ")");
}

size_t Backend::top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out) {
    return select_top_logits(logits(row), penalties, out);
}

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
