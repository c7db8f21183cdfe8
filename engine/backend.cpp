#include "engine/backend.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"

namespace tern {

namespace {

void check_positions(int32_t pos0, int64_t n, int32_t n_past, int32_t n_ctx) {
    if (pos0 != n_past)
        throw UsageError("forward: batch starts at position " + std::to_string(pos0) + " but the KV cache holds " +
                         std::to_string(n_past) + " positions");
    if (pos0 + n > n_ctx)
        throw UsageError("forward: positions " + std::to_string(pos0) + ".." + std::to_string(pos0 + n - 1) +
                         " do not fit the context of " + std::to_string(n_ctx) + " positions");
}

} // namespace

void check_seq_truncate(int32_t seq, int32_t n, int32_t n_past) {
    if (n < 0 || n > n_past)
        throw UsageError("seq_truncate: cannot keep " + std::to_string(n) + " positions of sequence " +
                         std::to_string(seq) + ", it holds " + std::to_string(n_past));
}

void check_seq_free(int32_t seq) {
    if (seq == 0) throw UsageError("seq_free: sequence 0 is the backend's own; truncate it instead");
}

void check_forward_batch(const ForwardBatch& batch, int32_t n_past, int32_t n_ctx, int32_t vocab,
                         const std::function<int32_t(int32_t seq)>& n_past_of) {
    const int64_t n = static_cast<int64_t>(batch.tokens.size());
    if (n == 0) throw UsageError("forward: empty batch");
    if (batch.spans.empty()) {
        check_positions(batch.pos0, n, n_past, n_ctx);
    } else {
        if (!n_past_of) throw UsageError("forward: this backend runs one sequence, the batch has spans");
        int64_t covered = 0;
        std::vector<int32_t> seen;
        for (const SequenceSpan& s : batch.spans) {
            if (s.n_tokens <= 0) throw UsageError("forward: a sequence span without tokens");
            if (std::find(seen.begin(), seen.end(), s.seq) != seen.end())
                throw UsageError("forward: sequence " + std::to_string(s.seq) + " appears twice in one batch");
            seen.push_back(s.seq);
            const int32_t past = n_past_of(s.seq);
            check_positions(past, s.n_tokens, past, n_ctx);
            covered += s.n_tokens;
        }
        if (covered != n)
            throw UsageError("forward: the spans cover " + std::to_string(covered) + " tokens of " + std::to_string(n));
    }
    for (int32_t t : batch.tokens)
        if (t < 0 || t >= vocab)
            throw UsageError("forward: token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                             std::to_string(vocab - 1) + ")");
}

size_t Backend::top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out) {
    return select_top_logits(logits(row), penalties, out);
}

FloatScan Backend::scan_logits(int row) { return scan_floats(logits(row)); }

namespace {
[[noreturn]] void one_sequence(const Backend& b, const char* what) {
    throw RuntimeFailure(b.device_name() + ": this backend runs one sequence (" + what + ")");
}
} // namespace

void Backend::seq_create(int32_t) { one_sequence(*this, "seq_create"); }
void Backend::seq_free(int32_t) { one_sequence(*this, "seq_free"); }
void Backend::seq_fork(int32_t, int32_t, int32_t) { one_sequence(*this, "seq_fork"); }
int32_t Backend::seq_n_past(int32_t) const { one_sequence(*this, "seq_n_past"); }
void Backend::seq_truncate(int32_t, int32_t) { one_sequence(*this, "seq_truncate"); }
KvPoolUse Backend::kv_pool() const { one_sequence(*this, "kv_pool"); }

KvSnapshot Backend::seq_save_range(int32_t seq, int32_t begin, int32_t end) const {
    if (seq != 0) one_sequence(*this, "seq_save_range");
    return kv_save_range(begin, end);
}

void Backend::seq_append(int32_t seq, const KvSnapshot& range) {
    if (seq != 0) one_sequence(*this, "seq_append");
    kv_append(range);
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
