// engine/memory_budget.h: the KV estimate equals what KvCache allocates, the weight estimate
// equals the file's tensor bytes, the /proc and cgroup parsers read v1 and v2 layouts (built in
// a temporary directory), and a shortfall names the limit exceeded and the totals.
#include <doctest/doctest.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "engine/cpu/kv_cache.h"
#include "engine/memory_budget.h"
#include "engine/cpu/memory_plan.h"
#include "engine/model.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace tern;

namespace {

constexpr KvType kAllKvTypes[] = {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3};

uint64_t file_tensor_bytes(const GgufFile& f) {
    uint64_t n = 0;
    for (const GgufTensor& t : f.tensors()) n += t.n_bytes;
    return n;
}

void put(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    test::write_file(p, text);
}

constexpr uint64_t MiB = 1ull << 20;

} // namespace

TEST_CASE("kv_cache_bytes equals what KvCache allocates, for every KV type and several contexts") {
    if (!test::shared_available()) return;
    // head dim 64: every KV type applies.
    const Model m = load_model(test::shared_path("models/synth/synth-k256-f16.gguf").string());
    std::vector<int32_t> heads;
    for (const LayerConfig& l : m.config.layers) heads.push_back(l.n_kv_heads);
    for (KvType t : kAllKvTypes)
        for (int32_t n_ctx : {1, 100, 2048}) {
            KvCache kv;
            kv.init(t, heads, m.config.head_dim, m.config.head_dim_v, n_ctx);
            CAPTURE(kv_type_name(t));
            CAPTURE(n_ctx);
            CHECK(kv_cache_bytes(m.config, t, n_ctx) == kv.total_bytes());
        }
}

TEST_CASE("cpu_memory_need: weights are the file's tensor bytes, a tied output counted once") {
    if (!test::shared_available()) return;
    for (const char* name : {"models/synth/synth-k256-q4_0.gguf", "models/synth/synth-k256-tied-q8_0.gguf",
                             "models/gguf/stories260K-f32.gguf"}) {
        CAPTURE(name);
        const Model m = load_model(test::shared_path(name).string());
        const MemoryNeed need = cpu_memory_need(m.config, m.weights, MemoryRequest{KvType::f16, 256});
        CHECK(need.weights == file_tensor_bytes(m.file));
        CHECK(need.copies > 0);
        CHECK(need.copies < need.weights);   // the norms (and an untied token_embd) are never packed
        CHECK(need.kv == kv_cache_bytes(m.config, KvType::f16, 256));
        CHECK(need.buffers > 32 * MiB);   // the fixed allowance plus one batch
        CHECK(need.resident() == need.weights + need.kv + need.buffers);
        CHECK(need.allocated() == need.copies + need.kv + need.buffers);
        // Doubling the context doubles the KV cache and nothing else; q8_0 KV is 34/64 of f16's.
        const MemoryNeed twice = cpu_memory_need(m.config, m.weights, MemoryRequest{KvType::f16, 512});
        CHECK(twice.kv == 2 * need.kv);
        CHECK(twice.weights == need.weights);
        // Perplexity keeps a batch of logit rows: the buffers grow by vocab floats per row.
        const MemoryNeed rows = cpu_memory_need(m.config, m.weights, MemoryRequest{KvType::f16, 256, 512, 256});
        CHECK(rows.buffers == need.buffers + 255ull * 4 * static_cast<uint64_t>(m.config.vocab));
    }
}

TEST_CASE("meminfo_available reads MemAvailable in kB") {
    CHECK(meminfo_available("MemTotal:       24684092 kB\nMemFree:  100 kB\nMemAvailable:   21066220 kB\n") ==
          uint64_t(21066220) * 1024);
    CHECK(!meminfo_available("MemTotal: 1 kB\nMemFree: 2 kB\n").has_value());
    CHECK(!meminfo_available("").has_value());
    CHECK(!meminfo_available("MemAvailableX: 5 kB\n").has_value());
}

TEST_CASE("cgroup_limit: v2 walks up to the tightest ancestor, counts inactive file cache as free") {
    test::TempDir root;
    put(root / "cgroup.controllers", "cpu memory\n");
    put(root / "user.slice/memory.max", std::to_string(1000 * MiB) + "\n");
    put(root / "user.slice/memory.current", std::to_string(100 * MiB) + "\n");
    put(root / "user.slice/app/memory.max", "max\n");   // no limit of its own
    put(root / "user.slice/app/memory.current", std::to_string(50 * MiB) + "\n");
    const std::string self = "0::/user.slice/app\n";
    std::optional<MemoryLimit> l = cgroup_limit(self, root.path());
    REQUIRE(l.has_value());
    CHECK(l->available == 900 * MiB);
    CHECK(l->counts == MemoryLimit::Counts::resident);
    CHECK(l->source.find("memory.max") != std::string::npos);

    // The child's own limit is tighter once its usage grows; reclaimable cache does not count.
    put(root / "user.slice/app/memory.max", std::to_string(300 * MiB) + "\n");
    put(root / "user.slice/app/memory.current", std::to_string(250 * MiB) + "\n");
    put(root / "user.slice/app/memory.stat", "anon 1000\ninactive_file " + std::to_string(100 * MiB) + "\n");
    l = cgroup_limit(self, root.path());
    REQUIRE(l.has_value());
    CHECK(l->available == 150 * MiB);

    // Usage above the limit leaves 0, never a wrapped-around huge number.
    put(root / "user.slice/app/memory.stat", "");
    put(root / "user.slice/app/memory.current", std::to_string(400 * MiB) + "\n");
    l = cgroup_limit(self, root.path());
    REQUIRE(l.has_value());
    CHECK(l->available == 0);

    // No limit anywhere.
    test::TempDir open;
    put(open / "cgroup.controllers", "memory\n");
    put(open / "memory.max", "max\n");
    CHECK(!cgroup_limit("0::/\n", open.path()).has_value());
}

TEST_CASE("cgroup_limit: v1 memory controller, its unlimited value, a namespaced path") {
    test::TempDir root;
    put(root / "memory/memory.limit_in_bytes", "9223372036854771712\n");   // v1's "no limit"
    put(root / "memory/memory.usage_in_bytes", "7611539456\n");
    put(root / "memory/docker/abc/memory.limit_in_bytes", std::to_string(2048 * MiB) + "\n");
    put(root / "memory/docker/abc/memory.usage_in_bytes", std::to_string(600 * MiB) + "\n");
    put(root / "memory/docker/abc/memory.stat", "cache 5\ntotal_inactive_file " + std::to_string(88 * MiB) + "\n");
    const std::string self = "9:pids:/\n4:memory:/docker/abc\n1:cpu,cpuacct:/\n0::/\n";
    std::optional<MemoryLimit> l = cgroup_limit(self, root.path());
    REQUIRE(l.has_value());
    CHECK(l->available == (2048 - 600 + 88) * MiB);
    CHECK(l->source.find("memory.limit_in_bytes") != std::string::npos);

    // In a cgroup namespace /proc/self/cgroup names a path the mount does not have: the mount's
    // root is then the process's own cgroup.
    test::TempDir ns;
    put(ns / "memory/memory.limit_in_bytes", std::to_string(512 * MiB) + "\n");
    put(ns / "memory/memory.usage_in_bytes", std::to_string(12 * MiB) + "\n");
    l = cgroup_limit("4:memory:/process_api/25865078\n", ns.path());
    REQUIRE(l.has_value());
    CHECK(l->available == 500 * MiB);

    CHECK(!cgroup_limit("4:memory:/x\n", root.path() / "missing").has_value());
    CHECK(!cgroup_limit("garbage without colons\n", root.path()).has_value());
}

TEST_CASE("host_memory_limits: MemAvailable is always among them on Linux") {
    const std::vector<MemoryLimit> limits = host_memory_limits();
    REQUIRE(!limits.empty());
    CHECK(limits.front().source.find("MemAvailable") != std::string::npos);
    CHECK(limits.front().available > 0);
}

TEST_CASE("find_memory_shortfall: nothing when it fits; else the first limit exceeded, described without flags") {
    MemoryNeed need;
    need.weights = 100 * MiB;
    need.copies = 80 * MiB;
    need.kv = 900 * MiB;
    need.buffers = 40 * MiB;
    const MemoryRequest req{KvType::f16, 32768};
    const MemoryLimit ram{2048 * MiB, "MemAvailable in /proc/meminfo", MemoryLimit::Counts::resident};
    CHECK(!find_memory_shortfall(need, {ram}, req));
    // Exactly enough fits.
    CHECK(!find_memory_shortfall(need, {{1040 * MiB, "x", MemoryLimit::Counts::resident}}, req));

    const MemoryLimit small{1000 * MiB, "MemAvailable in /proc/meminfo", MemoryLimit::Counts::resident};
    const std::optional<MemoryShortfall> s = find_memory_shortfall(need, {ram, small}, req);
    REQUIRE(s);
    CHECK(s->wanted == 1040 * MiB);
    CHECK(s->weights == 100 * MiB);
    CHECK(s->limit.available == 1000 * MiB);
    CHECK(s->request.n_ctx == 32768);
    const std::string m = describe_memory_shortfall(*s);
    CAPTURE(m);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(m.starts_with("a context of 32768 positions needs 1.0 GiB"));
    CHECK(m.find("KV cache 900.0 MiB as f16") != std::string::npos);
    CHECK(m.find("1000.0 MiB is available (MemAvailable in /proc/meminfo)") != std::string::npos);
    CHECK(m.find("-c") == std::string::npos);   // the engine names no flag (app/engine_wording.h does)

    // An address-space limit counts the new allocations only (the mapped file is already in use).
    const MemoryLimit as{1020 * MiB, "what RLIMIT_AS (ulimit -v) leaves", MemoryLimit::Counts::allocated};
    CHECK(!find_memory_shortfall(need, {as}, req));   // 80 + 900 + 40 = 1020
    const MemoryLimit as_small{1019 * MiB, "what RLIMIT_AS (ulimit -v) leaves", MemoryLimit::Counts::allocated};
    const std::optional<MemoryShortfall> a = find_memory_shortfall(need, {as_small}, req);
    REQUIRE(a);
    CHECK(!a->resident());
    CHECK(a->weights == 80 * MiB);
    CHECK(describe_memory_shortfall(*a).find("packed weights 80.0 MiB") != std::string::npos);
}

TEST_CASE("memory_left_for_kv: the tightest limit after weights and buffers, never below zero") {
    MemoryNeed need;
    need.weights = 100 * MiB;
    need.copies = 80 * MiB;
    need.buffers = 20 * MiB;
    need.kv = 12345;   // ignored
    CHECK(memory_left_for_kv(need, {{1000 * MiB, "ram", MemoryLimit::Counts::resident}}) == 880 * MiB);
    CHECK(memory_left_for_kv(need, {{1000 * MiB, "ram", MemoryLimit::Counts::resident},
                                    {500 * MiB, "as", MemoryLimit::Counts::allocated}}) == 400 * MiB);
    CHECK(memory_left_for_kv(need, {{50 * MiB, "ram", MemoryLimit::Counts::resident}}) == 0);
}

TEST_CASE("format_memory") {
    CHECK(format_memory(0) == "0 B");
    CHECK(format_memory(1023) == "1023 B");
    CHECK(format_memory(1536) == "1.5 KiB");
    CHECK(format_memory(12 * MiB) == "12.0 MiB");
    CHECK(format_memory(3ull << 30) == "3.0 GiB");
}
