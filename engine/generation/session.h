#pragma once
// Session: one conversation with a loaded model. It owns the backend (and through it the KV
// cache), the tokenizer and the list of tokens whose K/V the cache holds, so a later generate()
// whose prompt starts with the same tokens reuses them instead of prefilling again (the in-memory
// half of the prefix cache; `tern chat` relies on it between turns).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/generation/completion_stream.h"
#include "engine/generation/generate_options.h"
#include "engine/generation/request_decoder.h"
#include "engine/prefix_cache/prefix_cache.h"
#include "engine/speculative/drafter.h"
#include "engine/text/tokenizer.h"

namespace tern {

struct Model;

class Session {
public:
    // `backend` must already be loaded with a context of n_ctx positions. `model` keeps the
    // mmapped weights the backend reads alive; it may be null when the backend owns its weights
    // (tests use small fakes).
    Session(std::unique_ptr<Backend> backend, std::unique_ptr<Tokenizer> tokenizer, int32_t n_ctx,
            std::shared_ptr<const Model> model = nullptr);
    // A Session on a backend, tokenizer, prefix cache (null: none) and model (null: none) that others own
    // and that outlive it: a batching engine's one-request-at-a-time path (engine/batch/batch_engine.h).
    Session(Backend& backend, const Tokenizer& tokenizer, int32_t n_ctx, PrefixCache* prefix_cache, const Model* model);

    // Prefills what the KV cache does not already hold of `prompt`, then samples until a stop
    // rule fires. Throws UsageError for an empty prompt or one longer than the context.
    GenerateResult generate(std::span<const int32_t> prompt, const GenerateOptions& options,
                            const TextCallback& on_text = {});

    // Forget the KV cache (a new conversation).
    void reset();

    // Drops positions [begin, end) of the cache and of kv_tokens() (Backend::kv_erase): the
    // context shift of long conversations. Afterwards kv_shifted() is true until reset().
    void erase(int32_t begin, int32_t end);
    // True when the cache went through a shift: its K/V are then close to, but not bit-equal
    // to, a cold prefill of kv_tokens(), so they must not be stored as such (prefix cache).
    bool kv_shifted() const { return kv_shifted_; }
    // Loads a KV snapshot holding the K/V of `tokens` (positions 0..n-1; `shifted` is what
    // kv_shifted() was when it was taken): /load of `tern chat`. Throws UsageError when the
    // backend refuses the snapshot (nothing changes) or its size is not the number of tokens.
    void restore(const KvSnapshot& snapshot, std::span<const int32_t> tokens, bool shifted);

    const Tokenizer& tokenizer() const { return *tokenizer_; }
    // The loaded file (metadata such as the chat template); null for sessions built on fakes.
    const Model* model() const { return model_; }
    Backend& backend() { return *backend_; }
    int32_t n_ctx() const { return n_ctx_; }
    // The tokens whose K/V the cache holds, in position order.
    const std::vector<int32_t>& kv_tokens() const { return kv_tokens_; }

    // The on-disk prefix cache (null: none). generate() then restores the cached blocks of a
    // prompt beyond what memory holds, and stores the prompt's new blocks after generating,
    // unless the cache went through a shift (its K/V would not equal a cold prefill's).
    void set_prefix_cache(std::unique_ptr<PrefixCache> cache) {
        owned_prefix_cache_ = std::move(cache);
        prefix_cache_ = owned_prefix_cache_.get();
    }
    PrefixCache* prefix_cache() { return prefix_cache_; }

private:
    // Keeps the KV of the longest prefix of `prompt` that memory or the on-disk cache holds (never
    // the last prompt token: its logits choose the first generated token). Returns its length.
    size_t reuse_prefix(std::span<const int32_t> prompt, GenerateResult& r);
    void prefill(std::span<const int32_t> tokens, const GenerateOptions& options);
    // Decodes through `decoder` until a stop rule fires; returns it. Each step takes the tokens of the
    // last forward's logit rows into the completion (accepting the drafts they confirm), then forwards
    // the newest token with the next drafts.
    StopReason decode(RequestDecoder& decoder, const GenerateOptions& options);
    // The last forward left `rows` rows of logits: the model files must be unchanged since they were opened
    // and every row finite before any is sampled; their argmax when the decoder wants it.
    void forwarded(RequestDecoder& decoder, size_t rows);
    // Drops the K/V of the last `n` positions (drafts the target did not confirm).
    void forget_last(size_t n);
    // The next token needs a position: false when the cache is full and on_context_full freed none.
    bool make_room(const GenerateOptions& options);
    void forward_step(std::span<const int32_t> step, const GenerateOptions& options);

    // Owned when the Session was given them (declared first: destroyed after the backend that reads them).
    std::shared_ptr<const Model> owned_model_;
    std::unique_ptr<Backend> owned_backend_;
    std::unique_ptr<Tokenizer> owned_tokenizer_;
    std::unique_ptr<PrefixCache> owned_prefix_cache_;
    const Model* model_ = nullptr;
    Backend* backend_ = nullptr;
    const Tokenizer* tokenizer_ = nullptr;
    PrefixCache* prefix_cache_ = nullptr;
    int32_t n_ctx_ = 0;
    std::vector<int32_t> kv_tokens_;
    bool kv_shifted_ = false;
    // What verifying drafted tokens costs on this backend, timed on the decode forwards of
    // speculative steps and kept across calls (chat turns).
    DraftCost draft_cost_;
    std::vector<int32_t> row_argmax_; // forwarded()'s: the argmax of each row, when the decoder wants it
};

} // namespace tern
