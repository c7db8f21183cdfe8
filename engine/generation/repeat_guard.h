#pragma once
// Repetition guard: small models under greedy decoding often fall into a loop ("She was happy.
// She was happy. She was happy. ..."), which nothing stops before -n. The guard watches the
// generated token ids, notices a looping tail and says how many tail tokens to cut so that exactly
// one occurrence of the looping span remains; Session::generate then stops with
// StopReason::repetition.
//
// A loop is a span of S tokens repeated back to back: the tail has period S. Short spans repeat by
// chance in ordinary text ("the the", "!!", "1, 1, 1"), so a loop must also be long in tokens: a
// span needs max(min_repeats, ceil(min_loop_tokens / S)) occurrences, and a span of long_span
// tokens or more, which ordinary text never repeats verbatim back to back, only two.
//
// Copying is not looping: a passage the prompt asks to repeat may itself repeat ("la la la ...",
// a list with equal rows). A periodic tail that occurs whole in the prompt is left alone; the
// prompt is indexed once (a suffix automaton) so that checking this costs O(1) per token.
//
// Cost per generated token: O(max_span) (one comparison per candidate period).
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace tern {

struct RepeatGuardParams {
    bool enabled = false;           // off in the engine; `tern run` and `tern chat` turn it on
    int32_t min_repeats = 3;        // back-to-back occurrences a span needs (at least 2)
    int32_t min_loop_tokens = 32;   // ... and together they must cover this many tokens
    int32_t long_span = 32;         // a span this long needs only 2 occurrences; 0: no such rule
    int32_t max_span = 128;         // the longest span looked for
};

// A looping tail found by the guard.
struct RepeatCut {
    int32_t span = 0;      // tokens in one occurrence
    int32_t repeats = 0;   // back-to-back occurrences seen (the last may be partial)
    int32_t cut = 0;       // tail tokens to drop so that one occurrence remains (or, when the loop
                           // began as a copy of the prompt, the copied part: "la la la" x18 in the
                           // prompt, x40 in the output keeps 18)
};

// The longest suffix of a growing token sequence that occurs somewhere in a fixed text, updated in
// amortised O(1) per token (matching statistics over a suffix automaton of the text).
class SubstringMatcher {
public:
    explicit SubstringMatcher(std::span<const int32_t> text);
    // Appends a token to the sequence; returns the length of its longest suffix found in the text.
    int32_t push(int32_t token);
    int32_t match_length() const { return match_; }
    // The length of the longest prefix of `seq` that occurs in the text.
    int32_t prefix_in_text(std::span<const int32_t> seq) const;

private:
    struct State {
        int32_t len = 0;
        int32_t link = -1;
        std::vector<int32_t> out_tokens;   // the tokens of its transitions (copied when cloning)
    };
    int32_t next(int32_t state, int32_t token) const;
    void set_next(int32_t state, int32_t token, int32_t target);
    void extend(int32_t token);

    std::vector<State> states_;
    std::unordered_map<uint64_t, int32_t> transitions_;   // (state << 32 | token) -> state
    int32_t last_ = 0;
    int32_t cur_ = 0;
    int32_t match_ = 0;
};

// A parameter outside its range: which one, and the rule it breaks in words that name no CLI flag
// ("must be in 2..1000 (back-to-back occurrences that make a loop)"); app/ puts its flag in front.
struct RepeatGuardParamsError {
    enum class Field { min_repeats, min_loop_tokens, long_span, max_span };
    Field field;
    std::string rule;
};
// The first parameter outside its range; empty when all are valid.
std::optional<RepeatGuardParamsError> check_repeat_guard_params(const RepeatGuardParams& p);

class RepeatGuard {
public:
    // `prompt`: what the generated tokens continue; loops copied from it are not cut. A disabled
    // guard does nothing and costs nothing.
    RepeatGuard(const RepeatGuardParams& params, std::span<const int32_t> prompt);

    // One more token was generated: `generated` is every generated token so far, the newest last,
    // one longer than at the previous call (the guard reads it; it keeps no copy). Returns the cut
    // when the tail has just become a loop.
    std::optional<RepeatCut> push(std::span<const int32_t> generated);

    // How many of the last generated tokens a later cut could still remove: the length of the
    // longest periodic run ending here. Text of those tokens must not be shown yet.
    int32_t at_risk() const { return at_risk_; }

    bool enabled() const { return params_.enabled; }

    // Occurrences a span of `span` tokens needs before it counts as a loop.
    int32_t repeats_needed(int32_t span) const;

private:
    RepeatGuardParams params_;
    std::optional<SubstringMatcher> prompt_;
    std::vector<int32_t> run_;      // run_[S]: tail positions i with generated[i] == generated[i - S]
    int32_t at_risk_ = 0;
};

// The text side of the guard in Session::generate: how long the streamed text was after each
// generated token, so that the text of the tokens still at risk of a cut is held back from the
// text callback (it is released as soon as the repetition breaks).
class HeldText {
public:
    // The text is `text_size` bytes long once the latest generated token was streamed.
    void token_streamed(size_t text_size) { ends_.push_back(text_size); }
    // Bytes from the start of the text that may be shown while the last `at_risk` tokens could
    // still be cut. A piece is counted with the token that produced it, even when the decoder or
    // a stop-string filter held part of it back from earlier tokens: that only delays it.
    size_t showable(int32_t at_risk, size_t text_size) const;

private:
    std::vector<size_t> ends_;
};

} // namespace tern
