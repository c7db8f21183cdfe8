#include "engine/memory_budget.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

// cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit value.
constexpr uint64_t kNoLimitV1 = 1ull << 62;

std::string read_text(const fs::path& p) {
    std::ifstream f(p);
    if (!f) return "";
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

std::optional<uint64_t> parse_u64(std::string_view s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.remove_suffix(1);
    if (s.empty()) return std::nullopt;
    uint64_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        if (v > (UINT64_MAX - 9) / 10) return std::nullopt;
        v = v * 10 + static_cast<uint64_t>(c - '0');
    }
    return v;
}

// The value of `key` in a "key value" per line file (memory.stat).
std::optional<uint64_t> stat_value(std::string_view text, std::string_view key) {
    std::istringstream in{std::string(text)};
    std::string k;
    uint64_t v = 0;
    while (in >> k >> v)
        if (k == key) return v;
    return std::nullopt;
}

// limit - (usage - inactive file cache) for one cgroup directory, if it has a limit.
std::optional<uint64_t> cgroup_dir_available(const fs::path& dir, bool v2) {
    const std::optional<uint64_t> limit = parse_u64(read_text(dir / (v2 ? "memory.max" : "memory.limit_in_bytes")));
    if (!limit || *limit >= kNoLimitV1) return std::nullopt;   // "max" (v2) does not parse: no limit
    uint64_t usage = parse_u64(read_text(dir / (v2 ? "memory.current" : "memory.usage_in_bytes"))).value_or(0);
    // Inactive page cache is reclaimed before the OOM killer acts, as MemAvailable assumes.
    const std::string stat = read_text(dir / "memory.stat");
    const uint64_t inactive = stat_value(stat, v2 ? "inactive_file" : "total_inactive_file").value_or(0);
    usage -= std::min(usage, inactive);
    return *limit > usage ? *limit - usage : 0;
}

// The process's own cgroup first, then each parent; in a cgroup namespace the path may not exist
// under the mount, in which case the mount's root is the process's cgroup.
std::optional<uint64_t> tightest_in_hierarchy(const fs::path& mount, const std::string& rel, bool v2) {
    std::optional<uint64_t> best;
    fs::path p = rel.empty() || rel == "/" ? fs::path() : fs::path(rel.substr(1));
    std::error_code ec;
    if (!p.empty() && !fs::is_directory(mount / p, ec)) p.clear();
    for (;;) {
        if (const std::optional<uint64_t> a = cgroup_dir_available(mount / p, v2)) best = best ? std::min(*best, *a) : *a;
        if (p.empty()) break;
        p = p.parent_path();
    }
    return best;
}

// Field `key` of a "Key:   N kB" file (/proc/meminfo, /proc/self/status), in bytes.
std::optional<uint64_t> proc_kib_field(std::string_view text, std::string_view key) {
    std::istringstream in{std::string(text)};
    std::string line;
    while (std::getline(in, line)) {
        if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
        std::istringstream fields(line.substr(key.size() + 1));
        uint64_t kib = 0;
        if (fields >> kib) return kib * 1024;
    }
    return std::nullopt;
}

std::optional<uint64_t> self_status_bytes(std::string_view key) {
    return proc_kib_field(read_text("/proc/self/status"), key);
}

} // namespace

std::optional<uint64_t> meminfo_available(std::string_view meminfo) {
    return proc_kib_field(meminfo, "MemAvailable");
}

uint64_t kv_bytes_per_position(const ModelConfig& config, KvType type) {
    // Each layer with its own head sizes; a layer reading another's KV (gemma4) holds none.
    uint64_t bytes = 0;
    for (int32_t l = 0; l < config.n_layers; ++l) {
        const LayerConfig& lc = config.layers[static_cast<size_t>(l)];
        if (!lc.has_kv()) continue;
        const int32_t heads[] = {lc.n_kv_heads};
        bytes += kv_position_bytes(type, heads, config.head_dim_of(l), config.head_dim_v_of(l));
    }
    return bytes;
}

uint64_t kv_cache_bytes(const ModelConfig& config, KvType type, int32_t n_ctx) {
    const auto pages = static_cast<uint64_t>(kv_pages_for(std::max(n_ctx, 0)));
    return kv_bytes_per_position(config, type) * pages * static_cast<uint64_t>(kKvPagePositions);
}

std::optional<MemoryLimit> cgroup_limit(std::string_view proc_self_cgroup, const fs::path& root) {
    // Lines are "id:controllers:path"; v2 is "0::/path", v1's memory controller "N:memory:/path".
    std::istringstream in{std::string(proc_self_cgroup)};
    std::string line;
    std::optional<uint64_t> best;
    std::string source;
    while (std::getline(in, line)) {
        const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
        if (b == std::string::npos) continue;
        const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
        std::optional<uint64_t> got;
        std::string name;
        if (line.compare(0, a, "0") == 0 && controllers.empty()) {
            // The unified hierarchy is mounted at the root itself, or at root/unified in hybrid setups.
            std::error_code ec;
            const fs::path mount = fs::exists(root / "cgroup.controllers", ec) ? root : root / "unified";
            got = tightest_in_hierarchy(mount, path, true);
            name = "the cgroup memory limit (memory.max)";
        } else {
            std::istringstream list(controllers);
            std::string c;
            bool memory = false;
            while (std::getline(list, c, ','))
                memory = memory || c == "memory";
            if (!memory) continue;
            got = tightest_in_hierarchy(root / "memory", path, false);
            name = "the cgroup memory limit (memory.limit_in_bytes)";
        }
        if (got && (!best || *got < *best)) {
            best = got;
            source = name;
        }
    }
    if (!best) return std::nullopt;
    return MemoryLimit{*best, source, MemoryLimit::Counts::resident};
}

std::vector<MemoryLimit> host_memory_limits() {
    std::vector<MemoryLimit> limits;
    if (const std::optional<uint64_t> a = meminfo_available(read_text("/proc/meminfo")))
        limits.push_back({*a, "MemAvailable in /proc/meminfo", MemoryLimit::Counts::resident});
    else {
        const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0)
            limits.push_back({static_cast<uint64_t>(pages) * static_cast<uint64_t>(page), "free memory (sysconf)",
                              MemoryLimit::Counts::resident});
    }
    if (std::optional<MemoryLimit> c = cgroup_limit(read_text("/proc/self/cgroup"), "/sys/fs/cgroup"))
        limits.push_back(*c);
    // The rlimits bound address space, not pages: what is left of them is the limit minus what
    // the process already uses (the mapped model file included).
    const auto add_rlimit = [&](int resource, std::string_view status_key, const char* name) {
        struct rlimit rl {};
        if (getrlimit(resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
        const uint64_t used = self_status_bytes(status_key).value_or(0);
        const uint64_t cap = static_cast<uint64_t>(rl.rlim_cur);
        limits.push_back({cap > used ? cap - used : 0, name, MemoryLimit::Counts::allocated});
    };
    add_rlimit(RLIMIT_AS, "VmSize", "what RLIMIT_AS (ulimit -v) leaves");
    add_rlimit(RLIMIT_DATA, "VmData", "what RLIMIT_DATA (ulimit -d) leaves");
    if (limits.empty()) limits.push_back({uint64_t(8) << 30, "an assumed 8 GiB (no memory information)",
                                          MemoryLimit::Counts::resident});
    return limits;
}

std::string format_memory(uint64_t bytes) {
    char buf[32];
    const double b = static_cast<double>(bytes);
    if (bytes >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1ull << 30));
    else if (bytes >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1ull << 20));
    else if (bytes >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1ull << 10));
    else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    return buf;
}

std::optional<MemoryShortfall> find_memory_shortfall(const MemoryNeed& need, const std::vector<MemoryLimit>& limits,
                                                     const MemoryRequest& r) {
    for (const MemoryLimit& l : limits) {
        const bool resident = l.counts == MemoryLimit::Counts::resident;
        const uint64_t wanted = resident ? need.resident() : need.allocated();
        if (wanted <= l.available) continue;
        return MemoryShortfall{l, wanted, resident ? need.weights : need.copies, need, r};
    }
    return std::nullopt;
}

std::string describe_memory_shortfall(const MemoryShortfall& s) {
    return "a context of " + std::to_string(s.request.n_ctx) + " positions needs " + format_memory(s.wanted) +
           " of memory (" + (s.resident() ? "weights " : "packed weights ") + format_memory(s.weights) +
           ", KV cache " + format_memory(s.need.kv) + " as " + std::string(kv_type_name(s.request.kv_type)) +
           ", buffers " + format_memory(s.need.buffers) + ") but " + format_memory(s.limit.available) +
           " is available (" + s.limit.source + ")";
}

uint64_t memory_left_for_kv(const MemoryNeed& need, const std::vector<MemoryLimit>& limits) {
    uint64_t left = UINT64_MAX;
    for (const MemoryLimit& l : limits) {
        const bool resident = l.counts == MemoryLimit::Counts::resident;
        const uint64_t taken = (resident ? need.weights : need.copies) + need.buffers;
        left = std::min(left, l.available - std::min(l.available, taken));
    }
    return left == UINT64_MAX ? uint64_t(8) << 30 : left;
}

} // namespace tern
