#pragma once
// The context shift of long generations: when the KV cache is full, keep its first n_keep positions
// (BOS and the start of the prompt: the "attention sink" the model leans on) and drop the older half
// of the rest, moving the newer half down (Session::erase turns its keys for their new positions),
// so generation goes on over the most recent text without recomputing it.
#include <cstdint>

namespace tern {

class Session;

// Positions that shift_context drops for a cache of n_cached positions: half of what follows the
// kept ones (at least 1 when anything follows them; 0 when nothing can go).
int32_t context_shift_size(int32_t n_cached, int32_t n_keep);

// Erases context_shift_size(...) positions right after the first n_keep of the session's cache
// (n_keep is clamped to what the cache holds). Returns how many were dropped.
int32_t shift_context(Session& session, int32_t n_keep);

} // namespace tern
