#pragma once
// Opening a model for a device, the one path `run`, `chat`, `bench`, `perplexity` and the draft
// model share: pick the backend, map the file, size the context (the model's own, capped to what
// the device's memory leaves), check that model + context fit, load the backend.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/backend.h"
#include "engine/cpu_options.h"
#include "engine/model.h"

namespace tern {

// Where a context size came from: asked for, the model's trained context, or that capped to memory.
enum class ContextOrigin { requested, model, memory_cap };

struct ContextChoice {
    int32_t n_ctx = 0;
    ContextOrigin origin = ContextOrigin::requested;
    // For the note about a capped context: the model's trained context (0 when the file does not
    // say), the KV bytes it would take, and the half of the memory left after the weights and
    // buffers that the automatic context is sized to.
    int32_t n_ctx_train = 0;
    uint64_t kv_bytes_at_train = 0;
    uint64_t kv_budget = 0;
};

// The context for `requested` positions (> 0: that, as asked), else the model's trained context
// (4096 when the file does not say) capped so its KV cache (bytes_per_position each) fits in half
// of `memory_left_for_kv`, rounded down to a multiple of 256 and never below 256.
ContextChoice choose_context(int32_t requested, int32_t n_ctx_train, uint64_t bytes_per_position,
                             uint64_t memory_left_for_kv);

struct OpenRequest {
    std::string path;
    // How the file is opened; empty: load_model(path). (bench's synthetic model writes its file first.)
    std::function<Model()> open_file;
    int32_t n_ctx = 0;              // 0 = automatic (choose_context)
    KvType kv_type = KvType::f16;
    std::string device = "auto";    // engine/backend_factory.h
    int32_t gpu_layers = -1;        // layers on a GPU (-ngl), the rest on the CPU; -1 = all (engine/split_backend.h)
    CpuOptions cpu;
    MemoryRequest shape;            // n_batch and n_logit_rows of the forwards to come (n_ctx, kv_type set here)
    // Sequences the KV cache holds at once (a batching engine's `parallel`). On a backend with sequences
    // the KV pool gets sequences * n_ctx positions, counted in the memory check, and the automatic context
    // is sized so that many fit; a backend of one sequence ignores it.
    int32_t sequences = 1;

    // Called in this order while the model opens, each when set:
    std::function<void(const std::string&)> on_device_note;     // an automatic device choice explained (once loaded)
    std::function<void(const Model&)> on_file_opened;           // mapped, nothing large allocated yet
    std::function<void(const ContextChoice&)> on_context;       // chosen, before the memory check
    std::function<void(uint64_t done, uint64_t total)> on_upload; // weights copied to a GPU (RunOptions)
};

struct OpenedModel {
    std::shared_ptr<Model> model;
    std::unique_ptr<Backend> backend;   // loaded with context.n_ctx and the request's KV type
    ContextChoice context;
};

// Throws DeviceUnavailable (engine/backend_factory.h), InputError for the file, MemoryShortfallError
// when model + context do not fit the device's memory, and what the backend's load throws
// (engine/load_errors.h).
OpenedModel open_model(const OpenRequest& request);

} // namespace tern
