#include "tests/synth_file.h"

#include <filesystem>

#include "engine/tools/synth.h"

namespace tern::test {

std::string synth_file(const TempDir& dir, const std::string& shape, const std::string& type, uint64_t seed,
                       const std::string& vocab_from) {
    std::string name = shape + "-" + type + "-" + std::to_string(seed);
    if (!vocab_from.empty()) name += "-vocab-" + std::filesystem::path(vocab_from).stem().string();
    const std::string path = (dir / (name + ".gguf")).string();
    SynthOptions o;
    o.shape = shape;
    o.type = type;
    o.seed = seed;
    o.vocab_from = vocab_from;
    o.n_threads = 1;
    write_synth_model(o, path);
    return path;
}

} // namespace tern::test
