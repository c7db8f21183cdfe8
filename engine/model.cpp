#include "engine/model.h"

#include "base/error.h"
#include "formats/text.h"

namespace tern {

Model load_model(const std::string& path) {
    Model m{GgufFile::open(path), {}, {}};
    // llama.cpp ships vocabulary-only files (ggml-vocab-*.gguf) that look like models by name.
    if (m.file.tensors().empty())
        throw InputError(printable(path, 4096) +
                         ": has no tensors: a vocabulary-only GGUF file, not a model (tern tokenize can use it)");
    m.config = model_config_from_gguf(m.file);
    m.weights = model_weights_from_gguf(m.file, m.config);
    return m;
}

} // namespace tern
