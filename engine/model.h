#pragma once
// A loaded model file: the mapping, its config and the weight views into it, kept together so the
// views cannot outlive the mapping.
#include <string>

#include "engine/model_config.h"
#include "engine/weights.h"
#include "formats/gguf.h"

namespace tern {

struct Model {
    GgufFile file; // owns the mmap the weights point into
    ModelConfig config;
    ModelWeights weights; // views into `file`
};

// Opens and validates a GGUF model. Throws InputError (exit 2) for an unreadable or malformed file,
// an unsupported architecture, a metadata number out of its range, a missing / mis-shaped tensor or a
// non-finite value in a small tensor (engine/weights.h).
// Model is move-only; moving keeps the mapping's address, so the weight views stay valid.
Model load_model(const std::string& path);

// The checks load_model makes of an opened file (metadata, every tensor's presence, shape and format, the small
// tensors' values), the views it builds dropped: what `tern info` runs to refuse what `tern run` refuses.
void check_model_file(const GgufFile& file);

} // namespace tern
