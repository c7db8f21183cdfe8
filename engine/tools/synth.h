#pragma once
// Random-weight models of real shapes (engine/tools/synth_shapes.h) written as ordinary GGUF files, so
// tern and other GGUF tools can load and benchmark a shape without its real weights
// (`tern synth`, ../shared/CLI.md). The file holds the architecture's metadata as llama.cpp
// expects it, a vocabulary (copied from --vocab-from, or a small built-in SentencePiece one padded
// to the shape's size), and every tensor in the format `tern quantize --type TYPE` would give it
// (the same plan, quant/plan.h). Weights are a pure function of (seed, tensor name, row): the same
// seed gives the same bytes for any thread count, and the same f32 values under every TYPE.
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tern {

struct SynthOptions {
    std::string shape;        // a synth_shape_names() entry
    std::string type;         // a `tern quantize --type` name (q4_k_m, f16, ...)
    std::string vocab_from;   // GGUF file whose tokenizer.* keys are copied; empty: built-in vocab
    uint64_t seed = 1;
    int n_threads = 0;        // 0: the physical cores
    // Non-fatal notes (the copied vocabulary's size differs from the shape's); dropped when unset.
    std::function<void(const std::string&)> on_warning;
    // Called after each tensor with the tensor bytes written so far and in all (progress bars).
    std::function<void(uint64_t done, uint64_t total)> on_progress;
    // Checked between tensors: when raised, writing stops with TernError(interrupted) and neither
    // OUT nor its temporary file remains.
    const std::atomic<bool>* cancel = nullptr;
};

// Writes a random-weight model file (atomically, via formats/gguf_writer.h). Throws UsageError for an
// unknown shape/type (listing the choices), InputError for a bad --vocab-from file.
void write_synth_model(const SynthOptions& options, const std::string& out_path);
std::vector<std::string> synth_shape_names();

} // namespace tern
