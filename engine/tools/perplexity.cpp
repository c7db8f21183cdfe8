#include "engine/tools/perplexity.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/backend.h"
#include "engine/logit_guard.h"
#include "formats/mapped_file.h"
#include "base/error.h"
#include "base/parallel_for.h"
#include "kernels/cpu_features.h"

namespace tern {

double token_nll(std::span<const float> logits, int32_t target) {
    float mx = logits[0];
    for (float v : logits) mx = std::max(mx, v);
    double sum = 0.0;
    for (float v : logits) sum += std::exp(static_cast<double>(v) - static_cast<double>(mx));
    return std::log(sum) - (static_cast<double>(logits[static_cast<size_t>(target)]) - static_cast<double>(mx));
}

TextTooShortError::TextTooShortError(int64_t n_tokens_, int32_t n_ctx_)
    : InputError("the text has " + std::to_string(n_tokens_) + " tokens; perplexity with a context of " +
                 std::to_string(n_ctx_) + " needs at least " + std::to_string(2 * int64_t{n_ctx_})),
      n_tokens(n_tokens_), n_ctx(n_ctx_) {}

PerplexityResult compute_perplexity(Backend& backend, std::span<const int32_t> tokens, const PerplexityOptions& opt) {
    const int32_t ctx = opt.n_ctx;
    if (ctx < 4) throw UsageError("perplexity needs a context of at least 4 tokens, got " + std::to_string(ctx));
    if (opt.n_batch < 1) throw UsageError("perplexity: the batch size must be at least 1");
    const int64_t n = static_cast<int64_t>(tokens.size());
    if (n < 2 * int64_t{ctx}) throw TextTooShortError(n, ctx);
    int64_t n_chunks = n / ctx;
    if (opt.max_chunks > 0) n_chunks = std::min(n_chunks, opt.max_chunks);

    const int32_t first = ctx / 2;   // the first half of a chunk is context only
    const int32_t batch = std::min(opt.n_batch, ctx);
    PerplexityResult r;
    r.ctx = ctx;
    r.n_tokens = n;
    double sum = 0.0, sum2 = 0.0;
    int64_t count = 0;
    std::vector<int32_t> chunk(static_cast<size_t>(ctx));
    std::vector<double> nll(static_cast<size_t>(ctx));

    for (int64_t c = 0; c < n_chunks; ++c) {
        std::copy_n(tokens.begin() + c * ctx, ctx, chunk.begin());
        if (opt.bos >= 0) chunk[0] = opt.bos;
        backend.kv_truncate(0);   // chunks are independent sequences
        for (int32_t p0 = 0; p0 < ctx; p0 += batch) {
            if (opt.cancel && opt.cancel->load()) throw TernError(ExitCode::interrupted, "perplexity: interrupted");
            const int32_t len = std::min(batch, ctx - p0);
            ForwardBatch fb;
            fb.tokens = std::span<const int32_t>(chunk.data() + p0, static_cast<size_t>(len));
            fb.pos0 = p0;
            fb.wanted = LogitsWanted::all;
            backend.forward(fb);
            // Rows of this forward that predict a scored token: positions max(first, p0) .. min(ctx-2, p0+len-1).
            const int32_t lo = std::max(first, p0), hi = std::min(ctx - 2, p0 + len - 1);
            // logits() may not be thread-safe on every backend: fetch the spans first.
            std::vector<std::span<const float>> rows;
            check_mapped_files();
            for (int32_t pos = lo; pos <= hi; ++pos) {
                check_logit_row(backend, pos - p0, pos, opt.model_path);
                rows.push_back(backend.logits(pos - p0));
            }
            parallel_for(hi - lo + 1, resolve_threads(0), 8, [&](int64_t a, int64_t b) {
                for (int32_t pos = lo + static_cast<int32_t>(a); pos < lo + static_cast<int32_t>(b); ++pos)
                    nll[static_cast<size_t>(pos)] = token_nll(rows[static_cast<size_t>(pos - lo)], chunk[static_cast<size_t>(pos + 1)]);
            });
        }
        for (int32_t pos = first; pos <= ctx - 2; ++pos) {
            const double v = nll[static_cast<size_t>(pos)];
            sum += v;
            sum2 += v * v;
            ++count;
        }
        r.running_ppl.push_back(std::exp(sum / static_cast<double>(count)));
        if (opt.progress) opt.progress(c + 1, n_chunks);
    }
    r.chunks = n_chunks;
    r.tokens_scored = count;
    r.nll_mean = sum / static_cast<double>(count);
    r.ppl = std::exp(r.nll_mean);
    // Standard error of the mean NLL (sample variance), carried through exp to first order.
    const double var = sum2 / static_cast<double>(count) - r.nll_mean * r.nll_mean;
    r.nll_stderr = (count > 1 && var > 0) ? std::sqrt(var / static_cast<double>(count - 1)) : 0.0;
    r.ppl_stderr = r.ppl * r.nll_stderr;
    return r;
}

} // namespace tern
