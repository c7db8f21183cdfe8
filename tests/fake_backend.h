#pragma once
// The two shapes of a test's fake Backend, each written once:
// - FakeBackendBase, the part every made-up backend writes the same way: nothing to load, no KV cache to
//   save, a CPU device with no memory to plan, and a position counter that forwards advance and kv_truncate
//   lowers. A fake derives from it and writes forward, logits and argmax (and overrides the rest it needs).
// - ForwardingBackend, a real backend behind a wrapper that a test derives from to watch or change a few
//   calls (count the rows copied back, say it runs one sequence).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
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

// Passes the one-sequence interface (memory plan, load, forward, logits, argmax, the KV cache of sequence 0,
// the device) to `inner`. What it does not pass on keeps Backend's defaults, so a wrapper runs one sequence,
// selects sampling candidates and scans rows on the host from logits(row), and refuses ranges, erasing and
// observers, whatever `inner` can do; a test overrides the calls it wants to reach `inner` or to watch.
class ForwardingBackend : public Backend {
public:
    explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
    MemoryNeed plan_memory(const ModelConfig& c, const ModelWeights& w, const MemoryRequest& r) const override {
        return inner_->plan_memory(c, w, r);
    }
    std::vector<MemoryLimit> memory_limits() const override { return inner_->memory_limits(); }
    void load(const ModelConfig& c, const ModelWeights& w, const RunOptions& o) override { inner_->load(c, w, o); }
    void forward(const ForwardBatch& batch) override { inner_->forward(batch); }
    std::span<const float> logits(int row) override { return inner_->logits(row); }
    void argmax(std::span<int32_t> per_row) override { inner_->argmax(per_row); }
    int32_t n_past() const override { return inner_->n_past(); }
    void kv_truncate(int32_t n) override { inner_->kv_truncate(n); }
    KvSnapshot kv_save(int32_t n) const override { return inner_->kv_save(n); }
    void kv_load(const KvSnapshot& s) override { inner_->kv_load(s); }
    DeviceKind device_kind() const override { return inner_->device_kind(); }
    std::string device_name() const override { return inner_->device_name(); }

protected:
    Backend& inner() { return *inner_; }

private:
    std::unique_ptr<Backend> inner_;
};

} // namespace tern::test
