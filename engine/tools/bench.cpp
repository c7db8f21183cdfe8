#include "engine/tools/bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <string>

#include "engine/logit_guard.h"
#include "formats/mapped_file.h"
#include "engine/model_config.h"
#include "engine/tensor_roles.h"
#include "engine/weights.h"
#include "base/error.h"

namespace tern {

namespace {

uint64_t tensor_bytes(const WeightRef& w) {
    return w.present() ? static_cast<uint64_t>(w.row_size()) * static_cast<uint64_t>(w.n_out()) : 0;
}

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Token ids the model never sees as text: uniform over the vocabulary, the same for every run of
// the same seed, so two builds (or tern and llama-bench) are timed on equally "hard" input. Speed
// does not depend on the ids, but a fixed stream keeps even cache effects comparable.
std::vector<int32_t> random_tokens(int64_t n, int32_t vocab, std::mt19937_64& rng) {
    std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& id : t) id = pick(rng);
    return t;
}

} // namespace

double kv_element_bytes(KvType type) {
    // The block formats (kernels/kv_format.h) average block_bytes / block_elems per element.
    const KvFormatInfo& f = kv_format_info(type);
    return static_cast<double>(f.block_bytes) / static_cast<double>(f.block_elems);
}

uint64_t weight_bytes_per_token(const ModelWeights& w, const ModelConfig& config) {
    uint64_t bytes = 0;
    // Every tensor of a layer; of the experts' stacks (MoE) only the used ones' matrices.
    for (size_t i = 0; i < w.layers.size(); ++i)
        for (const LayerTensor& t : layer_tensors()) {
            const WeightRef& r = w.layers[i].*t.member;
            // A layer on another's KV (gemma4) reads none of its own K and V projections.
            const bool own_kv = i >= config.layers.size() || config.layers[i].has_kv();
            if (!own_kv && (t.role == LayerRole::wk || t.role == LayerRole::wv || t.role == LayerRole::bk ||
                            t.role == LayerRole::bv || t.role == LayerRole::k_norm))
                continue;
            if (t.kind == TensorKind::stack)
                bytes += tensor_bytes(r) * static_cast<uint64_t>(config.n_expert_used);   // one matrix's rows
            else
                bytes += tensor_bytes(r);
        }
    bytes += tensor_bytes(w.output_norm) + tensor_bytes(w.rope_freqs);
    // gemma4's per-layer inputs: the projection whole, one row of the per-layer embeddings.
    bytes += tensor_bytes(w.per_layer_model_proj) + tensor_bytes(w.per_layer_proj_norm);
    if (w.per_layer_token_embd.present()) bytes += w.per_layer_token_embd.row_size();
    bytes += tensor_bytes(w.output);   // the lm_head: every row, every token
    // The lookup reads one row; a tied embedding is the lm_head just counted in full.
    if (!config.tied_output && w.token_embd.present()) bytes += w.token_embd.row_size();
    return bytes;
}

double kv_bytes_read_at(const ModelConfig& config, KvType kv_type, int64_t pos) {
    double elems = 0;
    for (int32_t i = 0; i < config.n_layers; ++i) {
        const LayerConfig& l = config.layers[static_cast<size_t>(i)];
        int64_t positions = pos + 1;
        if (l.sliding_window > 0) positions = std::min<int64_t>(positions, l.sliding_window);
        elems += static_cast<double>(l.n_kv_heads) * (config.head_dim_of(i) + config.head_dim_v_of(i)) *
                 static_cast<double>(positions);
    }
    return elems * kv_element_bytes(kv_type);
}

double decode_bytes_per_token(const ModelWeights& weights, const ModelConfig& config, KvType kv_type, int64_t depth,
                              int64_t n_gen) {
    double kv = 0;
    for (int64_t i = 0; i < n_gen; ++i) kv += kv_bytes_read_at(config, kv_type, depth + i);
    return static_cast<double>(weight_bytes_per_token(weights, config)) + (n_gen > 0 ? kv / static_cast<double>(n_gen) : 0);
}

int32_t bench_context_size(const BenchOptions& o) {
    return o.depth + std::max({o.n_prompt, o.n_gen, o.n_verify});
}

BenchResult run_bench(Backend& backend, int32_t vocab, const BenchOptions& o) {
    // app/cmd_bench.cpp checks its flags first and words these with them.
    if (o.n_prompt < 0) throw UsageError("bench: the prompt token count must be >= 0");
    if (o.n_gen < 0) throw UsageError("bench: the generated token count must be >= 0");
    if (o.n_prompt == 0 && o.n_gen == 0) throw UsageError("bench: nothing to measure (no prompt and no generated tokens)");
    if (o.repetitions < 1) throw UsageError("bench: the repetitions must be >= 1");
    if (o.depth < 0) throw UsageError("bench: the depth must be >= 0");
    if (o.n_verify < 0) throw UsageError("bench: the verified token count must be >= 0");
    if (vocab < 1) throw UsageError("bench: the model has an empty vocabulary");

    std::mt19937_64 rng(o.seed);
    BenchResult r;

    // Every forward ends with the greedy pick of its last row, as generation does: that waits for the
    // forward to finish. A device backend queues its work and returns at once, so without the pick a
    // timer would stop before the work did (and the next timed region would pay for it).
    int32_t picked = 0;
    const std::span<int32_t> pick(&picked, 1);
    // Generation checks the model file and every row it samples (formats/mapped_file.h, engine/logit_guard.h):
    // so does the measurement, whose cost it is part of. `pos0`: the position of the first row's token.
    const auto argmax_checked = [&](std::span<int32_t> picks, int32_t pos0) {
        check_mapped_files();
        for (size_t row = 0; row < picks.size(); ++row)
            check_logit_row(backend, static_cast<int>(row), pos0 + static_cast<int32_t>(row), o.model_path);
        backend.argmax(picks);
    };

    // The context every measurement starts from, filled once; runs truncate back to it. Chunks of
    // 512 keep the fill's activations small for deep contexts.
    backend.kv_truncate(0);
    const auto t_fill = std::chrono::steady_clock::now();
    const std::vector<int32_t> context = random_tokens(o.depth, vocab, rng);
    for (int32_t done = 0; done < o.depth;) {
        const int32_t n = std::min<int32_t>(512, o.depth - done);
        backend.forward({std::span<const int32_t>(context).subspan(static_cast<size_t>(done), static_cast<size_t>(n)),
                         done, LogitsWanted::last});
        done += n;
    }
    if (o.depth > 0) argmax_checked(pick, o.depth - 1);
    r.depth_fill_ms = ms_since(t_fill);

    const std::vector<int32_t> prompt = random_tokens(o.n_prompt, vocab, rng);
    const std::vector<int32_t> gen = random_tokens(o.n_gen, vocab, rng);
    const std::vector<int32_t> verify = random_tokens(o.n_verify, vocab, rng);
    const int n_runs = o.repetitions + 1;   // run 0 is the warm-up
    for (int run = 0; run < n_runs; ++run) {
        if (o.n_prompt > 0) {
            backend.kv_truncate(o.depth);
            const auto t0 = std::chrono::steady_clock::now();
            backend.forward({prompt, o.depth, LogitsWanted::last});
            argmax_checked(pick, o.depth + o.n_prompt - 1);
            const double ms = ms_since(t0);
            if (run > 0) r.prefill_ms.push_back(ms);
        }
        if (o.n_gen > 0) {
            // Like llama-bench's tg test, decode starts from the depth context, not after the prompt,
            // and each step waits for the last (llama-bench synchronizes after every llama_decode).
            backend.kv_truncate(o.depth);
            const auto t0 = std::chrono::steady_clock::now();
            for (int32_t i = 0; i < o.n_gen; ++i) {
                backend.forward({std::span<const int32_t>(&gen[static_cast<size_t>(i)], 1), o.depth + i,
                                 LogitsWanted::last});
                argmax_checked(pick, o.depth + i);
            }
            const double ms = ms_since(t0);
            if (run > 0) r.decode_ms.push_back(ms);
        }
        if (o.n_verify > 0) {
            // Speculative decoding's check of n_verify drafted tokens: one forward at the depth with every
            // row's logits, each row's greedy pick read back (engine/speculative compares them).
            backend.kv_truncate(o.depth);
            std::vector<int32_t> picks(static_cast<size_t>(o.n_verify));
            const auto t0 = std::chrono::steady_clock::now();
            backend.forward({verify, o.depth, LogitsWanted::all});
            argmax_checked(picks, o.depth);
            const double ms = ms_since(t0);
            if (run > 0) r.verify_ms.push_back(ms);
        }
        if (o.progress) o.progress(run, n_runs);
    }
    backend.kv_truncate(0);

    r.prefill_ms_median = median(r.prefill_ms);
    r.decode_ms_median = median(r.decode_ms);
    r.verify_ms_median = median(r.verify_ms);
    if (r.prefill_ms_median > 0) r.prefill_tps = o.n_prompt / (r.prefill_ms_median / 1000.0);
    if (r.decode_ms_median > 0) r.decode_tps = o.n_gen / (r.decode_ms_median / 1000.0);
    return r;
}

} // namespace tern
