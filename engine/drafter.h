#pragma once
// Drafters for speculative decoding: cheap guesses of the next few tokens, which the session then
// checks with ONE forward of the target model over [last token + guesses] (DESIGN.md). A guess only
// saves time when it is right; it never changes the output, because the session keeps a drafted
// token only where the target itself would have produced it.
//
// Two kinds:
//   PromptLookupDrafter  copies what followed the most recent earlier occurrence of the last few
//                        tokens (summaries, code edits, quoting: the output repeats the input).
//   DraftModelDrafter    a second, smaller model with the same vocabulary decodes K tokens greedily
//                        (drafter_model.h).
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tern {

class Drafter {
public:
    virtual ~Drafter() = default;

    // A new generation: `context` is everything before the first token to generate (the prompt).
    virtual void begin(std::span<const int32_t> context) = 0;

    // Up to `max_tokens` tokens likely to follow `history` (appended to `out`, which is cleared
    // first; it may stay empty). Between two begin() calls `history` only grows: it is the context
    // plus every token generated since, so a drafter may index it incrementally.
    virtual void propose(std::span<const int32_t> history, int32_t max_tokens, std::vector<int32_t>& out) = 0;

    // How the last proposal fared: `accepted` of its first tokens were what the target produced.
    virtual void observe(int32_t proposed, int32_t accepted) = 0;

    virtual std::string_view name() const = 0; // "lookup", "draft-model"
};

// The draft length a drafter asks for, adapted to how its recent drafts fared, so that a run of
// wrong guesses costs little: every wrong drafted token is a wasted column of the verify forward
// (and, for a draft model, a wasted draft forward). A fully accepted draft grows the length back
// towards the maximum quickly; a rejection shrinks it to just past what was accepted.
class AdaptiveDraftLength {
public:
    explicit AdaptiveDraftLength(int32_t max_tokens);
    int32_t current() const { return current_; }
    int32_t max() const { return max_; }
    void observe(int32_t proposed, int32_t accepted);

private:
    int32_t max_;
    int32_t current_;
};

// Prompt lookup: an index of every n-gram of the history (n = n_min .. n_max), from its hash to
// the position just after its most recent occurrence. It grows by the new tokens on each call, so
// a step costs O(n_max) hash updates plus one lookup per n, whatever the history's length. The
// longest n-gram that matches the history's tail wins (a longer match is a more specific context).
class PromptLookupDrafter : public Drafter {
public:
    // max_tokens: the most tokens one proposal drafts (--lookup K); n_max: the longest n-gram tried
    // (--lookup-ngram N); n_min: the shortest.
    PromptLookupDrafter(int32_t max_tokens, int32_t n_max, int32_t n_min = 1);

    void begin(std::span<const int32_t> context) override;
    void propose(std::span<const int32_t> history, int32_t max_tokens, std::vector<int32_t>& out) override;
    void observe(int32_t proposed, int32_t accepted) override { length_.observe(proposed, accepted); }
    std::string_view name() const override { return "lookup"; }

    // The proposal for a history without the adaptive length (tests; propose() caps it).
    void lookup(std::span<const int32_t> history, int32_t max_tokens, std::vector<int32_t>& out);

private:
    void index_up_to(std::span<const int32_t> history);
    uint64_t hash_ending_at(size_t end, int32_t n) const; // tokens_[end - n, end)

    int32_t n_min_, n_max_;
    AdaptiveDraftLength length_;
    std::vector<int32_t> tokens_; // the history indexed so far
    // One map per n (index n - n_min): n-gram hash -> position of the token that followed it.
    std::vector<std::unordered_map<uint64_t, int32_t>> index_;
};

} // namespace tern
