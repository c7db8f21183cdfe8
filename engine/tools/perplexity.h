#pragma once
// Perplexity with llama.cpp's method (llama-perplexity, ../shared/reference/README.md
// "Perplexity"), so numbers compare directly: the token stream is cut into floor(n / ctx)
// independent chunks of ctx tokens, each chunk's first token is replaced by BOS, and only the
// second half is scored (the logits at positions ctx/2 .. ctx-2 predict tokens ctx/2+1 .. ctx-1).
// PPL = exp(mean NLL); the ± is the standard error of the mean NLL carried through exp.
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"

namespace tern {

class Backend;

struct PerplexityOptions {
    int32_t n_ctx = 512;          // chunk length; the backend must hold at least this many positions
    int32_t n_batch = 2048;       // tokens per forward (a chunk takes ceil(n_ctx / n_batch) forwards)
    int64_t max_chunks = -1;      // -1: every whole chunk of the text
    int32_t bos = -1;             // replaces each chunk's first token when >= 0 (vocabularies that add BOS)
    std::string model_path;       // names the file when a scored row is not finite (engine/logit_guard.h)
    const std::atomic<bool>* cancel = nullptr;   // checked between forwards; throws TernError(interrupted)
    std::function<void(int64_t chunks_done, int64_t chunks_total)> progress;
};

struct PerplexityResult {
    double ppl = 0;
    double ppl_stderr = 0;
    double nll_mean = 0;
    double nll_stderr = 0;
    int64_t chunks = 0;
    int32_t ctx = 0;
    int64_t n_tokens = 0;        // tokens in the whole text
    int64_t tokens_scored = 0;   // chunks * (ctx - 1 - ctx/2)
    std::vector<double> running_ppl;   // PPL over the first k+1 chunks, as llama-perplexity prints it
};

// -log p(target) from one row of logits, with the log-sum-exp in double precision.
double token_nll(std::span<const float> logits, int32_t target);

// Throws InputError when the text has fewer than 2 * n_ctx tokens (llama-perplexity's rule) and
// UsageError for an n_ctx below 4 or a backend context that is too small.
// The text is shorter than two contexts: n_tokens against the 2 * n_ctx that a score needs.
struct TextTooShortError : InputError {
    TextTooShortError(int64_t n_tokens, int32_t n_ctx);
    int64_t n_tokens;
    int32_t n_ctx;
};

PerplexityResult compute_perplexity(Backend& backend, std::span<const int32_t> tokens, const PerplexityOptions& opt);

} // namespace tern
