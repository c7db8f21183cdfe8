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

// What drafting costs on the target, measured by the session: a forward of 1 + k tokens takes about
// step_ms + k * column_ms. On a CPU that is compute-bound each verified column costs a sizeable
// part of a step; on a memory-bound device almost nothing. Zero: not measured yet.
struct DraftCost {
    double step_ms = 0.0;
    double column_ms = 0.0;
    int32_t column_samples = 0; // forwards of more than one token timed so far

    // One decode forward of `tokens` tokens took `ms` (running averages: a noisy neighbour moves
    // them slowly).
    void record(int32_t tokens, double ms);
    // column_ms / step_ms, with a prior of 0.25 until both are measured.
    double relative_column_cost() const;
};

class Drafter {
public:
    virtual ~Drafter() = default;

    // A new generation: `context` is everything before the first token to generate (the prompt).
    virtual void begin(std::span<const int32_t> context) = 0;

    // Up to `max_tokens` tokens likely to follow `history` (appended to `out`, which is cleared
    // first; it may stay empty, and should when drafting is not expected to pay for its `cost`).
    // Between two begin() calls `history` only grows: it is the context plus every token generated
    // since, so a drafter may index it incrementally.
    virtual void propose(std::span<const int32_t> history, int32_t max_tokens, const DraftCost& cost,
                         std::vector<int32_t>& out) = 0;

    // How the last proposal fared: `accepted` of its first tokens were what the target produced.
    virtual void observe(int32_t proposed, int32_t accepted) = 0;

    virtual std::string_view name() const = 0; // "lookup", "draft-model"
};

// Per-token acceptance probability of a drafter's proposals, from recent proposals (older ones
// decay), assuming each drafted token holds with the same probability a given the ones before.
class AcceptanceRate {
public:
    double rate() const; // the estimate of a; 0.5 with no evidence
    void observe(int32_t proposed, int32_t accepted);
    // A proposal was withheld (not worth its cost at this rate): let the estimate drift back
    // towards the prior, so a drafter that stopped drafting tries again now and then.
    void forget();

private:
    double hits_ = 0.0, trials_ = 0.0;
};

// The draft length k in 0..max_tokens with the best expected speed: (1 + a + a^2 + ... + a^k)
// tokens per step for a step cost of 1 + k * cost_per_token (both in plain decode steps). 0 when
// no length beats plain decoding.
int32_t best_draft_length(double acceptance, double cost_per_token, int32_t max_tokens);

// Prompt lookup: an index of every n-gram of the history (n = n_min .. n_max), from its hash to
// the position just after its most recent occurrence. It grows by the new tokens on each call, so
// a step costs O(n_max) hash updates plus one lookup per n, whatever the history's length. The
// longest n-gram that matches the history's tail wins (a longer match is a more specific context),
// and each match length keeps its own acceptance rate: one repeated token predicts much less than
// three.
class PromptLookupDrafter : public Drafter {
public:
    // max_tokens: the most tokens one proposal drafts (--lookup K); n_max: the longest n-gram tried
    // (--lookup-ngram N); n_min: the shortest.
    PromptLookupDrafter(int32_t max_tokens, int32_t n_max, int32_t n_min = 1);

    void begin(std::span<const int32_t> context) override;
    // The lookup's continuation, cut to the length that pays for its cost at the acceptance rate
    // of recent proposals from matches of the same length.
    void propose(std::span<const int32_t> history, int32_t max_tokens, const DraftCost& cost,
                 std::vector<int32_t>& out) override;
    void observe(int32_t proposed, int32_t accepted) override;
    std::string_view name() const override { return "lookup"; }

    // The whole continuation for a history, uncut (tests; propose() cuts it). Returns the length
    // of the n-gram that matched (0: none).
    int32_t lookup(std::span<const int32_t> history, int32_t max_tokens, std::vector<int32_t>& out);

private:
    void index_up_to(std::span<const int32_t> history);
    uint64_t hash_ending_at(size_t end, int32_t n) const; // tokens_[end - n, end)

    int32_t n_min_, n_max_, max_tokens_;
    std::vector<AcceptanceRate> rate_; // per matched n-gram length (index n - n_min)
    int32_t last_n_ = 0;               // the match length of the last proposal
    std::vector<int32_t> tokens_;      // the history indexed so far
    // One map per n (index n - n_min): n-gram hash -> position of the token that followed it.
    std::vector<std::unordered_map<uint64_t, int32_t>> index_;
};

} // namespace tern
