// tern synth OUT.gguf --shape NAME --type TYPE [--vocab-from GGUF] [--seed S] (../shared/CLI.md):
// writes a random-weight model of a real model's shape (engine/tools/synth.h) as a GGUF file that tern
// and other GGUF tools load, for benchmarks without downloads. An existing regular OUT is replaced
// (benchmark scripts regenerate their files); it is written to a unique temporary file beside OUT and
// renamed (formats/atomic_file.h), so OUT is never half-written.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/console.h"
#include "app/signals.h"
#include "engine/tools/synth.h"
#include "engine/tools/synth_shapes.h"
#include "engine/tools/synth_vocab.h"
#include "formats/atomic_file.h"
#include "base/error.h"
#include "kernels/cpu_features.h"
#include "quant/plan.h"

namespace tern::app {

namespace {

struct SynthArgs {
    SynthOptions options;
    std::string out;
    bool json = false;
};

std::string joined_shapes() {
    std::string s;
    for (const std::string& n : synth_shape_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
}

void check_out_path(const std::string& out) {
    // A symlink, directory, device node or FIFO at OUT is refused, never replaced.
    check_write_target(out);
    const std::filesystem::path parent = std::filesystem::path(out).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent))
        throw UsageError(out + ": the directory " + parent.string() + " does not exist (create it first)");
}

// --shape and --type against what tern synth knows, worded with the flags (the engine's own check
// names none); at the moment the engine would check them, so errors come in the same order.
void check_shape_and_type(const SynthOptions& o) {
    auto join = [](const auto& names) {
        std::string out;
        for (const auto& n : names) out += (out.empty() ? "" : ", ") + std::string(n);
        return out;
    };
    if (!find_synth_shape(o.shape))
        throw UsageError("--shape " + o.shape + ": unknown shape (choices: " + join(synth_shape_names()) + ")");
    if (!ftype_from_name(o.type)) throw UsageError("--type " + o.type + ": unknown type (choices: " + join(ftype_names()) + ")");
}

int run_synth(SynthArgs& a) {
    if (a.options.n_threads < 0) throw UsageError("--threads: must be > 0 (or 0 for the number of physical cores)");
    check_out_path(a.out);
    const int n_threads = resolve_threads(a.options.n_threads);
    a.options.n_threads = n_threads;
    a.options.on_warning = [](const std::string& note) { std::cerr << "tern: warning: " << note << "\n"; };
    InterruptGuard guard;
    a.options.cancel = guard.flag();
    ProgressBar bar("synth " + a.options.shape + " " + a.options.type, 1000);
    a.options.on_progress = [&bar](uint64_t done, uint64_t total) {
        bar.update(total ? done * 1000 / total : 1000);
    };
    const auto t0 = std::chrono::steady_clock::now();
    try {
        check_shape_and_type(a.options);
        write_synth_model(a.options, a.out);
    } catch (const NoVocabularyError& e) {
        throw InputError(e.path + ": --vocab-from: the file has no tokenizer.ggml.tokens (give a model or vocab GGUF "
                                  "with a tokenizer, e.g. one of shared/models/vocab/*.gguf)");
    }
    bar.finish();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t bytes = std::filesystem::file_size(a.out);
    std::fprintf(stderr, "tern: synth: wrote %s (%s, %s, seed %llu): %s in %s with %d threads\n", a.out.c_str(),
                 a.options.shape.c_str(), a.options.type.c_str(), static_cast<unsigned long long>(a.options.seed),
                 format_bytes(bytes).c_str(), format_duration(secs).c_str(), n_threads);
    if (a.json) {
        nlohmann::json j = {{"output", a.out},     {"shape", a.options.shape}, {"type", a.options.type},
                            {"seed", a.options.seed}, {"bytes", bytes},       {"seconds", secs},
                            {"threads", n_threads}};
        if (!a.options.vocab_from.empty()) j["vocab_from"] = a.options.vocab_from;
        std::cout << j.dump() << "\n";
    }
    return 0;
}

} // namespace

Command add_synth_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("synth", "write a random-weight GGUF model of a real model's shape (for benchmarks)");
    auto a = std::make_shared<SynthArgs>();
    cmd->add_option("OUT", a->out, "output GGUF file (written to a temporary file beside it, then renamed; replaces a regular OUT)")->required();
    cmd->add_option("--shape", a->options.shape, "model shape: " + joined_shapes())->required();
    cmd->add_option("--type", a->options.type, "file type, as for tern quantize (q4_k_m, q8_0, f16, ...)")->required();
    cmd->add_option("--vocab-from", a->options.vocab_from,
                    "GGUF file whose tokenizer (all tokenizer.* keys) and vocabulary size the model gets "
                    "(default: a built-in SentencePiece vocabulary of the shape's size)");
    cmd->add_option("--seed", a->options.seed, "random seed (same seed: same bytes)");
    cmd->add_option("-t,--threads", a->options.n_threads, "threads (default: physical cores)")
        ->check(integer_in_range(0, max_threads(), "0 = one per physical core"));
    cmd->add_flag("--json", a->json, "print a JSON summary on stdout");
    return {cmd, [a] { return run_synth(*a); }};
}

} // namespace tern::app
