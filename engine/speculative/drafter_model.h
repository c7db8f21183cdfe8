#pragma once
// Draft-model speculation (drafter.h): a second, smaller (or more quantized) model with the same
// vocabulary decodes K tokens greedily; the target verifies them in one forward. The draft model
// has its own backend and KV cache, kept in step with the session's history by prefix matching:
// each proposal keeps the cached positions that still agree with the history (so rejected drafts
// are dropped with kv_truncate) and runs only the tokens after them.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "engine/backend.h"
#include "engine/open_model.h"
#include "engine/speculative/drafter.h"

namespace tern {

struct Model;

class DraftModelDrafter : public Drafter {
public:
    // `backend` is loaded with a context of n_ctx positions; `model` keeps its weights mapped (may
    // be null for backends that own their weights).
    DraftModelDrafter(std::unique_ptr<Backend> backend, int32_t n_ctx, int32_t max_tokens,
                      std::shared_ptr<const Model> model = nullptr);

    void begin(std::span<const int32_t> context) override;
    // Drafts as many tokens as pay for their cost: each costs a verified column on the target plus
    // one draft-model forward (timed here), against the acceptance rate of recent drafts.
    void propose(std::span<const int32_t> history, int32_t max_tokens, const DraftCost& cost,
                 std::vector<int32_t>& out) override;
    void observe(int32_t proposed, int32_t accepted) override { rate_.observe(proposed, accepted); }
    std::string_view name() const override { return "draft-model"; }

    // The tokens whose K/V the draft model's cache holds (tests).
    const std::vector<int32_t>& kv_tokens() const { return kv_tokens_; }

private:
    void timed_forward(const ForwardBatch& batch);
    void sync(std::span<const int32_t> history, bool rerun_last);

    std::shared_ptr<const Model> model_; // declared first: outlives the backend that reads it
    std::unique_ptr<Backend> backend_;
    int32_t n_ctx_;
    int32_t max_tokens_;
    AcceptanceRate rate_;
    double forward_ms_ = 0.0; // running average of one single-token draft forward
    std::vector<int32_t> kv_tokens_;
};

// The draft model's file cannot serve (exit 2): it does not open (vocabulary false; what() is the
// file's error), or its vocabulary is not the target's (vocabulary true; what() starts with its
// path). The app names the flag that gave the file.
struct DraftModelUnfit : InputError {
    DraftModelUnfit(const std::string& message, bool vocabulary_) : InputError(message), vocabulary(vocabulary_) {}
    bool vocabulary;
};

// Throws DraftModelUnfit (vocabulary true) when `draft` cannot draft for `target`: a different
// tokenizer kind, vocabulary size or token text, or logit width. Drafted ids must mean the same
// text to both models, or every draft would be rejected (and an id past the target's vocabulary
// could not even be verified).
void check_draft_vocab(const Model& target, const Model& draft);

// Opens --draft-model (request.path) through open_model with the target's settings (device,
// context, KV type, threads), checking its vocabulary against the target's before anything large is
// allocated, and its memory like any model's. Errors of the file are DraftModelUnfit.
std::unique_ptr<DraftModelDrafter> load_draft_model(const OpenRequest& request, const Model& target, int32_t max_tokens);

} // namespace tern
