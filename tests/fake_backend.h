#pragma once
// The part of a test's fake Backend that every fake writes the same way: nothing to load, no KV cache to
// save, a CPU device with no memory to plan, and a position counter that forwards advance and kv_truncate
// lowers. A fake derives from it and writes forward, logits and argmax (and overrides the rest it needs).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace tern::test {

class FakeBackendBase : public Backend {
public:
    void load(const ModelConfig&, const ModelWeights&, const RunOptions&) override {}
    int32_t n_past() const override { return n_past_; }
    void kv_truncate(int32_t n) override { n_past_ = std::min(n_past_, n); }
    KvSnapshot kv_save(int32_t) const override { return {}; }
    void kv_load(const KvSnapshot&) override {}
    std::string device_name() const override { return "fake"; }
    DeviceKind device_kind() const override { return DeviceKind::cpu; }
    MemoryNeed plan_memory(const ModelConfig&, const ModelWeights&, const MemoryRequest&) const override { return {}; }
    std::vector<MemoryLimit> memory_limits() const override { return {}; }

protected:
    int32_t n_past_ = 0; // the positions forwarded and not truncated
};

} // namespace tern::test
