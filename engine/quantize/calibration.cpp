#include "engine/quantize/calibration.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "base/error.h"
#include "engine/backend_factory.h"
#include "engine/model.h"
#include "engine/text/tokenizer.h"

namespace tern {
namespace {

// A CPU backend for the calibration forwards: exact (dequantized) matmuls and an f32 cache, so what the
// observer sees is the model's own arithmetic, not the rounding of the fast path.
std::unique_ptr<Backend> calibration_backend(const Model& model, int32_t n_ctx, int n_threads) {
    CpuOptions cpu;
    cpu.n_threads = n_threads;
    cpu.exact_matmul = true;
    std::unique_ptr<Backend> backend = make_backend("cpu", cpu);
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_type = KvType::f32;
    backend->load(model.config, model.weights, run);
    return backend;
}

ImportanceMatrix collect(Backend& backend, const Model& model, std::span<const int32_t> tokens, int32_t n_ctx,
                         int32_t bos, bool second_moments) {
    ImportanceObserver observer(model.weights, second_moments);
    backend.set_observer(&observer);
    std::vector<int32_t> chunk;
    for (size_t start = 0; start + 2 <= tokens.size(); start += static_cast<size_t>(n_ctx)) {
        const size_t n = std::min(static_cast<size_t>(n_ctx), tokens.size() - start);
        chunk.assign(tokens.begin() + static_cast<int64_t>(start), tokens.begin() + static_cast<int64_t>(start + n));
        if (bos >= 0) chunk[0] = bos;
        backend.kv_truncate(0);   // each chunk is its own sequence
        backend.forward(ForwardBatch{chunk, 0, LogitsWanted::all});
    }
    backend.set_observer(nullptr);
    return observer.finish();
}

// a = wa * a + (1 - wa) * b, element by element, for vectors of equal size (else a is kept).
void mix_into(std::vector<float>& a, const std::vector<float>& b, double wa) {
    if (a.size() != b.size()) return;
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(wa * a[i] + (1.0 - wa) * b[i]);
}

} // namespace

ImportanceMatrix collect_importance(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx, int32_t bos,
                                    int n_threads, bool second_moments) {
    const std::unique_ptr<Backend> backend = calibration_backend(model, n_ctx, n_threads);
    return collect(*backend, model, tokens, n_ctx, bos, second_moments);
}

SplitImportance collect_importance_split(const Model& model, std::span<const int32_t> tokens, int32_t n_ctx,
                                         int32_t bos, int n_threads, bool fit_moments) {
    std::vector<int32_t> even, odd;
    const auto chunk = static_cast<size_t>(n_ctx);
    if (tokens.size() < chunk + 16) {
        // About one chunk: two halves, so both sides see activations (a 1-token odd chunk would not).
        even.assign(tokens.begin(), tokens.begin() + static_cast<int64_t>(tokens.size() / 2));
        odd.assign(tokens.begin() + static_cast<int64_t>(tokens.size() / 2), tokens.end());
    } else {
        // Whole chunks alternate, so every chunk is evaluated exactly as collect_importance would.
        for (size_t start = 0, k = 0; start < tokens.size(); start += chunk, ++k) {
            const size_t end = std::min(tokens.size(), start + chunk);
            std::vector<int32_t>& side = k % 2 == 0 ? even : odd;
            side.insert(side.end(), tokens.begin() + static_cast<int64_t>(start), tokens.begin() + static_cast<int64_t>(end));
        }
    }
    const std::unique_ptr<Backend> backend = calibration_backend(model, n_ctx, n_threads);
    SplitImportance s;
    s.fit = collect(*backend, model, even, n_ctx, bos, fit_moments);
    s.check = collect(*backend, model, odd, n_ctx, bos, true);
    s.check_tokens = std::move(odd);
    s.bos = bos;
    s.all.tokens = s.fit.tokens + s.check.tokens;
    const double wf = s.all.tokens ? double(s.fit.tokens) / double(s.all.tokens) : 0.5;
    s.all.columns = s.fit.columns;
    for (auto& [name, v] : s.all.columns)
        if (const auto it = s.check.columns.find(name); it != s.check.columns.end()) mix_into(v, it->second, wf);
    if (fit_moments) {
        s.all.moments = s.fit.moments;
        s.all.moment_owner = s.fit.moment_owner;
        for (auto& [name, v] : s.all.moments)
            if (const auto it = s.check.moments.find(name); it != s.check.moments.end()) mix_into(v, it->second, wf);
    }
    return s;
}

Calibration calibrate_model(const std::string& model_path, const std::string& text, const std::string& text_name,
                            int n_threads, bool fit_moments) {
    const Model model = load_model(model_path);
    const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model.file);
    std::vector<int32_t> tokens = tok->encode(text, EncodeOptions{true, false});
    Calibration c;
    c.n_ctx = model.config.n_ctx_train > 0 ? std::min(512, model.config.n_ctx_train) : 512;
    if (tokens.size() < 16) throw InputError(text_name + ": the calibration text is too short (" +
                                             std::to_string(tokens.size()) + " tokens; give it a few thousand)");
    if (tokens.size() > static_cast<size_t>(64 * c.n_ctx)) tokens.resize(static_cast<size_t>(64 * c.n_ctx));
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t bos = tok->add_bos_token() ? tok->bos() : -1;
    c.importance = collect_importance_split(model, tokens, c.n_ctx, bos, n_threads, fit_moments);
    // perplexity scores whole chunks and needs two of them: shorter ones when the half is short.
    c.importance.check_n_ctx =
        std::max<int32_t>(4, std::min<int32_t>(c.n_ctx, static_cast<int32_t>(c.importance.check_tokens.size() / 2)));
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return c;
}

} // namespace tern
