#pragma once
// What a model and its context need on a device, and what that device can give: the terms a
// Backend plans its memory in (Backend::plan_memory, Backend::memory_limits) and that
// engine/memory_budget.h compares and words.
#include <cstdint>
#include <string>

#include "kernels/kv_format.h"

namespace tern {

struct MemoryNeed {
    uint64_t weights = 0;   // tensor bytes that end up resident (mapped pages or packed copies)
    uint64_t copies = 0;    // the part of `weights` the backend copies into new allocations
    uint64_t kv = 0;        // the KV cache for n_ctx positions
    uint64_t buffers = 0;   // activations and logits of one forward batch, and scratch
    // Physical memory: what MemAvailable and cgroup limits are compared with.
    uint64_t resident() const { return weights + kv + buffers; }
    // New allocations: what RLIMIT_AS / RLIMIT_DATA are compared with (the file is already mapped
    // when the check runs, so its pages count in the address space used so far).
    uint64_t allocated() const { return copies + kv + buffers; }
};

struct MemoryRequest {
    KvType kv_type = KvType::f16;
    int32_t n_ctx = 0;
    int32_t n_batch = 512;       // tokens per forward (GenerateOptions::prefill_chunk)
    int32_t n_logit_rows = 1;    // rows of logits kept per forward (perplexity keeps a batch)
    // Positions of the paged KV pool several sequences share (RunOptions::kv_pool_positions); 0: n_ctx.
    int32_t kv_pool_positions = 0;
};

// One limit on the memory the process can still get.
struct MemoryLimit {
    enum class Counts { resident, allocated };   // which MemoryNeed total it bounds
    uint64_t available = 0;
    std::string source;   // for messages: "MemAvailable (/proc/meminfo)", "cgroup memory.max", ...
    Counts counts = Counts::resident;
};

// The first limit a need exceeds, with the totals compared there.
struct MemoryShortfall {
    MemoryLimit limit;
    uint64_t wanted = 0;    // the total that limit bounds (MemoryNeed::resident() or allocated())
    uint64_t weights = 0;   // the weights' part of it (all resident weights, or the copies)
    MemoryNeed need;
    MemoryRequest request;
    bool resident() const { return limit.counts == MemoryLimit::Counts::resident; }
};

} // namespace tern
