#pragma once
// The Backend interface: what the session needs from a device. The decoder itself is written once, in
// engine/layer_program.h: each backend's forward runs that program over its own steps (kernels, fusions),
// and architecture differences are data (ModelConfig, engine/tensor_roles.h), not copies of the forward.
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/finite.h"
#include "engine/logit_candidates.h"
#include "engine/memory_need.h"
#include "kernels/kv_format.h"

namespace tern {

struct ModelConfig;
struct ModelWeights;

// Which kind of device a backend runs on; device_name() tells which one ("cuda:0") for messages.
enum class DeviceKind { cpu, cuda };

// What every backend takes at load. Options of one backend only (the CPU's threads and exact
// matmul: engine/cpu_options.h) are given to it at construction (engine/backend_factory.h).
struct RunOptions {
    int32_t n_ctx = 0;            // KV cache positions to allocate (> 0): the most one sequence holds
    KvType kv_type = KvType::f16;
    // Positions of the paged KV pool all sequences share (a backend with supports_sequences); 0: n_ctx.
    int32_t kv_pool_positions = 0;
    // The model's index of the first layer given to load(): a model split across devices (partial
    // offload, engine/split_backend.h) loads each backend with a slice of its layers. Observers see
    // layers by the model's numbering.
    int32_t first_layer = 0;
    // Called as weights are copied to a device (bytes done, bytes in all), for a progress bar; a backend
    // that reads the weights in place never calls it.
    std::function<void(uint64_t done, uint64_t total)> on_upload;
};

// Which logit rows a forward keeps: the last token's only (decode, prefill), or every token's
// (draft verification, perplexity, reference tests).
enum class LogitsWanted { last, all };

// One sequence's part of a multi-sequence batch (a batching engine's step): n_tokens consecutive tokens of
// ForwardBatch::tokens at that sequence's next positions, n_past(seq) on.
struct SequenceSpan {
    int32_t seq = 0;
    int32_t n_tokens = 0;
    LogitsWanted wanted = LogitsWanted::last;
};

struct ForwardBatch {
    std::span<const int32_t> tokens;   // N tokens at positions pos0 .. pos0+N-1
    int32_t pos0 = 0;                  // must equal the number of positions already in the KV cache
    LogitsWanted wanted = LogitsWanted::last;
    // Several sequences in one forward (Backend::supports_sequences): the tokens split into these spans in
    // order, each token attending to its own sequence's cache only; the kept logit rows follow the spans in
    // order (one per span, or each of its tokens'). pos0 and wanted are then unused. Empty: one sequence,
    // 0, as pos0 and wanted say.
    std::span<const SequenceSpan> spans;
    // A backend loaded with a slice of the layers (engine/split_backend.h): without token_embd it reads
    // the residual stream entering its first layer from hidden_in, without an output matrix it writes
    // the stream leaving its last layer to hidden_out (and keeps no logits). Host memory, (N, dim) f32: every
    // token's row in batch order, spans or not.
    const float* hidden_in = nullptr;
    float* hidden_out = nullptr;
};

// The projections of the forward, grouped by the activation they read: q/k/v all read the attention
// norm's output, gate/up the FFN norm's; lm_head is the output matrix (token_embd when tied).
enum class ProjectionInput { attn_qkv, attn_output, ffn_gate_up, ffn_down, lm_head };

// Sees the f32 input of every projection group as a forward computes it; quantization's calibration
// collects its statistics this way (engine/quantize/importance.h). Called on the forward's own thread
// between two ops; x (n_rows, width) row-major is valid during the call only. layer is -1 for lm_head,
// whose rows are the ones the batch keeps logits for.
struct ForwardObserver {
    virtual ~ForwardObserver() = default;
    virtual void matmul_input(int32_t layer, ProjectionInput which, const float* x, int64_t n_rows, int64_t width) = 0;
};

// A copy of the first n positions of the KV cache, for the prefix cache and /save.
struct KvSnapshot {
    int32_t n_past = 0;
    KvType kv_type = KvType::f16;
    std::vector<uint8_t> bytes;   // backend-defined layout, versioned by the backend
};

// Throws UsageError for a batch no backend can run: empty, not starting at n_past, past n_ctx, or
// holding a token id outside [0, vocab). A batch with spans is checked span by span, with
// n_past_of(seq) the positions of each sequence (which throws for one that does not exist), and its
// spans must cover the tokens exactly, each with at least one token, no sequence twice.
void check_forward_batch(const ForwardBatch& batch, int32_t n_past, int32_t n_ctx, int32_t vocab,
                         const std::function<int32_t(int32_t seq)>& n_past_of = {});

// Throws UsageError unless seq_truncate may keep n positions of a sequence holding n_past.
void check_seq_truncate(int32_t seq, int32_t n, int32_t n_past);
// Throws UsageError for seq_free(0): sequence 0 is the backend's own (truncate it instead).
void check_seq_free(int32_t seq);

// How full a paged KV cache is (Backend::kv_pool).
struct KvPoolUse {
    int32_t pages = 0, pages_in_use = 0;
    int32_t positions_per_page = 0;
};

class Backend {
public:
    virtual ~Backend() = default;
    // What loading this model for `request` (context, KV type, batch) needs on this backend's
    // device, weights, KV cache and buffers; asked before load, so nothing large is allocated yet.
    virtual MemoryNeed plan_memory(const ModelConfig& config, const ModelWeights& weights,
                                   const MemoryRequest& request) const = 0;
    // What this backend's device can still give (never empty), each limit bounding one total of
    // MemoryNeed.
    virtual std::vector<MemoryLimit> memory_limits() const = 0;
    virtual void load(const ModelConfig& config, const ModelWeights& weights, const RunOptions& options) = 0;
    // Writes K/V for the batch's positions and keeps the wanted logit rows.
    virtual void forward(const ForwardBatch& batch) = 0;
    // Row r of the last forward's kept logits (r = 0 for LogitsWanted::last), vocab floats.
    virtual std::span<const float> logits(int row) = 0;
    virtual void argmax(std::span<int32_t> per_row) = 0;   // lowest id wins exact ties
    // The min(out.size(), vocab) best candidates of row r after `penalties`, in the order of
    // engine/logit_candidates.h, written to `out`; returns how many. The kept logits are not changed (a
    // later logits(row) returns them unpenalised). out.size() <= kMaxTopCandidates. The default selects
    // on the host from logits(row) (select_top_logits); a GPU backend selects where the row is and copies
    // back only the candidates.
    virtual size_t top_logits(int row, const LogitPenalties& penalties, std::span<LogitCandidate> out);
    // What kinds of float row r of the last forward's kept logits holds (engine/logit_guard.h checks every
    // row sampled or scored with it). The default scans logits(row) on the host; a GPU backend may scan
    // where the row is and copy back the flags.
    virtual FloatScan scan_logits(int row);
    virtual int32_t n_past() const = 0;
    virtual void kv_truncate(int32_t n_past) = 0;          // forget positions >= n_past
    virtual KvSnapshot kv_save(int32_t n) const = 0;
    virtual void kv_load(const KvSnapshot& snapshot) = 0;
    // Positions [begin, end) only, and their restore right after position n_past() - 1: the
    // on-disk prefix cache stores and restores a prompt block by block. Backends without them
    // throw RuntimeFailure (the default); the prefix cache then stays off for that backend.
    virtual KvSnapshot kv_save_range(int32_t begin, int32_t end) const;
    virtual void kv_append(const KvSnapshot& range);
    // Removes positions [begin, end) of the cache; the positions after them move down by
    // end - begin (their K re-rotated for the new positions where the rope allows), so a long
    // conversation can drop old turns without recomputing the rest. Backends that cannot shift
    // throw RuntimeFailure (the default); callers then fall back to truncate + prefill.
    virtual void kv_erase(int32_t begin, int32_t end);
    // Sequences (a batching engine's requests) over one paged KV cache, sequence 0 being the one the
    // methods above act on. A backend that runs one sequence only says false and throws RuntimeFailure
    // from the others (the defaults). seq_fork: dst (created, or emptied) shares src's first n positions
    // without copying them (copy on write); seq_truncate forgets positions >= n of seq; seq_free drops a
    // sequence and returns its pages.
    virtual bool supports_sequences() const { return false; }
    virtual void seq_create(int32_t seq);
    virtual void seq_free(int32_t seq);
    virtual void seq_fork(int32_t src, int32_t dst, int32_t n);
    virtual int32_t seq_n_past(int32_t seq) const;
    virtual void seq_truncate(int32_t seq, int32_t n);
    // kv_save_range / kv_append on a sequence (the on-disk prefix cache feeding a batching engine's
    // sequences). The defaults act on sequence 0 through those two and throw RuntimeFailure for others.
    virtual KvSnapshot seq_save_range(int32_t seq, int32_t begin, int32_t end) const;
    virtual void seq_append(int32_t seq, const KvSnapshot& range);
    virtual KvPoolUse kv_pool() const;
    virtual DeviceKind device_kind() const = 0;
    virtual std::string device_name() const = 0;           // "cpu", "cuda:0"
    // Every later forward reports its projection inputs to `observer` (null, the default: none; the
    // forward then pays one untaken branch per projection group). Backends that cannot report them
    // throw RuntimeFailure (the default).
    virtual void set_observer(ForwardObserver* observer);
};

} // namespace tern
