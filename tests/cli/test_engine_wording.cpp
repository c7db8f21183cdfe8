// app/engine_wording.h: the engine's structured errors become the CLI's lines, naming the flags.
#include <doctest/doctest.h>

#include <string>

#include "app/engine_wording.h"
#include "engine/backend_factory.h"
#include "engine/load_errors.h"
#include "engine/speculative/drafter_model.h"

using namespace tern;

namespace {

constexpr uint64_t MiB = 1ull << 20;

// The message and exit code `error` becomes once worded.
template <class E> std::pair<std::string, ExitCode> worded(const E& error) {
    try {
        app::with_flag_words([&]() -> int { throw error; });
    } catch (const TernError& e) {
        return {e.what(), e.code()};
    }
    return {"", ExitCode::ok};
}

} // namespace

TEST_CASE("memory_shortfall_line: one line naming -c, the limit and the remedies") {
    MemoryShortfall s;
    s.limit = {1000 * MiB, "MemAvailable in /proc/meminfo", MemoryLimit::Counts::resident};
    s.need.weights = 100 * MiB;
    s.need.copies = 80 * MiB;
    s.need.kv = 900 * MiB;
    s.need.buffers = 40 * MiB;
    s.wanted = s.need.resident();
    s.weights = s.need.weights;
    s.request = MemoryRequest{KvType::f16, 32768};
    const std::string m = app::memory_shortfall_line(s);
    CAPTURE(m);
    CHECK(m == "-c 32768: needs 1.0 GiB of memory (weights 100.0 MiB, KV cache 900.0 MiB as f16, buffers 40.0 MiB) "
               "but 1000.0 MiB is available (MemAvailable in /proc/meminfo); use a smaller -c (the KV cache grows "
               "with it), --kv-type q8_0 (about half of f16's KV bytes) or a smaller quantization of the model");
    // Already on q8_0: that remedy is not offered again.
    s.request.kv_type = KvType::q8_0;
    CHECK(app::memory_shortfall_line(s).find("--kv-type") == std::string::npos);
    // An address-space limit: the packed copies.
    s.limit.counts = MemoryLimit::Counts::allocated;
    s.weights = s.need.copies;
    CHECK(app::memory_shortfall_line(s).find("(packed weights 80.0 MiB") != std::string::npos);

    const auto [line, code] = worded(MemoryShortfallError(s));
    CHECK(line == app::memory_shortfall_line(s));
    CHECK(code == ExitCode::runtime);
}

TEST_CASE("with_flag_words: device, KV and draft-model errors name their flags; others pass unchanged") {
    CHECK(worded(DeviceUnavailable("cuda:1", DeviceUnavailable::Reason::not_built)).first ==
          "--device cuda:1: tern was built without CUDA; use --device cpu");
    CHECK(worded(GpuUnavailable("cuda", "no CUDA device found")).first ==
          "--device cuda: no CUDA device found; use --device cpu or auto");
    const auto [cannot, cannot_code] = worded(DeviceCannotRun("cuda:0", "tensor blk.0.attn_q.weight is iq2_xxs"));
    CHECK(cannot == "--device cuda:0: cannot run this model: tensor blk.0.attn_q.weight is iq2_xxs; use --device cpu");
    CHECK(cannot_code == ExitCode::bad_input);
    CHECK(worded(DeviceUnavailable("tpu", DeviceUnavailable::Reason::unknown)).first ==
          "unknown device 'tpu' (choices: auto, cpu, cuda, cuda:N)");
    const auto [kv, kv_code] = worded(KvHeadDimsUnfit(KvType::q8_0, 32, 8, 8));
    CHECK(kv == "--kv-type q8_0 needs head dimensions that are multiples of 32, this model has 8 (K) and 8 (V); use "
                "--kv-type f16");
    CHECK(kv_code == ExitCode::usage);
    CHECK(worded(KvAllocationFailed(4096)).first ==
          "out of memory allocating the KV cache for 4096 positions; use a smaller context (-c)");
    CHECK(worded(DraftModelUnfit("d.gguf: its tokenizer is 'gpt2'", true)).first ==
          "--draft-model d.gguf: its tokenizer is 'gpt2'");
    const auto [file, file_code] = worded(DraftModelUnfit("d.gguf: not a GGUF file", false));
    CHECK(file == "--draft-model: d.gguf: not a GGUF file");
    CHECK(file_code == ExitCode::bad_input);
    CHECK(worded(InputError("x.gguf: truncated")).first == "x.gguf: truncated");
}
