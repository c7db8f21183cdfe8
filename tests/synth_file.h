#pragma once
// A synthetic model file for a test: `tern synth`'s writer (engine/tools/synth.h) into a test's temporary
// folder, on one thread (the files are small; a second thread only spins on a shared machine).
#include <cstdint>
#include <string>

#include "tests/test_support.h"

namespace tern::test {

// Writes the synth `shape` (a synth_shape_names() entry) in `type` (a `tern quantize --type` name) into `dir`
// and returns its path. `seed` picks the random weights; `vocab_from`, a GGUF file, lends its tokenizer. The
// file's name holds every argument, so files of one folder never overwrite each other. Throws what
// write_synth_model throws (UsageError for an unknown shape or type).
std::string synth_file(const TempDir& dir, const std::string& shape, const std::string& type, uint64_t seed = 1,
                       const std::string& vocab_from = "");

} // namespace tern::test
