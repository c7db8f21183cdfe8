#include "engine/model.h"

namespace tern {

Model load_model(const std::string& path) {
    Model m{GgufFile::open(path), {}, {}};
    m.config = model_config_from_gguf(m.file);
    m.weights = model_weights_from_gguf(m.file, m.config);
    return m;
}

} // namespace tern
