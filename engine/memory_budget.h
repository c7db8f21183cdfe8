#pragma once
// The memory a process can really get on the host (MemAvailable, the cgroup v1/v2 memory limit,
// RLIMIT_AS and RLIMIT_DATA) and how a backend's MemoryNeed (engine/memory_need.h) compares with
// limits, checked before anything large is allocated. The KV cache and the packed weights are
// allocated lazily, so without this check an oversized context "succeeds" and the OOM killer ends
// the process mid-generation. What a model needs is each backend's own plan (Backend::plan_memory;
// the CPU's is engine/cpu/memory_plan.h).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/memory_need.h"
#include "engine/model_config.h"

namespace tern {

// KV bytes one position of this model takes (all layers, K and V; kernels/kv_format.h), and a
// whole cache of n_ctx positions, rounded up to whole pages of kKvPagePositions as the CPU cache allocates
// them.
uint64_t kv_bytes_per_position(const ModelConfig& config, KvType type);
uint64_t kv_cache_bytes(const ModelConfig& config, KvType type, int32_t n_ctx);

// MemAvailable from the text of /proc/meminfo (kB), if present.
std::optional<uint64_t> meminfo_available(std::string_view meminfo);
// The tightest cgroup memory limit of this process minus its usage (reclaimable file cache not
// counted), walking from its cgroup up to the root. `proc_self_cgroup` is the text of
// /proc/self/cgroup; `cgroup_root` is usually /sys/fs/cgroup (v2 unified, or v1 with a memory/
// hierarchy). Unlimited or unreadable: nullopt.
std::optional<MemoryLimit> cgroup_limit(std::string_view proc_self_cgroup, const std::filesystem::path& cgroup_root);
// Every limit that applies to this process now (never empty: MemAvailable, else sysconf).
std::vector<MemoryLimit> host_memory_limits();

// Nothing when `need` fits every limit; otherwise the first limit exceeded and the totals.
std::optional<MemoryShortfall> find_memory_shortfall(const MemoryNeed& need, const std::vector<MemoryLimit>& limits,
                                                     const MemoryRequest& request);

// One line for a shortfall, naming no flag: "a context of N positions needs X of memory (weights
// W, KV cache K as f16, buffers B) but A is available (source)". The app words its own, with the
// flags that reduce the need.
std::string describe_memory_shortfall(const MemoryShortfall& shortfall);

// What every limit leaves for the KV cache once the rest of `need` (weights, buffers; its kv
// is ignored) is taken: what an automatic context is sized against.
uint64_t memory_left_for_kv(const MemoryNeed& need, const std::vector<MemoryLimit>& limits);

// "1.5 GiB", "12.0 MiB", "512 B".
std::string format_memory(uint64_t bytes);

} // namespace tern
