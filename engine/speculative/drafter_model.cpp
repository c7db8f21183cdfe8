// Draft-model drafting (drafter_model.h).
#include "engine/speculative/drafter_model.h"

#include <algorithm>
#include <chrono>
#include <stdexcept>

#include "engine/open_model.h"
#include "engine/model.h"
#include "engine/text/tokenizer.h"
#include "base/error.h"

namespace tern {

namespace {

// Prompt tokens per draft-model forward on the first proposal (bounds its activation memory, as
// the session's prefill chunks do).
constexpr size_t kCatchUpChunk = 512;

std::string quoted(std::string_view s) {
    std::string out = "\"";
    for (char c : s.substr(0, 40))
        out += (static_cast<unsigned char>(c) < 0x20 ? '?' : c);
    return out + (s.size() > 40 ? "...\"" : "\"");
}

} // namespace

DraftModelDrafter::DraftModelDrafter(std::unique_ptr<Backend> backend, int32_t n_ctx, int32_t max_tokens,
                                     std::shared_ptr<const Model> model)
    : model_(std::move(model)), backend_(std::move(backend)), n_ctx_(n_ctx), max_tokens_(max_tokens) {
    if (!backend_) throw std::invalid_argument("DraftModelDrafter: a backend is required");
    kv_tokens_.reserve(static_cast<size_t>(std::max(n_ctx_, 0)));
}

void DraftModelDrafter::timed_forward(const ForwardBatch& batch) {
    // Every forward counts, the catch-up over the last accepted tokens too: per drafted token the
    // draft model runs about one forward either way.
    const auto t0 = std::chrono::steady_clock::now();
    backend_->forward(batch);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    forward_ms_ = forward_ms_ > 0.0 ? forward_ms_ + 0.2 * (ms - forward_ms_) : ms;
}

void DraftModelDrafter::begin(std::span<const int32_t> context) {
    // Prefill the prompt now (the session counts this as prefill), keeping whatever cached prefix
    // still matches: a new generation on the same conversation reuses the draft model's KV too.
    sync(context, false);
}

// Makes the cache hold `history`: keeps the prefix that agrees, runs the rest in one forward per
// chunk. `rerun_last`: run the last token even when cached, for its logits.
void DraftModelDrafter::sync(std::span<const int32_t> history, bool rerun_last) {
    size_t n = history.size();
    size_t common = 0;
    const size_t limit = std::min(kv_tokens_.size(), rerun_last && n > 0 ? n - 1 : n);
    while (common < limit && kv_tokens_[common] == history[common])
        ++common;
    if (common != kv_tokens_.size()) {
        backend_->kv_truncate(static_cast<int32_t>(common));
        kv_tokens_.resize(common);
    }
    n = std::min(n, static_cast<size_t>(std::max(n_ctx_, 0)));
    for (size_t i = common; i < n; i += kCatchUpChunk) {
        const std::span<const int32_t> part = history.subspan(i, std::min(kCatchUpChunk, n - i));
        ForwardBatch batch;
        batch.tokens = part;
        batch.pos0 = static_cast<int32_t>(kv_tokens_.size());
        batch.wanted = LogitsWanted::last;
        timed_forward(batch);
        kv_tokens_.insert(kv_tokens_.end(), part.begin(), part.end());
    }
}

void DraftModelDrafter::propose(std::span<const int32_t> history, int32_t max_tokens, const DraftCost& cost,
                                std::vector<int32_t>& out) {
    out.clear();
    if (history.empty()) return;
    // The draft forward's cost in target steps; unknown (0) until the first draft is timed.
    const double draft_cost = cost.step_ms > 0.0 ? forward_ms_ / cost.step_ms : 0.0;
    const int32_t k =
        best_draft_length(rate_.rate(), cost.relative_column_cost() + draft_cost, std::min(max_tokens, max_tokens_));
    if (k <= 0) {
        rate_.forget();
        return;
    }

    // A guard only: the draft shares the target's context size (load_draft_model), and the session keeps its
    // history within that context (it shifts or stops first).
    if (history.size() > static_cast<size_t>(n_ctx_)) return;
    // The last history token is always run again, because its logits give the first draft.
    sync(history, true);

    // Greedy: the draft's most likely token is the likeliest to match the target, greedy or not.
    for (;;) {
        int32_t token = 0;
        backend_->argmax(std::span<int32_t>(&token, 1));
        out.push_back(token);
        if (static_cast<int32_t>(out.size()) >= k || static_cast<int32_t>(kv_tokens_.size()) >= n_ctx_) break;
        ForwardBatch batch;
        batch.tokens = std::span<const int32_t>(&out.back(), 1);
        batch.pos0 = static_cast<int32_t>(kv_tokens_.size());
        timed_forward(batch);
        kv_tokens_.push_back(token);
    }
}

void check_draft_vocab(const Model& target, const Model& draft) {
    const VocabSpec t = Tokenizer::read_vocab(target.file);
    const VocabSpec d = Tokenizer::read_vocab(draft.file);
    const std::string head = draft.file.path() + ": ";
    const std::string hint = " (the draft must share the target's tokenizer: use a smaller or more quantized model "
                             "of the same family)";
    if (d.model != t.model)
        throw DraftModelUnfit(head + "its tokenizer is '" + d.model + "' but the target " + target.file.path() +
                                  "'s is '" + t.model + "'" + hint, true);
    if (d.tokens.size() != t.tokens.size() || draft.config.vocab != target.config.vocab)
        throw DraftModelUnfit(head + "its vocabulary has " + std::to_string(d.tokens.size()) + " tokens (" +
                                  std::to_string(draft.config.vocab) + " logits) but the target " +
                                  target.file.path() + "'s has " + std::to_string(t.tokens.size()) + " (" +
                                  std::to_string(target.config.vocab) + ")" + hint, true);
    for (size_t i = 0; i < t.tokens.size(); ++i)
        if (d.tokens[i] != t.tokens[i])
            throw DraftModelUnfit(head + "token " + std::to_string(i) + " is " + quoted(d.tokens[i]) + " but " +
                                      quoted(t.tokens[i]) + " in the target " + target.file.path() + hint, true);
}

std::unique_ptr<DraftModelDrafter> load_draft_model(const OpenRequest& request, const Model& target,
                                                    int32_t max_tokens) {
    OpenRequest r = request;
    bool vocab_checked = false;   // errors after the check are not the file's
    r.on_file_opened = [&](const Model& draft) {
        check_draft_vocab(target, draft);
        vocab_checked = true;
    };
    OpenedModel opened;
    try {
        opened = open_model(r);
    } catch (const DraftModelUnfit&) {
        throw;
    } catch (const InputError& e) {
        if (vocab_checked) throw;
        throw DraftModelUnfit(e.what(), false);
    }
    const int32_t n_ctx = opened.context.n_ctx;
    return std::make_unique<DraftModelDrafter>(std::move(opened.backend), n_ctx, max_tokens, std::move(opened.model));
}

} // namespace tern
