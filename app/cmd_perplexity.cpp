// tern perplexity -m MODEL -f TEXT [-c 512] [--chunks N] [-b N] [--json] (../shared/CLI.md): the
// perplexity of a model on a text with llama-perplexity's method (engine/tools/perplexity.h), so numbers
// compare with llama.cpp's directly. stdout: the final estimate (or one JSON object); stderr:
// progress on a terminal and a timing line.
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/console.h"
#include "app/signals.h"
#include "engine/backend.h"
#include "engine/tools/perplexity.h"
#include "engine/text/tokenizer.h"
#include "base/error.h"
#include "formats/input_file.h"

namespace tern::app {

namespace {

struct PerplexityArgs {
    ModelOptions model;
    std::string file;
    int64_t chunks = -1;
    int32_t batch = 2048;
    bool json = false;
};

// The text as llama-perplexity reads it: the file's bytes with one trailing '\n' removed.
std::string read_text(const std::string& path) {
    std::string text = read_input_file(path, "the text file (-f)", kMaxTextFileBytes);
    if (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
}

int run_perplexity(PerplexityArgs& a) {
    if (a.model.ctx_size == 0) a.model.ctx_size = 512;   // llama-perplexity's default, not the model's
    if (a.model.ctx_size < 4) throw UsageError("--ctx-size: perplexity needs at least 4 tokens of context");
    if (a.batch < 1) throw UsageError("--batch-size: must be at least 1");
    if (a.chunks == 0 || a.chunks < -1) throw UsageError("--chunks: must be a positive number (or -1 for all)");
    const std::string text = read_text(a.file);

    const auto t0 = std::chrono::steady_clock::now();
    LoadedSession s = load_session(a.model);
    const Tokenizer& tok = s.session->tokenizer();
    const auto t_tok = std::chrono::steady_clock::now();
    const std::vector<int32_t> tokens = tok.encode(text, EncodeOptions{true, false});
    const double tokenize_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_tok).count();

    PerplexityOptions po;
    po.n_ctx = a.model.ctx_size;
    po.n_batch = a.batch;
    po.max_chunks = a.chunks;
    po.model_path = a.model.model;
    po.bos = tok.add_bos_token() ? tok.bos() : -1;
    InterruptGuard guard;
    po.cancel = guard.flag();
    const int64_t available = static_cast<int64_t>(tokens.size()) / po.n_ctx;
    ProgressBar bar("perplexity", static_cast<uint64_t>(a.chunks > 0 ? std::min(a.chunks, available) : available));
    po.progress = [&](int64_t done, int64_t) { bar.update(static_cast<uint64_t>(done)); };

    const auto t1 = std::chrono::steady_clock::now();
    // The engine's "text too short" error names no file; the user gave one with -f.
    const PerplexityResult r = [&] {
        try {
            return compute_perplexity(s.session->backend(), tokens, po);
        } catch (const TextTooShortError& e) {
            throw InputError(a.file + " (-f): " + e.what() + " (use a longer text or a smaller -c)");
        } catch (const InputError& e) {
            throw InputError(a.file + " (-f): " + e.what());
        }
    }();
    const double eval_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    bar.finish();
    const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double tps = eval_s > 0 ? static_cast<double>(r.chunks * r.ctx) / eval_s : 0.0;

    std::fprintf(stderr, "tern: perplexity: %zu tokens, %lld chunks of %d, %lld scored; %s (%.0f tokens/s on %s), "
                         "tokenize %s\n",
                 tokens.size(), static_cast<long long>(r.chunks), r.ctx, static_cast<long long>(r.tokens_scored),
                 format_duration(eval_s).c_str(), tps, s.device.c_str(), format_duration(tokenize_s).c_str());
    if (a.json) {
        nlohmann::json j = {{"ppl", r.ppl}, {"ppl_stderr", r.ppl_stderr}, {"nll_mean", r.nll_mean},
                            {"nll_stderr", r.nll_stderr}, {"chunks", r.chunks}, {"ctx", r.ctx},
                            {"batch", a.batch}, {"tokens_scored", r.tokens_scored}, {"n_tokens", r.n_tokens},
                            {"model", a.model.model}, {"text", a.file}, {"device", s.device},
                            {"kv_type", a.model.kv_type}, {"seconds", total_s}, {"eval_seconds", eval_s},
                            {"tokens_per_second", tps}};
        std::cout << j.dump() << "\n";
    } else {
        std::printf("Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.ppl_stderr);
    }
    return 0;
}

} // namespace

Command add_perplexity_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("perplexity", "perplexity of a model on a text (llama-perplexity's method)");
    auto a = std::make_shared<PerplexityArgs>();
    add_model_options(*cmd, a->model);
    cmd->get_option("--ctx-size")->description("chunk length in tokens (default 512)");
    cmd->add_option("-f,--file", a->file, "text file to score (one trailing newline is dropped)")->required();
    cmd->add_option("--chunks", a->chunks, "score at most N chunks (default: all)");
    cmd->add_option("-b,--batch-size", a->batch, "tokens per forward pass (default 2048; a chunk is one pass)");
    cmd->add_flag("--json", a->json, "print one JSON object on stdout");
    return {cmd, [a] { return run_perplexity(*a); }};
}

} // namespace tern::app
