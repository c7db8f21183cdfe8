// `tern bench`: the bytes a decoded token reads (hand-counted on two small files), the memory
// bandwidth probe and its SIMD loop against the scalar twin, the measurement loop driven directly,
// and the command's JSON fields and exit codes.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "engine/backend_factory.h"
#include "engine/tools/bench.h"
#include "engine/model.h"
#include "engine/tensor_roles.h"
#include "base/error.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/membw.h"
#include "tests/synth_file.h"
#include "tests/test_support.h"

using tern::test::run_tern;
using tern::test::TempDir;
using tern::test::shared_path;

namespace {

const char* kLlama2xs = "models/gguf/llama2xs-tok512-q4_0.gguf";
const char* kTied = "models/synth/synth-k256-tied-q4_0.gguf";

// TMPDIR for the tern processes this test starts (they inherit the environment).
class TmpdirOverride {
public:
    explicit TmpdirOverride(const std::filesystem::path& dir) {
        if (const char* old = std::getenv("TMPDIR")) old_ = old, had_ = true;
        setenv("TMPDIR", dir.c_str(), 1);
    }
    ~TmpdirOverride() {
        if (had_) setenv("TMPDIR", old_.c_str(), 1);
        else unsetenv("TMPDIR");
    }

private:
    std::string old_;
    bool had_ = false;
};

bool dir_empty(const std::filesystem::path& dir) {
    return std::filesystem::directory_iterator(dir) == std::filesystem::directory_iterator();
}

// A one-thread CPU backend loaded with `m` and just the context `o` needs (bench_context_size).
std::unique_ptr<tern::Backend> bench_backend(const tern::Model& m, const tern::BenchOptions& o) {
    tern::RunOptions run;
    run.n_ctx = tern::bench_context_size(o);
    auto backend = tern::make_backend("cpu", tern::CpuOptions{1});
    backend->load(m.config, m.weights, run);
    return backend;
}

} // namespace

TEST_CASE("weight bytes per token: llama2xs q4_0 (untied output), counted by hand") {
    const tern::Model m = tern::load_model(shared_path(kLlama2xs).string());
    // 5 layers, dim 64, ffn 192, 8 heads / 4 KV heads of 8, vocab 512. Q4_0 is 18 bytes per 32 weights.
    // Per layer: wq 64x64 -> 2304, wk and wv 32x64 -> 1152 each, wo 2304, gate/up/down 192x64 -> 6912
    // each: 27648; two f32 norms of 64: 512.
    const uint64_t layers = 5 * (27648 + 512);
    const uint64_t output_norm = 64 * 4;
    const uint64_t output = 512 * (64 / 32 * 34);   // q8_0 lm_head, every row
    const uint64_t embedding_row = 64 / 32 * 18;    // one q4_0 row of token_embd
    CHECK(tern::weight_bytes_per_token(m.weights, m.config) == layers + output_norm + output + embedding_row);
    CHECK(layers + output_norm + output + embedding_row == 175908);

    // KV, f16: 5 layers * 4 heads * (8 + 8) * 2 bytes = 640 bytes per position attended.
    CHECK(tern::kv_bytes_read_at(m.config, tern::KvType::f16, 0) == doctest::Approx(640));
    CHECK(tern::kv_bytes_read_at(m.config, tern::KvType::f16, 9) == doctest::Approx(6400));
    CHECK(tern::kv_bytes_read_at(m.config, tern::KvType::f32, 9) == doctest::Approx(12800));
    // Decoding 8 tokens from depth 0 attends to 1..8 positions: 4.5 on average.
    CHECK(tern::decode_bytes_per_token(m.weights, m.config, tern::KvType::f16, 0, 8) == doctest::Approx(175908 + 2880));
    // From depth 100: positions 101..108, 104.5 on average.
    CHECK(tern::decode_bytes_per_token(m.weights, m.config, tern::KvType::f16, 100, 8) ==
          doctest::Approx(175908 + 640 * 104.5));
}

TEST_CASE("weight bytes per token: a tied embedding counts once, in full") {
    const tern::Model m = tern::load_model(shared_path(kTied).string());
    REQUIRE(m.config.tied_output);
    // 2 layers, dim 256, ffn 768, 4 heads / 2 KV heads of 64. Per layer, q4_0: wq and wo 256x256 ->
    // 36864 each, wk and wv 128x256 -> 18432 each, gate/up/down 768x256 -> 110592 each: 442368, plus
    // two f32 norms of 256: 2048. token_embd (the lm_head) is q6_K, 210 bytes per 256: 512 rows.
    const uint64_t expected = 2 * (442368 + 2048) + 256 * 4 + 512 * 210;
    CHECK(expected == 997376);
    CHECK(tern::weight_bytes_per_token(m.weights, m.config) == expected);
}

TEST_CASE("KV bytes read honour sliding windows and the KV format") {
    tern::ModelConfig c;
    c.n_layers = 2;
    c.head_dim = 4;
    c.head_dim_v = 4;
    c.layers.resize(2);
    c.layers[0].n_kv_heads = 2;
    c.layers[0].sliding_window = 4;   // sees at most 4 positions
    c.layers[1].n_kv_heads = 1;       // global
    // At position 9: layer 0 reads 4 positions * 2 heads * 8 = 64 elements, layer 1 10 * 1 * 8 = 80.
    CHECK(tern::kv_bytes_read_at(c, tern::KvType::f32, 9) == doctest::Approx(144 * 4));
    CHECK(tern::kv_bytes_read_at(c, tern::KvType::q8_0, 9) == doctest::Approx(144 * 34.0 / 32.0));
    // At position 1 the window does not bite yet: 2 positions everywhere, 2*2*8 + 2*1*8 = 48 elements.
    CHECK(tern::kv_bytes_read_at(c, tern::KvType::f16, 1) == doctest::Approx(48 * 2));
}

TEST_CASE("KV element bytes match the row sizes the KV cache stores") {
    for (const tern::KvFormatInfo& f : tern::kKvFormats)
        CHECK_MESSAGE(tern::kv_element_bytes(f.type) * 128 == doctest::Approx(tern::kv_row_bytes(f.type, 128)), f.name);
}

TEST_CASE("read bandwidth probe: the SIMD sums (plain and prefetching) equal their scalar twin on random words") {
    std::mt19937_64 rng(7);
    for (size_t n : {size_t(0), size_t(1), size_t(3), size_t(15), size_t(16), size_t(17), size_t(1000), size_t(4099)}) {
        std::vector<uint64_t> w(n);
        for (uint64_t& x : w) x = rng();
        uint64_t expected = 0;
        for (uint64_t x : w) expected += x;
        CHECK(tern::read_sum_scalar(w.data(), n) == expected);
        CHECK(tern::read_sum_simd(w.data(), n) == expected);
        CHECK(tern::read_sum_simd_prefetch(w.data(), n) == expected);
    }
}

TEST_CASE("read bandwidth probe: finite positive GB/s on a small buffer, both loops") {
    for (bool scalar : {false, true}) {
        const tern::ReadBandwidth bw = tern::measure_read_bandwidth(1, 8u << 20, 2, scalar);
        CHECK(std::isfinite(bw.best_gbps));
        CHECK(bw.best_gbps > 0);
        CHECK(bw.median_gbps > 0);
        CHECK(bw.median_gbps <= bw.best_gbps);
        CHECK(bw.plain_best_gbps > 0);
        CHECK(bw.plain_best_gbps <= bw.best_gbps);   // the peak is the faster loop's
        CHECK(bw.buffer_bytes == (8u << 20));
        CHECK(bw.n_threads == 1);
        CHECK_FALSE(bw.method.empty());
    }
    CHECK_THROWS(tern::measure_read_bandwidth(1, 100, 1));
    CHECK_THROWS(tern::measure_read_bandwidth(1, 1u << 20, 0));
    // The default buffer is far beyond any cache (>= 64 MiB even on a tiny machine).
    CHECK(tern::default_read_probe_bytes() >= (64u << 20));
}

TEST_CASE("run_bench drives a backend: one time per run, from the depth context") {
    const tern::Model m = tern::load_model(shared_path(kLlama2xs).string());
    tern::BenchOptions o;
    o.n_prompt = 6;
    o.n_gen = 4;
    o.repetitions = 3;
    o.depth = 20;
    CHECK(tern::bench_context_size(o) == 26);
    auto backend = bench_backend(m, o);
    int calls = 0;
    o.progress = [&](int, int n_runs) {
        ++calls;
        CHECK(n_runs == 4);
    };
    const tern::BenchResult r = tern::run_bench(*backend, m.config.vocab, o);
    CHECK(calls == 4);   // warm-up + 3
    CHECK(r.prefill_ms.size() == 3);
    CHECK(r.decode_ms.size() == 3);
    CHECK(r.prefill_tps > 0);
    CHECK(r.decode_tps > 0);
    CHECK(r.decode_tps == doctest::Approx(4 / (r.decode_ms_median / 1000.0)));
    CHECK(backend->n_past() == 0);

    // Too small a context: the backend refuses, the error reaches the caller.
    o.depth = 30;
    CHECK_THROWS(tern::run_bench(*backend, m.config.vocab, o));
    o.depth = 0;
    o.repetitions = 0;
    CHECK_THROWS_AS(tern::run_bench(*backend, m.config.vocab, o), tern::UsageError);
}

TEST_CASE("run_bench --verify: one timed forward of the drafted tokens a run, and the context sized for it") {
    const tern::Model m = tern::load_model(shared_path(kLlama2xs).string());
    tern::BenchOptions o;
    o.n_prompt = 0;
    o.n_gen = 3;
    o.n_verify = 9;   // more than n_gen: the context must hold it
    o.repetitions = 2;
    o.depth = 5;
    CHECK(tern::bench_context_size(o) == 14);
    auto backend = bench_backend(m, o);
    const tern::BenchResult r = tern::run_bench(*backend, m.config.vocab, o);
    CHECK(r.verify_ms.size() == 2);
    CHECK(r.verify_ms_median > 0);
    CHECK(r.decode_ms.size() == 2);
    CHECK(backend->n_past() == 0);
    o.n_verify = -1;
    CHECK_THROWS_AS(tern::run_bench(*backend, m.config.vocab, o), tern::UsageError);
}

TEST_CASE("tern bench --json: every field present, speeds and bandwidths positive") {
    const auto r = run_tern({"bench", "-m", shared_path(kLlama2xs).string(), "-p", "16", "-n", "8", "-r", "1", "-t",
                             "1", "--json"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    for (const char* key : {"model", "format", "device", "cpu", "peak_method", "kv_type"}) {
        REQUIRE_MESSAGE(j.contains(key), key);
        CHECK(j[key].is_string());
        CHECK_FALSE(j[key].get<std::string>().empty());
    }
    for (const char* key : {"threads", "prefill_tokens", "prefill_tps", "decode_tokens", "decode_tps", "decode_gbps",
                            "peak_gbps", "bandwidth_share", "bytes_per_token", "weight_bytes_per_token",
                            "prefill_ms_median", "decode_ms_median", "model_bytes", "plain_read_gbps"}) {
        REQUIRE_MESSAGE(j.contains(key), key);
        REQUIRE_MESSAGE(j[key].is_number(), key);
        CHECK_MESSAGE(j[key].get<double>() > 0, key);
    }
    CHECK(j["plain_read_gbps"].get<double>() <= j["peak_gbps"].get<double>());   // the peak is the faster loop's
    CHECK(j["format"] == "Q4_0");
    CHECK(j["device"] == "cpu");
    CHECK(j["threads"] == 1);
    CHECK(j["prefill_tokens"] == 16);
    CHECK(j["decode_tokens"] == 8);
    CHECK(j["weight_bytes_per_token"] == 175908);
    CHECK(j["decode_gbps"].get<double>() ==
          doctest::Approx(j["bytes_per_token"].get<double>() * j["decode_tps"].get<double>() / 1e9));
    CHECK(j["bandwidth_share"].get<double>() ==
          doctest::Approx(j["decode_gbps"].get<double>() / j["peak_gbps"].get<double>()));
    CHECK(j["verify_tokens"] == 0);
    CHECK(j["cuda_graphs"].is_null());   // a CPU run
    CHECK(j["cuda_prefill"].is_null());
    CHECK(j["cuda_pdl"].is_null());

    // --verify N: the check of N drafted tokens against one decode step.
    const auto v = run_tern({"bench", "-m", shared_path(kLlama2xs).string(), "-p", "0", "-n", "4", "--verify", "8",
                             "-r", "1", "-t", "1", "--peak-gbps", "10", "--json"});
    REQUIRE_MESSAGE(v.exit_code == 0, v.err);
    const nlohmann::json jv = nlohmann::json::parse(v.out);
    CHECK(jv["verify_tokens"] == 8);
    CHECK(jv["verify_ms_median"].get<double>() > 0);
    CHECK(jv["verify_vs_decode_step"].get<double>() ==
          doctest::Approx(jv["verify_ms_median"].get<double>() / (jv["decode_ms_median"].get<double>() / 4)));
    const auto bad = run_tern({"bench", "-m", shared_path(kLlama2xs).string(), "--verify", "-2"});
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("--verify") != std::string::npos);
}

TEST_CASE("tern bench: the plain table") {
    const auto r = run_tern({"bench", "-m", shared_path(kLlama2xs).string(), "-p", "8", "-n", "4", "-r", "1",
                             "--peak-gbps", "10"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.find("prefill") != std::string::npos);
    CHECK(r.out.find("decode") != std::string::npos);
    CHECK(r.out.find("peak read bandwidth 10.00 GB/s") != std::string::npos);
}

TEST_CASE("tern bench: usage errors exit 1, a missing model exits 2") {
    const std::string model = shared_path(kLlama2xs).string();
    for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
             {"bench"},
             {"bench", "-m", model, "--bogus"},
             {"bench", "-m", model, "-p", "-1"},
             {"bench", "-m", model, "-n", "-2"},
             {"bench", "-m", model, "-p", "0", "-n", "0"},
             {"bench", "-m", model, "-r", "0"},
             {"bench", "-m", model, "--depth", "-1"},
             {"bench", "-m", model, "-t", "-1"},
             {"bench", "-m", model, "--kv-type", "q3"},
             {"bench", "-m", model, "--synthetic", "llama-1b:q4_0"},
         }) {
        const auto r = run_tern(args);
        CHECK_MESSAGE(r.exit_code == 1, args.back(), ": ", r.err);
        CHECK_FALSE(r.err.empty());
    }
    const auto r = run_tern({"bench", "-m", "/nonexistent/model.gguf", "-p", "4", "-n", "2", "-r", "1"});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("/nonexistent/model.gguf") != std::string::npos);
}

TEST_CASE("tern bench --synthetic: benches a random-weight shape and leaves no file behind") {
    TempDir tmp;
    TmpdirOverride env(tmp.path());
    const auto r = run_tern({"bench", "--synthetic", "tiny:q4_0", "-p", "8", "-n", "4", "-r", "1", "-t", "1", "--json",
                             "--peak-gbps", "10"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    CHECK(j["model"] == "synthetic tiny:q4_0");
    CHECK(j["synthetic"] == "tiny:q4_0");
    CHECK(j["format"] == "Q4_0");
    CHECK(j["decode_tps"].get<double>() > 0);
    // "tiny" is the synth-k256-tied shape: q4_0 layers, q6_K tied embedding, the same hand count.
    CHECK(j["weight_bytes_per_token"] == 997376);
    CHECK(dir_empty(tmp.path()));

    for (const char* bad : {"tiny", ":q4_0", "tiny:", "no-such-shape:q4_0", "tiny:q9"}) {
        const auto e = run_tern({"bench", "--synthetic", bad, "-p", "4", "-n", "2", "-r", "1"});
        CHECK_MESSAGE(e.exit_code == 1, bad, ": ", e.err);
        CHECK(e.err.find("--synthetic") != std::string::npos);
    }
    CHECK(dir_empty(tmp.path()));
}

TEST_CASE("tern bench --synthetic: Ctrl-C while the model is written removes it") {
    TempDir tmp, scripts;
    // Start a large write (llama-1b in f16 is 2.5 GB), wait until its file exists, interrupt it: the
    // process must die of SIGINT (status 130) and leave nothing in TMPDIR.
    // `set -m`: a non-interactive shell starts background jobs with SIGINT ignored, and tern keeps an
    // ignored SIGINT ignored (as nohup expects); with job control the job gets it as a terminal would.
    const std::string script = "set -m\n"
                               "d='" + tmp.path().string() + "'\n"
                               "TMPDIR=\"$d\" '" TERN_BIN "' bench --synthetic llama-1b:f16 -p 1 -n 1 -r 1 -t 1 2>/dev/null &\n"
                               "pid=$!\n"
                               "for i in $(seq 400); do [ -n \"$(ls -A \"$d\")\" ] && break; sleep 0.05; done\n"
                               "[ -n \"$(ls -A \"$d\")\" ] || { kill -9 $pid; exit 3; }\n"
                               "sleep 0.2\n"
                               "kill -INT $pid\n"
                               "wait $pid\n"
                               "[ $? -eq 130 ] || exit 4\n";
    tern::test::write_file(scripts / "interrupt.sh", script);
    CHECK(std::system(("bash '" + (scripts / "interrupt.sh").string() + "'").c_str()) == 0);
    CHECK(dir_empty(tmp.path()));
}

TEST_CASE("weight bytes per token: a mixture of experts counts the router and only the used experts") {
    // tiny-qwen3moe: 8 experts of width 256, 2 used per token. The same count on every device: decode reads
    // the used experts' matrices alone on the CPU and on CUDA (engine/cuda/backend_cuda_moe.cpp).
    tern::test::TempDir dir;
    const tern::Model m = tern::load_model(synth_file(dir, "tiny-qwen3moe", "f16"));
    REQUIRE(m.config.moe());
    REQUIRE(m.config.n_expert == 8);
    REQUIRE(m.config.n_expert_used == 2);
    // Every tensor of the file in full, then three quarters of each expert stack (6 of 8 experts unread),
    // and of the untied token_embd all but one row.
    uint64_t all = 0, unread_experts = 0;
    for (const tern::LayerWeights& l : m.weights.layers) {
        for (const tern::WeightRef* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.q_norm, &l.k_norm, &l.wo, &l.ffn_norm,
                                         &l.ffn_gate_inp, &l.gate_exps, &l.up_exps, &l.down_exps})
            if (t->present()) all += t->n_bytes();
        for (const tern::WeightRef* t : {&l.gate_exps, &l.up_exps, &l.down_exps}) unread_experts += t->n_bytes() / 8 * 6;
    }
    REQUIRE_FALSE(m.config.tied_output);
    all += m.weights.output_norm.n_bytes() + m.weights.output.n_bytes() + m.weights.token_embd.row_size();
    CHECK(unread_experts > 0);
    CHECK(tern::weight_bytes_per_token(m.weights, m.config) == all - unread_experts);
}

TEST_CASE("weight bytes per token: glm4moe reads its dense layer and shared experts whole, not its nextn layer") {
    // tiny-glm4moe: a dense layer, two of 8 experts (2 used) with a shared expert, and a next-token-prediction
    // layer that no step runs.
    tern::test::TempDir dir;
    const tern::Model m = tern::load_model(synth_file(dir, "tiny-glm4moe", "f16"));
    REQUIRE(m.weights.nextn_layers.size() == 1);
    uint64_t all = 0, unread_experts = 0;
    for (const tern::LayerWeights& l : m.weights.layers) {
        for (const tern::LayerTensor& t : tern::layer_tensors()) {
            const tern::WeightRef& r = l.*t.member;
            if (!r.present()) continue;
            all += r.n_bytes();
            if (t.kind == tern::TensorKind::stack) unread_experts += r.n_bytes() / 8 * 6;
        }
    }
    CHECK(m.weights.layers[0].w_down.present());
    CHECK(m.weights.layers[1].down_shexp.present());
    all += m.weights.output_norm.n_bytes() + m.weights.output.n_bytes() + m.weights.token_embd.row_size();
    CHECK(tern::weight_bytes_per_token(m.weights, m.config) == all - unread_experts);
}
