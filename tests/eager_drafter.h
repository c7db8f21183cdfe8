#pragma once
// A drafter wrapper for tests that must see drafts: it tells the wrapped drafter that drafting is
// free, so the drafter drafts as long as it may (the most verification work). Without it, whether
// a cost-aware drafter drafts at all depends on the forward times the session measures, which a
// loaded machine (CI) can make look too expensive for drafting ever to pay.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/speculative/drafter.h"

namespace tern::test {

class EagerDrafter : public Drafter {
public:
    explicit EagerDrafter(Drafter& inner) : inner_(inner) {
        free_.step_ms = 1e9;
        free_.column_samples = 1;
    }
    void begin(std::span<const int32_t> context) override { inner_.begin(context); }
    void propose(std::span<const int32_t> h, int32_t max_tokens, const DraftCost&, std::vector<int32_t>& out) override {
        inner_.propose(h, max_tokens, free_, out);
    }
    void observe(int32_t proposed, int32_t accepted) override { inner_.observe(proposed, accepted); }
    std::string_view name() const override { return "eager"; }

private:
    Drafter& inner_;
    DraftCost free_; // column cost 0 against a huge step
};

} // namespace tern::test
