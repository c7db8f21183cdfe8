// accept_drafts (engine/generation/accept_drafts.h): how many drafted tokens a verify forward keeps,
// with the target's tokens given by a script. Speculative decoding through Session is in
// test_speculative.cpp.
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "engine/generation/accept_drafts.h"

using namespace tern;

namespace {

// The target produces script[row]; `stop_at` ends generation at that row (with the token when
// `with_token`, before it otherwise). Records the rows read.
struct Script {
    std::vector<int32_t> tokens;
    std::optional<size_t> stop_at;
    bool with_token = true;
    std::vector<size_t> rows;

    AcceptedDrafts run(const std::vector<int32_t>& drafts) {
        return accept_drafts(drafts, [this](size_t row) {
            rows.push_back(row);
            ProducedToken p;
            if (stop_at && row == *stop_at) {
                p.stop = StopReason::eos;
                if (!with_token) return p;
            }
            p.token = tokens.at(row);
            return p;
        });
    }
};

} // namespace

TEST_CASE("accept_drafts without drafts is one plain decode step") {
    Script s{{7}};
    const AcceptedDrafts a = s.run({});
    CHECK(a.accepted == 0);
    CHECK(!a.stop);
    CHECK(s.rows == std::vector<size_t>{0});
}

TEST_CASE("accept_drafts keeps drafts while the target produces them, and the first new token ends the step") {
    Script all{{5, 6, 7, 8}};
    CHECK(all.run({5, 6, 7}).accepted == 3);   // every draft held: the last row gives a new token
    CHECK(all.rows == std::vector<size_t>{0, 1, 2, 3});

    Script second{{5, 9, 7, 8}};
    CHECK(second.run({5, 6, 7}).accepted == 1);   // 9 is not the draft 6: the rows after it are stale
    CHECK(second.rows == std::vector<size_t>{0, 1});

    Script none{{4, 6}};
    CHECK(none.run({5, 6}).accepted == 0);   // a later match does not count after a miss
    CHECK(none.rows == std::vector<size_t>{0});
}

TEST_CASE("accept_drafts: a stop inside the step ends it; a token that stops still confirms its draft") {
    Script with{{5, 6, 7}, 1, true};
    const AcceptedDrafts a = with.run({5, 6});
    CHECK(a.accepted == 2);
    CHECK(a.stop == StopReason::eos);
    CHECK(with.rows == std::vector<size_t>{0, 1});

    Script before{{5, 6, 7}, 1, false};
    const AcceptedDrafts b = before.run({5, 6});
    CHECK(b.accepted == 1);   // row 1 gave no token: draft 6 is not confirmed
    CHECK(b.stop == StopReason::eos);

    Script first{{5}, 0, false};
    const AcceptedDrafts c = first.run({5});
    CHECK(c.accepted == 0);
    CHECK(c.stop == StopReason::eos);
}
