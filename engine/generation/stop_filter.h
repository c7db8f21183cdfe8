#pragma once
// Stop strings in streamed text: the text a completion shows must never contain a stop string, not
// even the start of one that is then completed by a later token. So text that could still become a
// stop string is held back until it is certain either way.
#include <string>
#include <string_view>
#include <vector>

namespace tern {

// Invariant: what is held back is the longest tail of all text so far that is a proper prefix of
// some stop string; so a stop string always appears whole inside the held-back text, never across
// what was already released.
class StopStringFilter {
public:
    // Empty stop strings are ignored (they would match everywhere).
    explicit StopStringFilter(std::vector<std::string> stops);

    // Adds text; returns what can be shown now. Once a stop string appears, returns the text
    // before it and matched() becomes true; later calls return nothing.
    std::string push(std::string_view text);
    // End of generation: releases what was held (nothing after a match).
    std::string flush();
    bool matched() const { return matched_; }
    // The stop strings looked for (the non-empty ones given).
    const std::vector<std::string>& stops() const { return stops_; }

private:
    std::vector<std::string> stops_;
    std::string held_;
    bool matched_ = false;
};

} // namespace tern
