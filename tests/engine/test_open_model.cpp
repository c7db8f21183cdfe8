// engine/open_model.h: the automatic context (the model's, capped to memory), and open_model on a
// real file: the context it reports, the backend it loads, the hooks in order, and a memory
// shortfall refused before the backend allocates.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/backend_factory.h"
#include "engine/memory_budget.h"
#include "engine/open_model.h"
#include "tests/test_support.h"

using namespace tern;

TEST_CASE("choose_context: a requested size wins, else the model's, capped to half the memory left") {
    const ContextChoice asked = choose_context(512, 4096, 1000, uint64_t(1) << 30);
    CHECK(asked.n_ctx == 512);
    CHECK(asked.origin == ContextOrigin::requested);
    const ContextChoice fits = choose_context(0, 4096, 1000, uint64_t(1) << 30);   // 4 MB of KV fits
    CHECK(fits.n_ctx == 4096);
    CHECK(fits.origin == ContextOrigin::model);
    // 128k positions of 100 kB = 12.2 GiB of KV; half of 8 GiB fits 42949 positions, rounded to 42752.
    const ContextChoice capped = choose_context(0, 131072, 100000, uint64_t(8) << 30);
    CHECK(capped.n_ctx == 42752);
    CHECK(capped.origin == ContextOrigin::memory_cap);
    CHECK(capped.kv_bytes_at_train == uint64_t(131072) * 100000);
    CHECK(capped.kv_budget == uint64_t(4) << 30);
    CHECK(choose_context(0, 131072, uint64_t(1) << 40, uint64_t(8) << 30).n_ctx == 256);   // never below 256
    CHECK(choose_context(0, 0, 1000, uint64_t(1) << 30).n_ctx == 4096);   // no trained context in the file
}

TEST_CASE("kv_bytes_per_position: every layer's K and V rows") {
    if (!test::shared_available()) return;
    const Model m = load_model(test::shared_path("models/gguf/stories260K-f32.gguf").string());
    // stories260K: 5 layers, 4 KV heads of 8 dims, K and V.
    CHECK(kv_bytes_per_position(m.config, KvType::f32) == 5 * 4 * (8 + 8) * 4);
    CHECK(kv_bytes_per_position(m.config, KvType::f16) == 5 * 4 * (8 + 8) * 2);
}

TEST_CASE("open_model: the model's own context, a loaded CPU backend, the hooks in order") {
    if (!test::shared_available()) return;
    OpenRequest r;
    r.path = test::shared_path("models/gguf/stories260K-f32.gguf").string();
    r.device = "cpu";
    r.cpu.n_threads = 1;
    std::vector<std::string> calls;
    r.on_device_note = [&](const std::string&) { calls.push_back("note"); };
    r.on_file_opened = [&](const Model&) { calls.push_back("file"); };
    r.on_context = [&](const ContextChoice& c) {
        calls.push_back("context");
        CHECK(c.n_ctx > 0);
    };
    OpenedModel opened = open_model(r);
    CHECK(calls == std::vector<std::string>{"file", "context"});   // "cpu" is no automatic choice
    REQUIRE(opened.backend);
    CHECK(opened.backend->device_kind() == DeviceKind::cpu);
    CHECK(opened.context.origin == ContextOrigin::model);
    CHECK(opened.context.n_ctx == opened.model->config.n_ctx_train);
    const int32_t tokens[] = {1, 2, 3};
    opened.backend->forward(ForwardBatch{tokens, 0, LogitsWanted::last});
    CHECK(opened.backend->n_past() == 3);

    r.n_ctx = 64;
    r.kv_type = KvType::q8_0;   // head dim 8: refused by the KV cache, after the memory check
    CHECK_THROWS_AS(open_model(r), UsageError);
    r.kv_type = KvType::f32;
    CHECK(open_model(r).context.n_ctx == 64);
}

TEST_CASE("open_model: a context beyond any memory is refused before the backend allocates") {
    if (!test::shared_available()) return;
    OpenRequest r;
    r.path = test::shared_path("models/gguf/stories260K-f32.gguf").string();
    r.device = "cpu";
    r.n_ctx = INT32_MAX;   // 2^31 positions of 640 bytes: over a TiB of KV
    bool context_seen = false;
    r.on_context = [&](const ContextChoice&) { context_seen = true; };
    CHECK_THROWS_AS(open_model(r), RuntimeFailure);
    CHECK(context_seen);
}

TEST_CASE("open_model: sequences size the KV pool, and the memory check counts it") {
    if (!test::shared_available()) return;
    OpenRequest r;
    r.path = test::shared_path("models/gguf/stories260K-f32.gguf").string();
    r.device = "cpu";
    r.cpu.n_threads = 1;
    r.n_ctx = 256;
    r.sequences = 3;
    OpenedModel opened = open_model(r);
    CHECK(opened.context.n_ctx == 256);
    CHECK(opened.backend->kv_pool().pages == 3 * 256 / 128);
    r.sequences = 1;
    CHECK(open_model(r).backend->kv_pool().pages == 256 / 128);

    // The CPU plan: the pool's positions, not one context's.
    const Model m = load_model(r.path);
    MemoryRequest one;
    one.kv_type = KvType::f16;
    one.n_ctx = 256;
    MemoryRequest pool = one;
    pool.kv_pool_positions = 4 * 256;
    const auto cpu = make_backend("cpu", CpuOptions{1});
    CHECK(cpu->plan_memory(m.config, m.weights, one).kv == kv_cache_bytes(m.config, KvType::f16, 256));
    CHECK(cpu->plan_memory(m.config, m.weights, pool).kv == kv_cache_bytes(m.config, KvType::f16, 4 * 256));

    // A pool beyond any memory is refused like a context beyond it.
    r.n_ctx = 1 << 24;
    r.sequences = 100;
    CHECK_THROWS_AS(open_model(r), RuntimeFailure);
}

TEST_CASE("open_model: an unusable device is a DeviceUnavailable naming it") {
    OpenRequest r;
    r.path = "/nonexistent.gguf";   // never opened: the device is checked first
    r.device = "tpu";
    try {
        open_model(r);
        FAIL("no error");
    } catch (const DeviceUnavailable& e) {
        CHECK(e.device == "tpu");
        CHECK(e.reason == DeviceUnavailable::Reason::unknown);
    }
}
