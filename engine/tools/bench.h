#pragma once
// `tern bench`'s measurement: prefill and decode speed of a loaded Backend on pseudo-random tokens,
// and the bytes a decoded token has to read, so decode speed can be put against memory bandwidth.
// Drives the Backend directly (no tokenizer, no sampler), like llama-bench does, so the numbers
// compare with its pp/tg columns: prefill is one forward of n_prompt tokens, decode is n_gen
// single-token forwards, both starting from a KV cache holding `depth` positions.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace tern {

struct ModelConfig;
struct ModelWeights;

// Bytes of one stored K or V element as the CPU KV cache stores it (q8_0 and f8_e4m3: 34 bytes per
// block of 32).
double kv_element_bytes(KvType type);

// Weight bytes one decoded token reads, at the tensors' file sizes: every tensor of every layer
// (projections, norms, biases), the output norm, the rope frequency factors, the output matrix in
// full, and ONE row of the token embedding -- unless the output is tied to the embedding, in which
// case that matrix is read in full once (as the lm_head) and not counted again for the lookup.
uint64_t weight_bytes_per_token(const ModelWeights& weights, const ModelConfig& config);

// KV cache bytes the token at position `pos` (0-based) reads: in every layer, K and V of each KV
// head at the positions it attends to -- pos + 1 of them, or the layer's sliding window if smaller.
// Counted at n_kv_heads * (head_dim + head_dim_v) * kv_element_bytes per position and layer.
double kv_bytes_read_at(const ModelConfig& config, KvType kv_type, int64_t pos);

// The average weight + KV bytes per token of a decode of n_gen tokens at positions depth ..
// depth + n_gen - 1 (n_gen >= 1).
double decode_bytes_per_token(const ModelWeights& weights, const ModelConfig& config, KvType kv_type, int64_t depth,
                              int64_t n_gen);

struct BenchOptions {
    int32_t n_prompt = 512;   // prefill tokens (0: no prefill measurement)
    int32_t n_gen = 128;      // decoded tokens (0: no decode measurement)
    int32_t repetitions = 5;  // timed runs after one untimed warm-up run; medians are reported
    int32_t depth = 0;        // KV positions filled before each measurement
    int32_t n_verify = 0;     // tokens of one speculative verification forward (every row's logits; 0: none)
    uint64_t seed = 1;        // of the pseudo-random token ids
    std::string model_path;   // names the file when a row is not finite (engine/logit_guard.h)
    // Called after the warm-up (run 0) and each timed run (1 .. repetitions); may be empty.
    std::function<void(int run, int n_runs)> progress;
};

// KV positions a Backend needs for these options: depth + max(n_prompt, n_gen, n_verify).
int32_t bench_context_size(const BenchOptions& options);

struct BenchResult {
    std::vector<double> prefill_ms;   // one per timed run (empty when n_prompt = 0)
    std::vector<double> decode_ms;    // whole n_gen-token decode, one per timed run
    double prefill_ms_median = 0, decode_ms_median = 0;
    double prefill_tps = 0, decode_tps = 0;   // tokens over the median time
    std::vector<double> verify_ms;            // one n_verify-token forward with all logits, per timed run
    double verify_ms_median = 0;
    double depth_fill_ms = 0;                 // filling the cache to `depth`, once
};

// `backend` must be loaded with at least bench_context_size(options) positions; its cache is reset.
// Throws UsageError for options out of range (negative counts, both counts 0, repetitions < 1) and
// passes on whatever the Backend throws.
BenchResult run_bench(Backend& backend, int32_t vocab, const BenchOptions& options);

} // namespace tern
