// CompletionStream (engine/generation/completion_stream.h) fed token by token, without a model: what
// the text callback receives and when, the verdicts, and what finish() releases or drops. The same
// rules through Session::generate are in test_session.cpp and test_repeat_guard.cpp.
#include <doctest/doctest.h>

#include <optional>
#include <string>
#include <vector>

#include "engine/generation/completion_stream.h"
#include "tests/fake_tokenizer.h"

using namespace tern;

namespace {

// Token i's piece is kPieces[i]; 0..2 are empty (control tokens).
const std::vector<std::string> kPieces = {
    "", "", "",
    "a ", "b ", "c ", "d ",   // 3..6: words
    "\xC3", "\xA9",           // 7, 8: the two bytes of "é"
    "E", "N", "D", "X",       // 9..12: letters for stop strings
};

// The pieces above; token 2 is the end-of-generation token.
struct PieceTokenizer : test::FakeTokenizer {
    PieceTokenizer() : FakeTokenizer(kPieces) {}
};

// A stream whose callback records every piece it receives.
struct Recorded {
    PieceTokenizer tokenizer;
    std::vector<std::string> pieces;
    bool refuse = false;   // the callback returns false (a closed stdout)
    CompletionStream stream;

    explicit Recorded(std::vector<std::string> stops = {}, RepeatGuardParams guard = {},
                      std::vector<int32_t> prompt = {1})
        : stream(tokenizer, prompt, std::move(stops), guard, [this](std::string_view piece) {
              pieces.emplace_back(piece);
              return !refuse;
          }) {}

    std::string shown() const {
        std::string s;
        for (const std::string& p : pieces) s += p;
        return s;
    }
};

RepeatGuardParams guard_on() {
    RepeatGuardParams p;
    p.enabled = true;
    p.min_repeats = 3;
    p.min_loop_tokens = 6;
    p.long_span = 0;
    p.max_span = 8;
    return p;
}

} // namespace

TEST_CASE("CompletionStream: text is shown token by token and kept once as the result") {
    Recorded r;
    CHECK(!r.stream.push(3));
    CHECK(!r.stream.push(4));
    CHECK(r.pieces == std::vector<std::string>{"a ", "b "});
    CHECK(r.stream.finish(StopReason::length) == StopReason::length);
    CHECK(r.pieces.size() == 2);   // nothing was held back
    CHECK(r.stream.history().size() == 3);   // the prompt, then the generated tokens
    CHECK(r.stream.n_generated() == 2);
    CHECK(r.stream.take_generated() == std::vector<int32_t>{3, 4});
    CHECK(r.stream.take_text() == "a b ");
}

TEST_CASE("CompletionStream: a UTF-8 character split across tokens is shown once complete") {
    Recorded r;
    CHECK(!r.stream.push(3));
    CHECK(!r.stream.push(7));      // first byte of "é": held
    CHECK(r.pieces == std::vector<std::string>{"a "});
    CHECK(r.stream.text() == "a ");
    CHECK(!r.stream.push(8));
    CHECK(r.pieces == std::vector<std::string>{"a ", "\xC3\xA9"});
    r.stream.finish(StopReason::eos);
    CHECK(r.stream.text() == "a \xC3\xA9");

    // Generation ends inside a character: the partial one becomes U+FFFD, shown at the end.
    Recorded cut;
    CHECK(!cut.stream.push(7));
    CHECK(cut.pieces.empty());
    CHECK(cut.stream.finish(StopReason::length) == StopReason::length);
    CHECK(cut.pieces == std::vector<std::string>{"\xEF\xBF\xBD"});
}

TEST_CASE("CompletionStream: a stop string across tokens is never shown, not even in part") {
    Recorded r({"END"});
    CHECK(!r.stream.push(3));
    CHECK(!r.stream.push(9));      // "E"
    CHECK(!r.stream.push(10));     // "N"
    CHECK(r.shown() == "a ");
    CHECK(r.stream.push(11) == StopReason::stop);
    CHECK(r.stream.finish(StopReason::stop) == StopReason::stop);
    CHECK(r.shown() == "a ");
    CHECK(r.stream.text() == "a ");
    CHECK(r.stream.generated().size() == 4);   // the stop string's tokens stay generated tokens
}

TEST_CASE("CompletionStream: a partial stop string that diverges is shown when it does") {
    Recorded r({"END"});
    CHECK(!r.stream.push(9));      // "E"
    CHECK(!r.stream.push(10));     // "N"
    CHECK(r.pieces.empty());
    CHECK(!r.stream.push(12));     // "X": not a stop string after all
    CHECK(r.pieces == std::vector<std::string>{"ENX"});
    // A partial one still held at the end is released by finish().
    CHECK(!r.stream.push(9));
    CHECK(r.pieces.size() == 1);
    CHECK(r.stream.finish(StopReason::length) == StopReason::length);
    CHECK(r.shown() == "ENXE");
    CHECK(r.stream.text() == "ENXE");
}

TEST_CASE("CompletionStream: text released by finish() can complete a stop string") {
    // The decoder's U+FFFD for a dangling byte completes the stop string "a\uFFFD".
    Recorded r({"a \xEF\xBF\xBD"});
    CHECK(!r.stream.push(3));      // "a ": held, it starts the stop string
    CHECK(!r.stream.push(7));      // a dangling first byte
    CHECK(r.pieces.empty());
    CHECK(r.stream.finish(StopReason::length) == StopReason::stop);
    CHECK(r.pieces.empty());
    CHECK(r.stream.text().empty());
}

TEST_CASE("CompletionStream: the guard cuts a loop to one occurrence; its tail is never shown") {
    Recorded r({}, guard_on());
    const std::vector<int32_t> tokens = {3, 4, 5, 4, 5, 4, 5};   // "a " then "b c " three times
    Verdict v;
    size_t pushed = 0;
    for (int32_t t : tokens) {
        v = r.stream.push(t);
        ++pushed;
        if (v) break;
    }
    CHECK(pushed == tokens.size());
    REQUIRE(v == StopReason::repetition);
    CHECK(r.stream.repeat_cut().span == 2);
    CHECK(r.stream.repeat_cut().cut == 4);
    CHECK(r.stream.finish(*v) == StopReason::repetition);
    CHECK(std::vector<int32_t>(r.stream.generated().begin(), r.stream.generated().end()) ==
          std::vector<int32_t>{3, 4, 5});
    CHECK(r.stream.text() == "a b c ");
    CHECK(r.shown() == "a b c ");
}

TEST_CASE("CompletionStream: text of tokens the guard may still cut waits, and is shown once the loop breaks") {
    Recorded r({}, guard_on());
    for (int32_t t : {3, 4, 5, 4, 5}) CHECK(!r.stream.push(t));
    CHECK(r.shown() == "a b c ");   // the second "b c " may still become a loop
    CHECK(!r.stream.push(6));       // "d ": it did not
    CHECK(r.shown() == "a b c b c d ");
}

TEST_CASE("CompletionStream: Ctrl-C drops the tokens the guard was holding back; the end of the text still shows") {
    SUBCASE("cancelled: the reply ends where it was seen to stop") {
        Recorded r({}, guard_on());
        for (int32_t t : {3, 4, 5, 4, 5}) CHECK(!r.stream.push(t));
        const size_t pieces = r.pieces.size();
        CHECK(r.stream.finish(StopReason::cancelled) == StopReason::cancelled);
        CHECK(r.pieces.size() == pieces);   // nothing after the "^C"
        CHECK(r.stream.n_generated() == 3);
        CHECK(r.stream.text() == "a b c ");
    }
    SUBCASE("any other end shows the held text") {
        Recorded r({}, guard_on());
        for (int32_t t : {3, 4, 5, 4, 5}) CHECK(!r.stream.push(t));
        CHECK(r.stream.finish(StopReason::length) == StopReason::length);
        CHECK(r.stream.n_generated() == 5);
        CHECK(r.shown() == "a b c b c ");
    }
}

TEST_CASE("CompletionStream: a callback that refuses text stops with cancelled and gets nothing more") {
    Recorded r({"END"}, guard_on());
    CHECK(!r.stream.push(3));
    r.refuse = true;
    CHECK(r.stream.push(4) == StopReason::cancelled);
    CHECK(r.pieces.size() == 2);   // the refused piece was offered once
    CHECK(r.stream.finish(StopReason::cancelled) == StopReason::cancelled);
    CHECK(r.pieces.size() == 2);
    CHECK(r.stream.text() == "a b ");
    CHECK(r.stream.n_generated() == 2);   // no guard drop: the reader is gone, not the user

    // What the filter holds is not released to a closed output either.
    Recorded held({"END"});
    CHECK(!held.stream.push(9));   // "E": held back
    held.refuse = true;
    CHECK(held.stream.push(3) == StopReason::cancelled);   // "Ea " offered and refused
    CHECK(held.stream.finish(StopReason::cancelled) == StopReason::cancelled);
    CHECK(held.pieces == std::vector<std::string>{"Ea "});
}

TEST_CASE("CompletionStream: without a callback the text still accumulates") {
    PieceTokenizer tok;
    CompletionStream s(tok, std::vector<int32_t>{1, 3}, {"X"}, RepeatGuardParams{});
    CHECK(!s.push(4));
    CHECK(s.push(12) == StopReason::stop);
    CHECK(s.finish(StopReason::stop) == StopReason::stop);
    CHECK(s.history().size() == 4);
    CHECK(s.take_text() == "b ");
}
