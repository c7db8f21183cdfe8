#include "engine/model.h"

#include "base/error.h"
#include "formats/text.h"

namespace tern {
namespace {

// Every check of loading, in one place for load_model and check_model_file.
void read_model(const GgufFile& file, ModelConfig& config, ModelWeights& weights) {
    // llama.cpp ships vocabulary-only files (ggml-vocab-*.gguf) that look like models by name.
    if (file.tensors().empty())
        throw InputError(printable(file.path(), 4096) +
                         ": has no tensors: a vocabulary-only GGUF file, not a model (tern tokenize can use it)");
    config = model_config_from_gguf(file);
    weights = model_weights_from_gguf(file, config);
}

} // namespace

Model load_model(const std::string& path) {
    Model m{GgufFile::open(path), {}, {}};
    read_model(m.file, m.config, m.weights);
    return m;
}

void check_model_file(const GgufFile& file) {
    ModelConfig config;
    ModelWeights weights;
    read_model(file, config, weights);
}

} // namespace tern
