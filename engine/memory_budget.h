#pragma once
// Memory a model needs on the CPU (weights that must be resident, the KV cache of the chosen
// context, the forward's buffers) against what the process can really get (MemAvailable, the
// cgroup v1/v2 memory limit, RLIMIT_AS and RLIMIT_DATA), checked before anything large is
// allocated. The KV cache and the packed weights are allocated lazily by the kernel, so without
// this check an oversized -c "succeeds" and the OOM killer ends the process mid-generation.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/backend.h"
#include "engine/model_config.h"
#include "engine/weights.h"

namespace tern {

struct MemoryNeed {
    uint64_t weights = 0;   // tensor bytes that end up resident (mapped pages or packed copies)
    uint64_t copies = 0;    // the part of `weights` the CPU backend copies into new allocations
    uint64_t kv = 0;        // the KV cache for n_ctx positions
    uint64_t buffers = 0;   // activations and logits of one forward batch
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
};

// Exact KV bytes of KvCache::init for this config, type and context.
uint64_t kv_cache_bytes(const ModelConfig& config, KvType type, int32_t n_ctx);
MemoryNeed estimate_memory(const ModelConfig& config, const ModelWeights& weights, const MemoryRequest& request);

// One limit on the memory the process can still get.
struct MemoryLimit {
    enum class Counts { resident, allocated };   // which MemoryNeed total it bounds
    uint64_t available = 0;
    std::string source;   // for messages: "MemAvailable (/proc/meminfo)", "cgroup memory.max", ...
    Counts counts = Counts::resident;
};

// MemAvailable from the text of /proc/meminfo (kB), if present.
std::optional<uint64_t> meminfo_available(std::string_view meminfo);
// The tightest cgroup memory limit of this process minus its usage (reclaimable file cache not
// counted), walking from its cgroup up to the root. `proc_self_cgroup` is the text of
// /proc/self/cgroup; `cgroup_root` is usually /sys/fs/cgroup (v2 unified, or v1 with a memory/
// hierarchy). Unlimited or unreadable: nullopt.
std::optional<MemoryLimit> cgroup_limit(std::string_view proc_self_cgroup, const std::filesystem::path& cgroup_root);
// Every limit that applies to this process now (never empty: MemAvailable, else sysconf).
std::vector<MemoryLimit> memory_limits();

// "" when `need` fits every limit; otherwise one line naming the first limit exceeded, the
// need by part, what is available and the flags that reduce the need (n_ctx, the KV type).
std::string memory_shortfall(const MemoryNeed& need, const std::vector<MemoryLimit>& limits, const MemoryRequest& request);

// What every limit leaves for the KV cache once the rest of `need` (weights, buffers; its kv
// is ignored) is taken: what an automatic context is sized against.
uint64_t memory_left_for_kv(const MemoryNeed& need, const std::vector<MemoryLimit>& limits);

// Checks the model's need for `request` against memory_limits(); throws RuntimeFailure (exit 3)
// with memory_shortfall()'s line when it does not fit.
void require_memory(const ModelConfig& config, const ModelWeights& weights, const MemoryRequest& request);

// "1.5 GiB", "12.0 MiB", "512 B".
std::string format_memory(uint64_t bytes);

} // namespace tern
