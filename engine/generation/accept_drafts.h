#pragma once
// The accept step of speculative decoding (engine/speculative/drafter.h). A decode forward ran the
// newest token followed by K drafted tokens; its logit row i gives the token that follows the
// newest token and drafts[0..i). The target's tokens are produced row by row, each exactly as plain
// decoding would produce it (same sampler draws, same stop rules); the token of row i confirms
// drafts[i] when it is that very token, and then row i + 1 is valid too. The first token that
// differs ends the step: it is new, its K/V are not in the cache yet. So the output never depends
// on the drafts, only the number of forwards does.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "engine/generation/generate_options.h"

namespace tern {

// One token of the target, produced from one logit row.
struct ProducedToken {
    std::optional<int32_t> token;     // the token added to the completion; empty when none was
    std::optional<StopReason> stop;   // generation ends here (before the token or with it)
};

struct AcceptedDrafts {
    int32_t accepted = 0;             // leading drafts confirmed: their K/V, already written, are right
    std::optional<StopReason> stop;   // a stop rule fired during the step
};

// Produces tokens from rows 0, 1, ... with `produce(row)` until one does not confirm its draft or
// generation stops. With no drafts this is one plain decode step (one token from row 0).
AcceptedDrafts accept_drafts(std::span<const int32_t> drafts, const std::function<ProducedToken(size_t row)>& produce);

} // namespace tern
