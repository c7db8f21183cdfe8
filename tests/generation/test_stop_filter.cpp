// StopStringFilter (engine/generation/stop_filter.h): text that could still become a stop string is
// held back; a whole one cuts the text before it. Session-level stop rules are in test_session.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "engine/generation/stop_filter.h"

using namespace tern;

namespace {

// The text a filter releases for `pieces`, flushed at the end.
std::string filtered(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
    StopStringFilter f(stops);
    std::string out;
    for (const std::string& p : pieces) out += f.push(p);
    return out + f.flush();
}

} // namespace

TEST_CASE("StopStringFilter holds back a possible stop string and trims a whole one") {
    StopStringFilter f({"END", "xyz"});
    CHECK(f.push("abc") == "abc");
    CHECK(f.push("E") == "");        // could be the start of END
    CHECK(f.push("N") == "");
    CHECK(f.push("X") == "ENX");     // it was not
    CHECK(f.push("hello EN") == "hello ");
    CHECK(f.push("D and more") == "");
    CHECK(f.matched());
    CHECK(f.push("later") == "");
    CHECK(f.flush() == "");
}

TEST_CASE("StopStringFilter: earliest stop wins, held text is released at the end") {
    StopStringFilter f({"bb", "abb"});
    CHECK(f.push("xab") == "x");   // "ab" is a prefix of "abb", "b" of "bb"
    CHECK(f.push("b!") == "");     // "abb" at 1 is earlier than "bb" at 2
    CHECK(f.matched());

    StopStringFilter g({"</s>"});
    CHECK(g.push("a</") == "a");
    CHECK(g.flush() == "</");

    StopStringFilter none({"", ""});   // empty stop strings are ignored
    CHECK(none.push("abc") == "abc");
    CHECK(!none.matched());
}

TEST_CASE("StopStringFilter: overlapping prefixes keep the longest candidate") {
    StopStringFilter f({"aab"});
    CHECK(f.push("a") == "");
    CHECK(f.push("a") == "");
    CHECK(f.push("a") == "a");     // "aaa": the tail "aa" may still become "aab"
    CHECK(f.push("b") == "");
    CHECK(f.matched());
}

TEST_CASE("StopStringFilter: a partial match that diverges is released whole, at the piece that breaks it") {
    StopStringFilter f({"STOP"});
    CHECK(f.push("ST") == "");
    CHECK(f.push("O") == "");
    CHECK(f.push("P") == "");      // a full match completes across three pieces
    CHECK(f.matched());

    StopStringFilter g({"STOP"});
    CHECK(g.push("xST") == "x");
    CHECK(g.push("OR") == "STOR"); // diverged at R: nothing left could start "STOP"
    CHECK(g.push("M") == "M");
    CHECK(!g.matched());
    CHECK(g.flush() == "");

    // Diverging into the start of a new candidate keeps only the new candidate.
    StopStringFilter h({"STOP"});
    CHECK(h.push("STS") == "ST");  // "S" may start "STOP" again
    CHECK(h.push("TOP now") == "");
    CHECK(h.matched());
}

TEST_CASE("StopStringFilter: nothing after a match, not even at flush; the text before it is released") {
    StopStringFilter f({"\n\n"});
    CHECK(f.push("line one\n") == "line one");
    CHECK(f.push("\nline two") == "");
    CHECK(f.matched());
    CHECK(f.push("more") == "");
    CHECK(f.flush() == "");
    CHECK(filtered({"<end>"}, {"<e", "nd>tail"}) == "");
    CHECK(filtered({"<end>"}, {"a<e", "nd", ">tail"}) == "a");
}

TEST_CASE("StopStringFilter: multi-byte stop strings are matched on bytes, across split characters") {
    // "é" is C3 A9: a piece boundary inside the character does not hide the match.
    CHECK(filtered({"\xC3\xA9t\xC3\xA9"}, {"un \xC3", "\xA9t\xC3", "\xA9 chaud"}) == "un ");
    CHECK(filtered({"\xC3\xA9t\xC3\xA9"}, {"un \xC3", "\xA9t\xC3", "\xA8"}) == "un \xC3\xA9t\xC3\xA8");
}

TEST_CASE("StopStringFilter: no stop strings releases everything at once") {
    StopStringFilter f({});
    CHECK(f.push("ab") == "ab");
    CHECK(f.push("") == "");
    CHECK(f.flush() == "");
    CHECK(f.stops().empty());
}

TEST_CASE("StopStringFilter: any split of the text into pieces gives the text up to the first stop string") {
    std::mt19937 rng(7);
    const std::vector<std::string> stops = {"aba", "bb", "cab"};
    for (int trial = 0; trial < 500; ++trial) {
        std::string text;
        const size_t n = 1 + rng() % 24;
        for (size_t i = 0; i < n; ++i) text += static_cast<char>('a' + rng() % 3);
        size_t first = std::string::npos;
        for (const std::string& s : stops) first = std::min(first, text.find(s));
        const std::string want = text.substr(0, first);

        StopStringFilter f(stops);
        std::string got;
        for (size_t i = 0; i < text.size();) {
            const size_t len = 1 + rng() % 4;
            got += f.push(std::string_view(text).substr(i, len));
            i += len;
            // Never released: anything at or past the stop string.
            REQUIRE(got.size() <= want.size());
        }
        got += f.flush();
        CAPTURE(text);
        CHECK(got == want);
        CHECK(f.matched() == (first != std::string::npos));
    }
}
