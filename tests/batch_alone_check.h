#pragma once
// The batching engine's promise on a backend with sequences, shared by the suites of such backends
// (test_cuda_sequences, test_cuda_split_sequences): greedy requests run together give each request the tokens
// it gets alone.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/batch/batch_engine.h"
#include "engine/generation/session.h"

namespace tern::test {

// Greedy runs of n_predict tokens of each prompt, all together through an engine of prompts.size() slots over
// session(prompts.size()) and each alone through an engine of one slot over session(1), both with a step
// budget of 12 tokens (which cuts the prompts into chunks that differ between the two): checks that each
// request gets n_predict tokens and the same ones both ways. `session(n)` makes a Session whose KV pool holds
// n contexts. Returns the most sequences one forward of the run together held.
inline int32_t check_batched_as_alone(const std::function<std::unique_ptr<Session>(int32_t n)>& session,
                                      const std::vector<std::vector<int32_t>>& prompts, int32_t n_predict) {
    int32_t widest = 0;
    auto run = [&](const std::vector<std::vector<int32_t>>& requests) {
        const auto parallel = static_cast<int32_t>(requests.size());
        const std::unique_ptr<Session> s = session(parallel);
        std::vector<std::vector<int32_t>> out(requests.size());
        BatchEngineOptions options{.parallel = parallel, .max_waiting = 8, .step_tokens = 12};
        options.on_step = [&](const BatchStepInfo& info) { widest = std::max(widest, info.sequences); };
        BatchEngine engine(served_model(*s), options);
        for (size_t i = 0; i < requests.size(); ++i) {
            BatchRequest r;
            r.prompt = requests[i];
            r.n_predict = n_predict;
            r.sampling.temp = 0.0f;
            r.on_text = [](std::string_view) { return true; };
            r.on_done = [&out, i](BatchResult res) { out[i] = res.tokens; };
            REQUIRE(engine.submit(std::move(r)));
        }
        for (int i = 0; i < 1000 && !engine.idle(); ++i) engine.step();
        REQUIRE(engine.idle());
        return out;
    };
    const std::vector<std::vector<int32_t>> together = run(prompts);
    const int32_t widest_together = widest;
    for (size_t i = 0; i < prompts.size(); ++i) {
        CAPTURE(i);
        const std::vector<std::vector<int32_t>> alone = run({prompts[i]});
        CHECK(alone[0].size() == static_cast<size_t>(n_predict));
        CHECK(together[i] == alone[0]);
    }
    return widest_together;
}

} // namespace tern::test
