#pragma once
// The engine's structured errors worded for the CLI: the engine reports numbers and names no
// flag (engine/load_errors.h, DeviceUnavailable, DraftModelUnfit); here they become the one-line
// messages that name the flag which set the number and the flag that changes it.
#include <string>

#include "engine/memory_need.h"

namespace tern::app {

// "-c N: needs X of memory (weights W, KV cache K as f16, buffers B) but A is available (source);
// use a smaller -c (...), --kv-type q8_0 (...) or a smaller quantization of the model".
std::string memory_shortfall_line(const MemoryShortfall& shortfall);

// Call inside a catch block: rethrows the exception being handled, worded with the flags when it
// is one of the engine's structured errors, else as it is.
[[noreturn]] void rethrow_with_flags();

// Runs `open` (an engine call that opens a model) and words its structured errors.
template <class F> auto with_flag_words(F&& open) -> decltype(open()) {
    try {
        return open();
    } catch (...) {
        rethrow_with_flags();
    }
}

} // namespace tern::app
