// The whole CUDA backend (engine/cuda) against the CPU backend, on every file of ../shared/models/gguf, a
// few of ../shared/models/synth and tiny synthetic qwen3 / gemma3 / qwen3moe / gpt-oss files. Under the CUDA
// emulator in CI (the kernels run on the CPU), on a GPU with TERN_CUDA_TESTS=device.
//
// The CPU side runs with exact_matmul (dequantized weights x f32 activations, the arithmetic the CUDA
// kernels use), so the two differ only by f32 summation order:
//   - teacher-forced logits along llama.cpp's greedy path (reference/<stem>/<slug>.json: prompt +
//     generated tokens in one batch, every row kept), normalised error max|cuda - cpu| / max|cpu| per row;
//   - greedy ids over 32 decoded tokens (prompt in one batch, then one token a forward, argmax on the
//     device), equal until the CPU's top-two margin is a near-tie;
//   - the KV formats, the prefix cache's range save / append across backends, the context shift, a
//     draft-verification batch and the forward observer once each;
//   - top_logits (the candidates selected on the GPU) bit for bit against the host's selection from the
//     same backend's copied-back logits.
// The paths that round further (int8 activations; f16 tensor cores in prefill, kernels/cuda/gemm_f16.h) are held
// within their own rounding of the exact product instead.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "engine/cpu/backend_cpu.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/load_errors.h"
#include "engine/logit_candidates.h"
#include "engine/model.h"
#include "engine/split_backend.h"
#include "kernels/cuda/gemm_q8.h"
#include "tests/gguf_rewrite.h"
#include "tests/quick_mode.h"
#include "tests/synth_file.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace tern {
namespace {

using test::quick_mode;

// f32 summation-order differences through a handful of layers: measured below 1e-4 on every file here
// (the largest is printed); 1e-3 leaves room for the device's own order (FMA contraction, other splits).
constexpr double kLogitTolerance = 1e-3;
// KV rows in q8_0 / f8_e4m3: both backends store the same bytes, but the CPU's flash kernels read them
// through their own conversions and accumulation order; still far below one quantization step of a logit.
constexpr double kQuantizedKvTolerance = 1e-2;
// Prefill attention on f16 tensor cores: q and the softmax probabilities rounded to f16 (relative 2^-11)
// before their products; the emulator measures at most 7e-4 on the tiny shapes (printed), 5e-3 leaves room
// for the device.
constexpr double kTensorCoreAttentionTolerance = 5e-3;
// A greedy step whose top two CPU logits are closer than this (relative to the row's largest magnitude)
// is a near-tie: either id is right, and the paths may part there.
constexpr double kNearTie = 2e-3;
constexpr int kGreedySteps = 32;
// TERN_TEST_QUICK=1: 8 greedy steps and 16 of the reference's generated tokens in the teacher-forced batch (still
// a prefill of 16 rows or more, every row compared): the same prefill, decode and device-argmax paths on every
// file, fewer rows and steps of each.
constexpr int kQuickGreedySteps = 8;
constexpr size_t kQuickForcedTokens = 16;

int greedy_steps() {
    return quick_mode() ? kQuickGreedySteps : kGreedySteps;
}

json read_json(const fs::path& p) {
    std::ifstream f(p);
    return json::parse(f);
}

// The shared files the suite runs: all real ones and a few synthetic ones covering the formats and
// architectures the real ones lack (q2_K, q3_K, q4_1, q5_0, q5_1, q5_K, bf16, qwen2, a tied output).
// TERN_TEST_QUICK=1 (the ASan+UBSan run): a covering subset (both architectures, a tied output, head
// dims 8, 16 and 32, f32, f16, q4_0, q4_K, q6_K, q8_0 and the k-quants of the synthetic files).
std::vector<std::string> model_stems() {
    if (quick_mode())
        return {"stories260K-f32", "babyllama-tok105-q4_k_m", "llama2xs-tok512-q6_k", "synth-k256-q2_k",
                "synth-k256-q3_k_m", "synth-k256-tied-q8_0", "synth-qwen2-k256-q4_k_m"};
    std::vector<std::string> stems;
    for (const auto& e : fs::directory_iterator(test::shared_path("models/gguf")))
        if (e.path().extension() == ".gguf") stems.push_back(e.path().stem().string());
    std::sort(stems.begin(), stems.end());
    for (const char* s : {"synth-k256-q2_k", "synth-k256-q3_k_m", "synth-k256-q4_1", "synth-k256-q5_0",
                          "synth-k256-q5_1", "synth-k256-q5_k_m", "synth-k256-bf16", "synth-k256-tied-q8_0",
                          "synth-qwen2-k256-q4_k_m"})
        stems.push_back(s);
    return stems;
}

std::string model_path(const std::string& stem) {
    const fs::path gguf = test::shared_path("models/gguf/" + stem + ".gguf");
    return fs::exists(gguf) ? gguf.string() : test::shared_path("models/synth/" + stem + ".gguf").string();
}

// Every logit row of one teacher-forced batch.
std::vector<std::vector<float>> batch_logits(Backend& b, const std::vector<int32_t>& tokens) {
    b.forward({tokens, b.n_past(), LogitsWanted::all});
    std::vector<std::vector<float>> rows;
    for (size_t r = 0; r < tokens.size(); ++r) {
        const std::span<const float> row = b.logits(static_cast<int>(r));
        rows.emplace_back(row.begin(), row.end());
    }
    return rows;
}

double row_error(std::span<const float> got, std::span<const float> want) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    }
    return diff / std::max(scale, 1e-30);
}

double max_row_error(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
    REQUIRE(got.size() == want.size());
    double worst = 0.0;
    for (size_t r = 0; r < want.size(); ++r) worst = std::max(worst, row_error(got[r], want[r]));
    return worst;
}

// Whether the row's best two logits are within kNearTie of each other.
bool near_tie(std::span<const float> row) {
    float first = -INFINITY, second = -INFINITY, scale = 0.0f;
    for (float v : row) {
        scale = std::max(scale, std::fabs(v));
        if (v > first) {
            second = first;
            first = v;
        } else if (v > second) {
            second = v;
        }
    }
    return first - second <= kNearTie * scale;
}

// Greedy decode: the prompt in one batch, then greedy_steps() tokens one forward each. Returns the ids and
// whether each step's CPU row was a near-tie (only filled when `ties` is given).
std::vector<int32_t> greedy(Backend& b, const std::vector<int32_t>& prompt, std::vector<bool>* ties = nullptr) {
    std::vector<int32_t> ids;
    b.forward({prompt, 0, LogitsWanted::last});
    const int steps = greedy_steps();
    for (int step = 0; step < steps; ++step) {
        int32_t next = 0;
        b.argmax({&next, 1});
        if (ties) ties->push_back(near_tie(b.logits(0)));
        ids.push_back(next);
        if (step + 1 < steps) b.forward({std::vector<int32_t>{next}, b.n_past(), LogitsWanted::last});
    }
    return ids;
}

// CUDA's ids equal the CPU's up to the first step where the CPU saw a near-tie (the paths may part there).
void check_greedy(const std::vector<int32_t>& cuda, const std::vector<int32_t>& cpu, const std::vector<bool>& ties) {
    for (size_t i = 0; i < cpu.size(); ++i) {
        if (cuda[i] == cpu[i]) continue;
        CAPTURE(i);
        CHECK_MESSAGE(ties[i], "greedy ids part at step " << i << " without a near-tie: cuda " << cuda[i] << ", cpu "
                                                           << cpu[i]);
        return;
    }
}

// The CUDA backend with the CPU reference's arithmetic (no int8 activations, prefill attention in f32).
CudaOptions exact() {
    CudaOptions o;
    o.exact_matmul = true;
    o.prefill_attention = cuda::PrefillAttention::f32;
    return o;
}

struct Opened {
    Model model;
    std::unique_ptr<Backend> cpu, cuda;
};

Opened open_both(const std::string& path, int32_t n_ctx, KvType kv = KvType::f32) {
    Opened o{load_model(path), std::make_unique<CpuBackend>(CpuOptions{2, true}), std::make_unique<CudaBackend>(exact())};
    o.cpu->load(o.model.config, o.model.weights, RunOptions{n_ctx, kv});
    o.cuda->load(o.model.config, o.model.weights, RunOptions{n_ctx, kv});
    return o;
}

std::vector<int32_t> ramp_tokens(int n, int32_t vocab) {
    std::vector<int32_t> t;
    for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>((1 + 37 * i) % vocab));
    return t;
}

// What the int8 test cases compare: the exact CPU backend, the CPU's own int8 path and the CUDA backend, each
// holding `model` with a 64-position f32 KV cache.
struct Int8Comparison {
    CpuBackend exact_cpu{CpuOptions{2, true}}, ggml_cpu{CpuOptions{2, false}};
    CudaBackend cuda;
    explicit Int8Comparison(const Model& model) {
        for (Backend* b : all()) b->load(model.config, model.weights, RunOptions{64, KvType::f32});
    }
    std::array<Backend*, 3> all() { return {&exact_cpu, &ggml_cpu, &cuda}; }
};

} // namespace

TEST_CASE("cuda backend: teacher-forced logits and greedy ids equal the CPU backend's on the shared models") {
    if (!test::shared_available()) return;
    double worst = 0.0;
    std::string worst_case;
    for (const std::string& stem : model_stems()) {
        CAPTURE(stem);
        const json ref = read_json(test::shared_path("reference/" + stem + "/once-upon-a-time.json"));
        std::vector<int32_t> tokens = ref.at("prompt_tokens").get<std::vector<int32_t>>();
        const std::vector<int32_t> prompt = tokens;
        std::vector<int32_t> generated = ref.at("generated_tokens").get<std::vector<int32_t>>();
        if (quick_mode() && generated.size() > kQuickForcedTokens) generated.resize(kQuickForcedTokens);
        tokens.insert(tokens.end(), generated.begin(), generated.end());
        const int32_t n_ctx = static_cast<int32_t>(tokens.size()) + greedy_steps() + 8;

        Opened o = open_both(model_path(stem), n_ctx);
        const double e = max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens));
        CHECK(e < kLogitTolerance);
        if (e > worst) worst = e, worst_case = stem;

        o.cpu->kv_truncate(0);
        o.cuda->kv_truncate(0);
        std::vector<bool> ties;
        const std::vector<int32_t> cpu_ids = greedy(*o.cpu, prompt, &ties);
        check_greedy(greedy(*o.cuda, prompt), cpu_ids, ties);
    }
    MESSAGE("largest normalised logit error " << worst << " (" << worst_case << ")");
}

TEST_CASE("cuda backend: decode with int8 activations (the default) stays within their rounding of the exact product") {
    if (!test::shared_available()) return;
    for (const char* stem : {"llama2xs-tok512-q4_0", "babyllama-tok105-q8_0", "stories260K-q4_k_m", "synth-k256-q2_k",
                             "synth-k256-q3_k_m", "synth-k256-q4_k_m", "synth-k256-q5_k_m", "synth-k256-q6_k",
                             "synth-k256-q4_1", "synth-k256-q5_1"}) {
        CAPTURE(stem);
        const Model model = load_model(model_path(stem));
        Int8Comparison on(model);
        // TERN_TEST_QUICK=1: 6 steps instead of 12, every format's int8 decode kernel still run (each step is
        // the same matmuls over a longer cache; the attention is held exactly by the first test case).
        const int32_t steps = quick_mode() ? 6 : 12;
        const std::vector<int32_t> tokens = ramp_tokens(steps, model.config.vocab);
        // One token a forward: the decode path (a batch of 16 or more is a prefill, tested below).
        double vs_exact = 0.0, vs_ggml = 0.0, ggml_vs_exact = 0.0;
        for (int32_t i = 0; i < steps; ++i) {
            const std::vector<int32_t> one = {tokens[static_cast<size_t>(i)]};
            for (Backend* b : on.all()) b->forward({one, i, LogitsWanted::last});
            vs_exact = std::max(vs_exact, row_error(on.cuda.logits(0), on.exact_cpu.logits(0)));
            vs_ggml = std::max(vs_ggml, row_error(on.cuda.logits(0), on.ggml_cpu.logits(0)));
            ggml_vs_exact = std::max(ggml_vs_exact, row_error(on.ggml_cpu.logits(0), on.exact_cpu.logits(0)));
        }
        MESSAGE(std::string(stem) << ": int8 cuda vs exact " << vs_exact << ", vs the CPU's int8 " << vs_ggml
                     << "; the CPU's int8 vs exact " << ggml_vs_exact);
        // The CPU's own int8 path is as far from the exact product; CUDA's rounding may fall either way.
        CHECK(vs_exact < std::max(3.0 * ggml_vs_exact, 1e-3));
    }
}

TEST_CASE("cuda backend: prefill with int8 activations (the default) takes the tensor-core GEMM, within its rounding") {
    // A batch of 16 or more tokens is a prefill: on a device of compute capability 8.0 or more (the emulator
    // reports 8.9) its projections quantize their inputs to int8 and multiply them on tensor cores (gemm_q8).
    // Its logits are then further from the exact product than the f32 paths ever are (the first test case
    // holds those within kLogitTolerance; they measure below 1e-4), and as close as int8 rounding explains:
    // the CPU's own int8 path is as far away. (Against int8 decode, one token a forward, the prefill agrees to
    // 2e-7 on most files, but the f32 rounding order may flip an int8 code, which in these small models moves
    // a logit by up to half the int8 error: no bound to check.)
    if (!test::shared_available() || !cuda::gemm_q8_device_supported(0)) return;
    std::vector<const char*> stems = {"llama2xs-tok512-q4_0", "babyllama-tok105-q8_0", "llama2xs-tok512-q6_k",
                                      "synth-k256-q2_k",      "synth-k256-q3_k_m",     "synth-k256-q4_k_m",
                                      "synth-k256-q5_k_m",    "synth-k256-q4_1",       "synth-k256-q5_1"};
    if (quick_mode()) stems = {"llama2xs-tok512-q6_k", "synth-k256-q3_k_m", "synth-k256-q4_k_m"};
    for (const std::string stem : stems) {
        CAPTURE(stem);
        const Model model = load_model(model_path(stem));
        Int8Comparison on(model);
        const std::vector<int32_t> tokens = ramp_tokens(20, model.config.vocab);
        const std::vector<std::vector<float>> exact_rows = batch_logits(on.exact_cpu, tokens);
        const double vs_exact = max_row_error(batch_logits(on.cuda, tokens), exact_rows);
        const double ggml_vs_exact = max_row_error(batch_logits(on.ggml_cpu, tokens), exact_rows);
        MESSAGE(stem << ": int8 prefill vs exact " << vs_exact << "; the CPU's int8 vs exact " << ggml_vs_exact);
        CHECK(vs_exact > kLogitTolerance);
        CHECK(vs_exact < 3.0 * ggml_vs_exact);
    }
}

TEST_CASE("cuda backend: prefill on f16 tensor cores (F16 and F8_E4M3 by default, any format forced) stays within "
          "f16 rounding") {
    // The f16 path (kernels/cuda/gemm_f16.h) rounds every activation and every non-F16 weight to f16 (2^-11
    // relative): its logits sit further from the exact product than the f32 path's (which the first test case
    // holds within kLogitTolerance), by about the f16 rounding carried through the layers. kF16Tolerance is
    // 2^-11 times a margin of 10 for the layers' growth; a weight or column read wrongly moves a logit by
    // far more. BF16 stays on the f32 path even when f16 is forced.
    constexpr double kF16Tolerance = 10.0 * 0x1p-11;
    using P = CudaOptions::Prefill;
    struct Case {
        std::string path;
        P prefill;
        bool f16_path;
    };
    test::TempDir dir;
    std::vector<Case> cases = {{synth_file(dir, "tiny-qwen3", "f8_e4m3"), P::automatic, true}};
    if (test::shared_available()) {
        for (const char* stem : {"llama2xs-tok512-f16", "stories260K-f16"})
            cases.push_back({model_path(stem), P::automatic, true});
        for (const char* stem : {"llama2xs-tok512-q4_k_m", "babyllama-tok105-q8_0", "synth-k256-q6_k"})
            cases.push_back({model_path(stem), P::f16, true});
        cases.push_back({model_path("synth-k256-bf16"), P::f16, false});
    }
    if (quick_mode()) cases.resize(std::min<size_t>(cases.size(), 3));
    for (const Case& c : cases) {
        CAPTURE(c.path);
        const Model model = load_model(c.path);
        CpuBackend exact_cpu{CpuOptions{2, true}};
        CudaOptions f16_options, f32_options;
        f16_options.prefill = c.prefill;
        f32_options.prefill = P::f32;
        CudaBackend f16(f16_options), f32(f32_options);
        for (Backend* b : std::array<Backend*, 3>{&exact_cpu, &f16, &f32})
            b->load(model.config, model.weights, RunOptions{64, KvType::f32});
        const std::vector<int32_t> tokens = ramp_tokens(20, model.config.vocab);
        const std::vector<std::vector<float>> exact_rows = batch_logits(exact_cpu, tokens);
        const std::vector<std::vector<float>> f16_rows = batch_logits(f16, tokens);
        const std::vector<std::vector<float>> f32_rows = batch_logits(f32, tokens);
        const double f16_error = max_row_error(f16_rows, exact_rows), f32_error = max_row_error(f32_rows, exact_rows);
        MESSAGE(c.path << ": f16 prefill vs exact " << f16_error << ", the f32 path's " << f32_error);
        CHECK(f32_error < kLogitTolerance);
        if (c.f16_path) {
            CHECK(f16_error > f32_error);   // the f16 roundings show: the path ran
            CHECK(f16_error < kF16Tolerance);
        } else {
            CHECK(f16_rows == f32_rows);
        }
    }
}

TEST_CASE("cuda backend: qwen3, qwen3 with YaRN, llama with LongRoPE, mistral3 and gemma3 (q/k norms, post-norms, GeGLU, sliding windows, embedding "
          "scale)") {
    test::TempDir dir;
    for (const char* shape : {"tiny-qwen3", "tiny-qwen3-yarn", "tiny-longrope", "tiny-mistral3", "tiny-gemma3"}) {
        for (const char* type : {"f16", "q4_k_m"}) {
            CAPTURE(shape);
            CAPTURE(type);
            const std::string path = synth_file(dir, shape, type);
            // Past gemma3's 512-position local window is too slow under the emulator; the window logic is
            // covered by the attention kernel tests with small windows.
            Opened o = open_both(path, 64);
            const std::vector<int32_t> tokens = ramp_tokens(24, o.model.config.vocab);
            CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
        }
    }
}

TEST_CASE("cuda backend: a mixture of experts (qwen3moe, Mixtral) routes and sums the CPU's experts, by slot and grouped") {
    // 24 tokens in one batch: the experts grouped by expert (backend_cuda_moe.cpp's prefill way, GEMM paths
    // beside the per-column ones); 5 tokens: by slot, several columns in a launch; then greedy decode, one
    // token a step through the captured graph (the expert ids read from device memory at each replay).
    test::TempDir dir;
    for (const char* shape : {"tiny-qwen3moe", "tiny-mixtral"}) for (const char* type : {"f16", "q4_k_m"}) {
        CAPTURE(shape);
        CAPTURE(type);
        Opened o = open_both(synth_file(dir, shape, type), 64);
        const std::vector<int32_t> tokens = ramp_tokens(24, o.model.config.vocab);
        CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
        const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 5);
        for (Backend* b : {o.cpu.get(), o.cuda.get()}) b->kv_truncate(0);
        CHECK(max_row_error(batch_logits(*o.cuda, prompt), batch_logits(*o.cpu, prompt)) < kLogitTolerance);
        for (Backend* b : {o.cpu.get(), o.cuda.get()}) b->kv_truncate(0);
        std::vector<bool> ties;
        const std::vector<int32_t> cpu_ids = greedy(*o.cpu, prompt, &ties);
        check_greedy(greedy(*o.cuda, prompt), cpu_ids, ties);
    }
}

TEST_CASE("cuda backend: glm4moe (a leading dense layer, shared experts, sigmoid routing with a selection bias and "
          "a weight scale, partial rotary, q/k/v biases) gives the CPU's logits and greedy ids") {
    // As the mixture above: grouped (24 tokens), by slot (5), then decode through the captured graph; the shared
    // experts run the dense FFN's launches, fused ones in decode.
    test::TempDir dir;
    std::vector<const char*> types = {"f16", "q4_k_m"};
    if (quick_mode()) types = {"q4_k_m"};   // the int8 decode path, the one with fused launches
    for (const char* type : types) {
        CAPTURE(type);
        Opened o = open_both(synth_file(dir, "tiny-glm4moe", type), 64);
        REQUIRE(o.model.config.n_expert_shared == 1);
        REQUIRE_FALSE(o.model.config.layers[0].moe);
        const std::vector<int32_t> tokens = ramp_tokens(24, o.model.config.vocab);
        CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
        const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 5);
        for (Backend* b : {o.cpu.get(), o.cuda.get()}) b->kv_truncate(0);
        CHECK(max_row_error(batch_logits(*o.cuda, prompt), batch_logits(*o.cpu, prompt)) < kLogitTolerance);
        for (Backend* b : {o.cpu.get(), o.cuda.get()}) b->kv_truncate(0);
        std::vector<bool> ties;
        const std::vector<int32_t> cpu_ids = greedy(*o.cpu, prompt, &ties);
        check_greedy(greedy(*o.cuda, prompt), cpu_ids, ties);
    }
}

TEST_CASE("cuda backend: gpt-oss (attention sinks, windows, expert biases, softmax_weight, clamped SwiGLU, YaRN) gives "
          "the CPU's logits and greedy ids") {
    // tiny-gpt-oss: a window of 16 on the even layers, 4 of 8 biased experts a token. 24 tokens: the experts
    // grouped (prefill), past the window; 5 tokens: by slot; then (F32, the emulator's slowest part) greedy decode
    // through the captured graph and launched one by one, which must agree bit for bit.
    test::TempDir dir;
    std::vector<const char*> types = {"f32", "q4_k_m", "mxfp4_moe"};
    if (quick_mode()) types = {"f32"};
    for (const char* type : types) {
        CAPTURE(type);
        Opened o = open_both(synth_file(dir, "tiny-gpt-oss", type), 64);
        REQUIRE(o.model.config.attn_sinks);
        REQUIRE(o.model.config.expert_bias);
        const std::vector<int32_t> tokens = ramp_tokens(24, o.model.config.vocab);
        CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
        const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 5);
        for (Backend* b : {o.cpu.get(), o.cuda.get()}) b->kv_truncate(0);
        CHECK(max_row_error(batch_logits(*o.cuda, prompt), batch_logits(*o.cpu, prompt)) < kLogitTolerance);
        if (std::string(type) != "f32") continue;
        for (Backend* b : {o.cpu.get(), o.cuda.get()}) b->kv_truncate(0);
        std::vector<bool> ties;
        const std::vector<int32_t> cpu_ids = greedy(*o.cpu, prompt, &ties);
        const std::vector<int32_t> graph_ids = greedy(*o.cuda, prompt);
        check_greedy(graph_ids, cpu_ids, ties);
        CudaOptions launches = exact();
        launches.graphs = false;
        CudaBackend one_by_one(launches);
        one_by_one.load(o.model.config, o.model.weights, RunOptions{64, KvType::f32});
        CHECK(greedy(one_by_one, prompt) == graph_ids);
        const std::span<const float> g = o.cuda->logits(0), l = one_by_one.logits(0);
        CHECK(std::vector<float>(g.begin(), g.end()) == std::vector<float>(l.begin(), l.end()));
    }
}

namespace {

// A mixture of experts with int8 activations on the CUDA backend against the exact CPU backend, within three times
// the CPU's own int8 error (or 1e-3): a prefill of 20 tokens, then `decode_steps` single-token steps.
void check_moe_int8_within_rounding(const char* shape, int32_t decode_steps) {
    test::TempDir dir;
    const Model model = load_model(synth_file(dir, shape, "q4_k_m"));
    Int8Comparison on(model);
    const std::vector<int32_t> tokens = ramp_tokens(20, model.config.vocab);
    const std::vector<std::vector<float>> exact_rows = batch_logits(on.exact_cpu, tokens);
    const double prefill = max_row_error(batch_logits(on.cuda, tokens), exact_rows);
    const double ggml = max_row_error(batch_logits(on.ggml_cpu, tokens), exact_rows);
    double decode = 0.0, ggml_decode = 0.0;
    for (Backend* b : on.all()) b->kv_truncate(0);
    for (int32_t i = 0; i < decode_steps; ++i) {
        const std::vector<int32_t> one = {tokens[static_cast<size_t>(i)]};
        for (Backend* b : on.all()) b->forward({one, i, LogitsWanted::last});
        decode = std::max(decode, row_error(on.cuda.logits(0), on.exact_cpu.logits(0)));
        ggml_decode = std::max(ggml_decode, row_error(on.ggml_cpu.logits(0), on.exact_cpu.logits(0)));
    }
    MESSAGE(shape << " int8: prefill vs exact " << prefill << ", decode " << decode << "; the CPU's int8 " << ggml
                  << ", " << ggml_decode);
    CHECK(prefill < std::max(3.0 * ggml, 1e-3));
    CHECK(decode < std::max(3.0 * ggml_decode, 1e-3));
}

} // namespace

TEST_CASE("cuda backend: gpt-oss with int8 activations (the default) stays within their rounding") {
    check_moe_int8_within_rounding("tiny-gpt-oss", 6);
}

TEST_CASE("cuda backend: a mixture of experts with int8 activations (the default) stays within their rounding") {
    check_moe_int8_within_rounding("tiny-qwen3moe", 8);
    check_moe_int8_within_rounding("tiny-glm4moe", 8);
}

TEST_CASE("cuda backend: a mixture of experts it does not run is refused in one line at load") {
    test::TempDir dir;
    const Model model = load_model(synth_file(dir, "tiny-qwen3moe", "f16"));
    auto refusal = [&](const ModelConfig& c) -> std::string {
        CudaBackend cuda(exact());
        try {
            cuda.load(c, model.weights, RunOptions{64, KvType::f32});
        } catch (const DeviceCannotRun& e) {
            return e.what();
        }
        return "";
    };
    ModelConfig too_many = model.config;
    too_many.n_expert_used = 65;   // past the router kernel's 64 (and the model's 8)
    const std::string said = refusal(too_many);
    CHECK(said.find("65 of 8 experts") != std::string::npos);
    CHECK(said.find('\n') == std::string::npos);
    CHECK(refusal(model.config).empty());
}

TEST_CASE("cuda backend: mxfp4 FFN weights (tern synth --type mxfp4) give the CPU's logits and greedy ids") {
    // The exact options: the f32-activation matmul against the CPU's f32 reference.
    test::TempDir dir;
    const std::string path = synth_file(dir, "tiny", "mxfp4");
    Opened o = open_both(path, 64);
    bool has_mxfp4 = false;
    for (const auto& layer : o.model.weights.layers) has_mxfp4 |= layer.w_down.type == GgmlType::MXFP4;
    REQUIRE(has_mxfp4);
    const std::vector<int32_t> tokens = ramp_tokens(24, o.model.config.vocab);
    CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
    o.cpu->kv_truncate(0);
    o.cuda->kv_truncate(0);
    const std::vector<int32_t> prompt(tokens.begin(), tokens.begin() + 6);
    std::vector<bool> ties;
    const std::vector<int32_t> cpu_ids = greedy(*o.cpu, prompt, &ties);
    check_greedy(greedy(*o.cuda, prompt), cpu_ids, ties);

    // The default options: decode on int8 activations (matmul_q8), as far from the exact product as the CPU's
    // own int8 path (the one llama.cpp's CPU backend takes for MXFP4).
    Int8Comparison on(o.model);
    double vs_exact = 0.0, ggml_vs_exact = 0.0;
    for (int32_t i = 0; i < 8; ++i) {
        const std::vector<int32_t> one = {tokens[static_cast<size_t>(i)]};
        for (Backend* b : on.all()) b->forward({one, i, LogitsWanted::last});
        vs_exact = std::max(vs_exact, row_error(on.cuda.logits(0), on.exact_cpu.logits(0)));
        ggml_vs_exact = std::max(ggml_vs_exact, row_error(on.ggml_cpu.logits(0), on.exact_cpu.logits(0)));
    }
    MESSAGE("mxfp4: int8 cuda vs exact " << vs_exact << "; the CPU's int8 vs exact " << ggml_vs_exact);
    CHECK(vs_exact > 0.0);
    CHECK(vs_exact < std::max(3.0 * ggml_vs_exact, 1e-3));
}

TEST_CASE("cuda backend: smollm3's NoPE layers, phi3's fused tensors, partial rotary and LongRoPE, also after a shift") {
    test::TempDir dir;
    for (const char* shape : {"tiny-smollm3", "tiny-phi3", "tiny-phi3-longrope"}) {
        for (const char* type : {"f16", "q4_k_m"}) {
            CAPTURE(shape);
            CAPTURE(type);
            // 128 positions: past tiny-phi3-longrope's 64-token original context, so its long factors apply.
            Opened o = open_both(synth_file(dir, shape, type), 128, KvType::f16);
            const std::vector<int32_t> tokens = ramp_tokens(24, o.model.config.vocab);
            CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
            // The context shift turns the cached keys of the rotating layers only.
            o.cpu->kv_erase(3, 9);
            o.cuda->kv_erase(3, 9);
            const std::vector<int32_t> next = {11, 12};
            o.cpu->forward({next, o.cpu->n_past(), LogitsWanted::all});
            o.cuda->forward({next, o.cuda->n_past(), LogitsWanted::all});
            for (int r = 0; r < 2; ++r) CHECK(row_error(o.cuda->logits(r), o.cpu->logits(r)) < kLogitTolerance);
        }
    }
}

TEST_CASE("cuda backend: families added as data only: granite's four multipliers, olmo2's post-only and whole-width norms") {
    test::TempDir dir;
    for (const char* shape : {"tiny-granite", "tiny-olmo2"}) {
        CAPTURE(shape);
        Opened o = open_both(synth_file(dir, shape, "q4_k_m"), 64, KvType::f16);
        const std::vector<int32_t> tokens = ramp_tokens(20, o.model.config.vocab);
        CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
        // Decode takes the fused launches: the scaled residual adds and the unnormed block inputs there too.
        for (int32_t t : {7, 8, 9}) {
            const std::vector<int32_t> one = {t};
            o.cpu->forward({one, o.cpu->n_past(), LogitsWanted::last});
            o.cuda->forward({one, o.cuda->n_past(), LogitsWanted::last});
            CHECK(row_error(o.cuda->logits(0), o.cpu->logits(0)) < kLogitTolerance);
        }
    }
}

TEST_CASE("cuda backend: every KV cache format") {
    if (!test::shared_available()) return;
    const std::vector<int32_t> tokens = ramp_tokens(40, 512);
    for (KvType kv : {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3}) {
        CAPTURE(kv_type_name(kv));
        Opened o = open_both(model_path("synth-k256-q8_0"), 64, kv);
        const double e = max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens));
        CHECK(e < (kv_format_info(kv).quantized ? kQuantizedKvTolerance : kLogitTolerance));
        // The same snapshot layout (the K/V values themselves differ in their last bits, as the projections'
        // sums do): the CPU's snapshot restores on the GPU and decodes to the CPU's next logits.
        const KvSnapshot snap = o.cpu->kv_save(40);
        CHECK(o.cuda->kv_save(40).bytes.size() == snap.bytes.size());
        o.cuda->kv_load(snap);
        const std::vector<int32_t> next = {3};
        o.cpu->forward({next, 40, LogitsWanted::last});
        o.cuda->forward({next, 40, LogitsWanted::last});
        CHECK(row_error(o.cuda->logits(0), o.cpu->logits(0)) <
              (kv_format_info(kv).quantized ? kQuantizedKvTolerance : kLogitTolerance));
    }
}

TEST_CASE("cuda backend: a prefix cache range saved on the CPU restores on the GPU and the other way round") {
    if (!test::shared_available()) return;
    const std::vector<int32_t> prompt = ramp_tokens(30, 512);
    Opened o = open_both(model_path("llama2xs-tok512-q4_0"), 64, KvType::f16);
    o.cpu->forward({prompt, 0, LogitsWanted::last});
    o.cuda->forward({std::vector<int32_t>(prompt.begin(), prompt.begin() + 10), 0, LogitsWanted::last});
    // GPU: its own first 10 positions, then the CPU's positions 10..30 as a prefix-cache block.
    o.cuda->kv_append(o.cpu->kv_save_range(10, 30));
    CHECK(o.cuda->n_past() == 30);
    // The appended rows are the CPU's bytes, unchanged.
    const KvSnapshot cpu_rows = o.cpu->kv_save_range(10, 30);
    CHECK(o.cuda->kv_save_range(10, 30).bytes == cpu_rows.bytes);
    const std::vector<int32_t> next = {7};
    o.cpu->forward({next, 30, LogitsWanted::last});
    o.cuda->forward({next, 30, LogitsWanted::last});
    CHECK(row_error(o.cuda->logits(0), o.cpu->logits(0)) < kLogitTolerance);

    // A whole snapshot from the GPU loads on the CPU (chat /save on one device, /load on another).
    o.cpu->kv_load(o.cuda->kv_save(31));
    CHECK(o.cpu->n_past() == 31);
    // A range of another shape is refused with the CPU's words, leaving the cache as it was.
    Opened other = open_both(model_path("babyllama-tok105-f16"), 64, KvType::f16);
    other.cpu->forward({std::vector<int32_t>{1, 2, 3}, 0, LogitsWanted::last});
    CHECK_THROWS_WITH_AS(o.cuda->kv_append(other.cpu->kv_save_range(0, 3)),
                         doctest::Contains("taken from a different model or KV type"), UsageError);
    CHECK(o.cuda->n_past() == 31);
}

TEST_CASE("cuda backend: the context shift moves and turns the cache as the CPU's does") {
    if (!test::shared_available()) return;
    for (const std::string stem : {"stories260K-f32", "synth-qwen2-k256-f16"}) {
        CAPTURE(stem);
        Opened o = open_both(model_path(stem), 64, KvType::f16);
        const std::vector<int32_t> prompt = ramp_tokens(40, 512);
        o.cpu->forward({prompt, 0, LogitsWanted::last});
        o.cuda->forward({prompt, 0, LogitsWanted::last});
        o.cpu->kv_erase(5, 17);
        o.cuda->kv_erase(5, 17);
        CHECK(o.cuda->n_past() == 28);
        const std::vector<int32_t> next = {11, 12};
        o.cpu->forward({next, 28, LogitsWanted::all});
        o.cuda->forward({next, 28, LogitsWanted::all});
        for (int r = 0; r < 2; ++r) CHECK(row_error(o.cuda->logits(r), o.cpu->logits(r)) < kLogitTolerance);
    }
}

TEST_CASE("cuda backend: mistral3's attention temperature past its 32-token original context, prefill and decode") {
    test::TempDir dir;
    Opened o = open_both(synth_file(dir, "tiny-mistral3", "f16"), 64);
    REQUIRE(o.model.config.attn_temp_floor == 32);
    const std::vector<int32_t> tokens = ramp_tokens(40, o.model.config.vocab);   // positions 32..39 scale q
    CHECK(max_row_error(batch_logits(*o.cuda, tokens), batch_logits(*o.cpu, tokens)) < kLogitTolerance);
    const std::vector<int32_t> next = {5};   // one decode step at position 40 (the fused rope + KV write)
    o.cpu->forward({next, 40, LogitsWanted::last});
    o.cuda->forward({next, 40, LogitsWanted::last});
    CHECK(row_error(o.cuda->logits(0), o.cpu->logits(0)) < kLogitTolerance);
}

TEST_CASE("cuda backend: the context shift of a YaRN model turns the cache as the CPU's does") {
    test::TempDir dir;
    Opened o = open_both(synth_file(dir, "tiny-qwen3-yarn", "f16"), 64, KvType::f16);
    REQUIRE(o.model.config.layers[0].yarn_ext_factor == 1.0f);
    const std::vector<int32_t> prompt = ramp_tokens(40, o.model.config.vocab);
    o.cpu->forward({prompt, 0, LogitsWanted::last});
    o.cuda->forward({prompt, 0, LogitsWanted::last});
    o.cpu->kv_erase(5, 17);
    o.cuda->kv_erase(5, 17);
    const std::vector<int32_t> next = {11, 12};
    o.cpu->forward({next, 28, LogitsWanted::all});
    o.cuda->forward({next, 28, LogitsWanted::all});
    for (int r = 0; r < 2; ++r) CHECK(row_error(o.cuda->logits(r), o.cpu->logits(r)) < kLogitTolerance);
}

TEST_CASE("cuda backend: decode steps replayed from a captured graph equal the steps launched one by one") {
    if (!test::shared_available()) return;
    const Model model = load_model(model_path("synth-qwen2-k256-q4_k_m"));
    CudaBackend graphs(CudaOptions{0, true}), launches(CudaOptions{0, false});
    for (CudaBackend* b : {&graphs, &launches}) b->load(model.config, model.weights, RunOptions{192, KvType::f16});
    const std::vector<int32_t> prompt = ramp_tokens(7, model.config.vocab);
    // Past 160 positions the attention's split changes (5 -> 6 key tiles of 32): the graph is captured again.
    const std::vector<int32_t> a = greedy(graphs, prompt), b = greedy(launches, prompt);
    CHECK(a == b);
    // TERN_TEST_QUICK=1: 16 steps instead of 25 after the prefill, still across 160 positions (and a capture
    // on each side of it).
    const int32_t end = quick_mode() ? 166 : 175;
    for (CudaBackend* x : {&graphs, &launches}) {
        x->kv_truncate(0);
        x->forward({ramp_tokens(150, model.config.vocab), 0, LogitsWanted::last});
        for (int32_t pos = 150; pos < end; ++pos)
            x->forward({std::vector<int32_t>{pos % 500}, pos, LogitsWanted::last});
    }
    const std::span<const float> ga = graphs.logits(0), la = launches.logits(0);
    CHECK(std::vector<float>(ga.begin(), ga.end()) == std::vector<float>(la.begin(), la.end()));
}

TEST_CASE("cuda backend: decode with the GLU's int8 output and programmatic launches equals decode without") {
    // matmul_q8_glu_q8 gives quantize_activations' bytes, and a programmatic launch changes when a kernel starts,
    // not what it computes: logits bit for bit the same, graphs on (a q8_0 llama, 2 layers) and off (gemma3's
    // geglu, 6 layers, and a draft-verification batch of 5 columns).
    test::TempDir dir;
    for (const char* shape : {"tiny", "tiny-gemma3"}) {
        CAPTURE(shape);
        const Model model = load_model(synth_file(dir, shape, "q8_0"));
        CudaOptions fused, apart;
        fused.graphs = apart.graphs = std::string(shape) == "tiny";
        apart.glu_writes_q8 = false;
        apart.programmatic_launches = false;
        CudaBackend a(fused), b(apart);
        for (CudaBackend* x : {&a, &b}) {
            x->load(model.config, model.weights, RunOptions{64, KvType::f16});
            x->forward({ramp_tokens(6, model.config.vocab), 0, LogitsWanted::last});
            for (int32_t pos = 6; pos < 10; ++pos) x->forward({std::vector<int32_t>{pos * 7}, pos, LogitsWanted::last});
            x->forward({std::vector<int32_t>{3, 1, 4, 1, 5}, 10, LogitsWanted::all});
        }
        for (int r = 0; r < 5; ++r) {
            CAPTURE(r);
            const std::span<const float> la = a.logits(r), lb = b.logits(r);
            CHECK(std::vector<float>(la.begin(), la.end()) == std::vector<float>(lb.begin(), lb.end()));
        }
    }
}

TEST_CASE("cuda backend: a draft-verification batch gives each row what one-token forwards give") {
    if (!test::shared_available()) return;
    Opened o = open_both(model_path("babyllama-tok105-q4_k_m"), 64, KvType::f16);
    const std::vector<int32_t> prompt = ramp_tokens(12, 105), drafts = {5, 9, 14, 3, 22, 7, 8, 40};
    o.cuda->forward({prompt, 0, LogitsWanted::last});
    o.cuda->forward({drafts, 12, LogitsWanted::all});
    std::vector<std::vector<float>> verified;
    for (int r = 0; r < 8; ++r) verified.emplace_back(o.cuda->logits(r).begin(), o.cuda->logits(r).end());
    std::vector<int32_t> batch_ids(8);
    o.cuda->argmax(batch_ids);
    o.cuda->kv_truncate(12);
    for (int r = 0; r < 8; ++r) {
        o.cuda->forward({std::vector<int32_t>{drafts[static_cast<size_t>(r)]}, 12 + r, LogitsWanted::last});
        CHECK(row_error(o.cuda->logits(0), verified[static_cast<size_t>(r)]) < kLogitTolerance);
        int32_t id = -1;
        o.cuda->argmax({&id, 1});
        if (!near_tie(o.cuda->logits(0))) CHECK(id == batch_ids[static_cast<size_t>(r)]);
    }
}

TEST_CASE("cuda backend: the forward observer sees the CPU's projection inputs") {
    if (!test::shared_available()) return;
    struct Recorder : ForwardObserver {
        std::vector<std::vector<float>> seen;
        void matmul_input(int32_t, ProjectionInput, const float* x, int64_t rows, int64_t width) override {
            seen.emplace_back(x, x + rows * width);
        }
    } cpu_seen, cuda_seen;
    Opened o = open_both(model_path("stories260K-f32"), 32);
    o.cpu->set_observer(&cpu_seen);
    o.cuda->set_observer(&cuda_seen);
    const std::vector<int32_t> tokens = ramp_tokens(6, 512);
    o.cpu->forward({tokens, 0, LogitsWanted::all});
    o.cuda->forward({tokens, 0, LogitsWanted::all});
    REQUIRE(cuda_seen.seen.size() == cpu_seen.seen.size());
    for (size_t i = 0; i < cpu_seen.seen.size(); ++i) CHECK(row_error(cuda_seen.seen[i], cpu_seen.seen[i]) < kLogitTolerance);
}

TEST_CASE("cuda backend: partial offload (-ngl) runs the last layers on the GPU and the rest on the CPU") {
    if (!test::shared_available()) return;
    const Model model = load_model(model_path("stories260K-f32"));   // 5 layers
    const std::vector<int32_t> tokens = ramp_tokens(20, 512);
    CpuBackend cpu(CpuOptions{2, true});
    cpu.load(model.config, model.weights, RunOptions{40, KvType::f16});
    const std::vector<std::vector<float>> want = batch_logits(cpu, tokens);
    for (int32_t ngl : {0, 2, 5, 99}) {
        CAPTURE(ngl);
        cpu.kv_truncate(0);
        batch_logits(cpu, tokens);   // the CPU's cache of the 20 tokens, for the snapshots below
        SplitBackend split(std::make_unique<CpuBackend>(CpuOptions{2, true}), std::make_unique<CudaBackend>(exact()), ngl);
        split.load(model.config, model.weights, RunOptions{40, KvType::f16});
        CHECK(split.cpu_layers() == std::max(0, 5 - ngl));
        CHECK(split.device_name() == (ngl == 0 ? "cpu" : ngl < 5 ? "cuda:0+cpu" : "cuda:0"));
        const std::vector<std::vector<float>> got = batch_logits(split, tokens);
        if (ngl == 0)
            CHECK(got == want);   // the CPU backend alone
        else
            CHECK(max_row_error(got, want) < kLogitTolerance);
        // One cache in the shared format across both parts: the CPU's snapshots restore into it (and come
        // back out as the same bytes), its own snapshot loads back.
        const KvSnapshot snap = split.kv_save(20);
        CHECK(snap.bytes.size() == cpu.kv_save(20).bytes.size());
        split.kv_truncate(4);
        split.kv_append(cpu.kv_save_range(4, 9));
        CHECK(split.n_past() == 9);
        CHECK(split.kv_save_range(4, 9).bytes == cpu.kv_save_range(4, 9).bytes);
        split.kv_load(cpu.kv_save(20));
        CHECK(split.kv_save(20).bytes == cpu.kv_save(20).bytes);
        split.kv_load(snap);
        CHECK(split.n_past() == 20);
        split.kv_erase(3, 8);
        CHECK(split.n_past() == 15);
        cpu.kv_erase(3, 8);
        split.forward({std::vector<int32_t>{9}, 15, LogitsWanted::last});
        cpu.forward({std::vector<int32_t>{9}, 15, LogitsWanted::last});
        CHECK(row_error(split.logits(0), cpu.logits(0)) < kLogitTolerance);
    }
}

TEST_CASE("cuda backend: partial offload of glm4moe, split before, between and after its dense and expert layers") {
    // 3 decoder layers (dense, experts, experts) and a next-token-prediction layer neither part runs.
    test::TempDir dir;
    const Model model = load_model(synth_file(dir, "tiny-glm4moe", "f16"));
    const std::vector<int32_t> tokens = ramp_tokens(20, model.config.vocab);
    CpuBackend cpu(CpuOptions{2, true});
    cpu.load(model.config, model.weights, RunOptions{40, KvType::f16});
    const std::vector<std::vector<float>> want = batch_logits(cpu, tokens);
    std::vector<int32_t> ngls = {1, 2, 3};
    if (quick_mode()) ngls = {2};   // the split between the dense layer and the expert layers
    for (int32_t ngl : ngls) {
        CAPTURE(ngl);
        SplitBackend split(std::make_unique<CpuBackend>(CpuOptions{2, true}), std::make_unique<CudaBackend>(exact()),
                           ngl);
        split.load(model.config, model.weights, RunOptions{40, KvType::f16});
        CHECK(split.cpu_layers() == 3 - ngl);
        CHECK(max_row_error(batch_logits(split, tokens), want) < kLogitTolerance);
    }
}

TEST_CASE("cuda backend: top_logits selects on the GPU what the host selects from the same logits") {
    if (!test::shared_available()) return;
    // gpt-2's 50257-token vocabulary: 13 blocks of 4096 logits (the last one ragged), then a second pass.
    test::TempDir dir;
    const Model model = load_model(
        synth_file(dir, "tiny", "q8_0", 1, test::shared_path("models/vocab/ggml-vocab-gpt-2.gguf").string()));
    REQUIRE(model.config.vocab == 50257);
    CudaBackend cuda;
    cuda.load(model.config, model.weights, RunOptions{16, KvType::f16});
    const std::vector<int32_t> tokens = ramp_tokens(3, model.config.vocab);
    cuda.forward({tokens, 0, LogitsWanted::all});

    auto select = [](Backend& b, int row, const LogitPenalties& p, int k) {
        std::vector<LogitCandidate> out(static_cast<size_t>(k));
        out.resize(b.top_logits(row, p, out));
        return out;
    };
    auto bits_of = [](const std::vector<LogitCandidate>& c) {
        std::vector<std::pair<int32_t, uint32_t>> b;
        for (const LogitCandidate& x : c) b.emplace_back(x.id, __builtin_bit_cast(uint32_t, x.logit));
        return b;
    };
    for (int row = 0; row < 3; ++row) {
        CAPTURE(row);
        // The penalties hit the row's best logits (taken from the GPU, so the host copy is not fetched
        // yet: a kernel that penalised the kept row in place would show in the copy fetched below).
        LogitPenalties p;
        p.repeat = 1.3f;
        p.frequency = 0.25f;
        p.presence = 0.4f;
        int32_t count = 1;
        for (const LogitCandidate& c : select(cuda, row, {}, 64))
            if (c.id % 3 != 0) p.seen.push_back({c.id, count++ % 4 + 1});
        p.seen.push_back({model.config.vocab + 3, 2});   // outside the vocabulary: ignored
        std::vector<std::vector<LogitCandidate>> device;
        for (int k : {1, 40, kMaxTopCandidates}) device.push_back(select(cuda, row, p, k));
        const std::span<const float> copied = cuda.logits(row);
        const std::vector<float> kept(copied.begin(), copied.end());
        size_t i = 0;
        for (int k : {1, 40, kMaxTopCandidates}) {
            CAPTURE(k);
            std::vector<LogitCandidate> want(static_cast<size_t>(k));
            want.resize(select_top_logits(kept, p, want));
            REQUIRE(device[i].size() == static_cast<size_t>(k));
            CHECK(bits_of(device[i++]) == bits_of(want));
            std::vector<LogitCandidate> plain(static_cast<size_t>(k));
            plain.resize(select_top_logits(kept, {}, plain));
            CHECK(bits_of(select(cuda, row, {}, k)) == bits_of(plain));
            if (k > 1) CHECK(bits_of(plain) != bits_of(want));   // the penalties changed the selection
        }
    }
    std::vector<LogitCandidate> too_many(static_cast<size_t>(kMaxTopCandidates) + 1);
    CHECK_THROWS_AS(cuda.top_logits(0, {}, too_many), UsageError);
    std::vector<LogitCandidate> one(1);
    CHECK_THROWS_AS(cuda.top_logits(3, {}, one), UsageError);
}

TEST_CASE("cuda backend: scan_logits flags on the GPU what the host's scan of the same rows finds") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    // stories260K, and a copy whose output matrix is NaN: every logit NaN.
    const std::string damaged = test::rewrite_filled(
        dir, test::stories(), "nan.gguf", [](const std::string& name) { return name == "output.weight"; }, NAN);
    for (const std::string& path : {test::stories(), damaged}) {
        CAPTURE(path);
        const Model model = load_model(path);
        CudaBackend cuda;
        cuda.load(model.config, model.weights, RunOptions{16, KvType::f16});
        const std::vector<int32_t> tokens = ramp_tokens(3, model.config.vocab);
        cuda.forward({tokens, 0, LogitsWanted::all});
        for (int row = 0; row < 3; ++row) {
            const FloatScan device = cuda.scan_logits(row);
            const FloatScan host = scan_floats(cuda.logits(row));
            CHECK(device.nan == host.nan);
            CHECK(device.pos_inf == host.pos_inf);
            CHECK(device.finite == host.finite);
            CHECK(device.nan == (path == damaged));
        }
        // A later forward keeps one row: its flags are scanned again, the old rows are gone.
        const int32_t next = 5;
        cuda.forward({std::span<const int32_t>(&next, 1), 3, LogitsWanted::last});
        CHECK(cuda.scan_logits(0).nan == (path == damaged));
        CHECK_THROWS_AS(cuda.scan_logits(1), UsageError);
    }
}

TEST_CASE("cuda backend: the weights' upload reports its progress, ending at the total") {
    if (!test::shared_available()) return;
    const Model model = load_model(model_path("babyllama-tok105-q4_0"));
    std::vector<std::pair<uint64_t, uint64_t>> calls;
    RunOptions options{16, KvType::f16};
    options.on_upload = [&](uint64_t done, uint64_t total) { calls.emplace_back(done, total); };
    CudaBackend cuda;
    cuda.load(model.config, model.weights, options);
    REQUIRE(calls.size() > 2);   // one call a tensor
    for (size_t i = 1; i < calls.size(); ++i) CHECK(calls[i].first > calls[i - 1].first);
    CHECK(calls.back().first == calls.back().second);
}

#if defined(TERN_CUDA_EMULATOR)
TEST_CASE("cuda backend: launches per decode step with the fused epilogues") {
    // Per layer, with one matrix format throughout: rmsnorm (+ quantize, with int8 activations: one launch),
    // q/k/v, rope + KV write, attention, [quantize], o + residual, rmsnorm (+ quantize), gate/up + activation
    // (+ quantize: the GLU launch writes down's int8 input too), down + residual: 9 with int8 activations, 8 with
    // f32 ones (the separate kernels took 19 and 15); gemma's post-norms keep its two residual adds apart (11 /
    // 10). Around the layers: embed, final rmsnorm, [quantize], lm_head. A llama-like and a gemma-like tiny
    // file always; the shared llama2 and stories files too where ../shared is. A captured decode step (graphs on)
    // holds the same launches. Without the GLU's int8 output (CudaOptions::glu_writes_q8) a quantize comes back.
    struct Case {
        std::string path;
        bool exact;
        int per_layer;
        bool glu_q8 = true;
    };
    test::TempDir dir;
    const std::string tiny = synth_file(dir, "tiny", "q8_0"), gemma = synth_file(dir, "tiny-gemma3", "q8_0");
    std::vector<Case> cases = {{tiny, false, 9}, {tiny, true, 8},  {tiny, false, 10, false},
                               {gemma, false, 11}, {gemma, true, 10}, {gemma, false, 12, false}};
    if (test::shared_available()) {
        cases.push_back({model_path("llama2xs-tok512-q8_0"), false, 9});
        cases.push_back({model_path("llama2xs-tok512-q8_0"), true, 8});
        cases.push_back({model_path("stories260K-f32"), false, 8});
    }
    for (const Case& c : cases) {
        CAPTURE(c.path);
        CAPTURE(c.exact);
        CAPTURE(c.glu_q8);
        const Model model = load_model(c.path);
        const bool q8 = !c.exact && model.weights.output.type != GgmlType::F32;
        const size_t want = static_cast<size_t>(model.config.n_layers * c.per_layer + 3 + (q8 ? 1 : 0) +
                                                (model.config.final_softcap > 0.0f ? 1 : 0));
        for (bool graphs : {false, true}) {
            CAPTURE(graphs);
            CudaOptions options;
            options.graphs = graphs;   // off: launched one by one; on: the first step's capture records them
            options.exact_matmul = c.exact;
            options.glu_writes_q8 = c.glu_q8;
            CudaBackend cuda(options);
            cuda.load(model.config, model.weights, RunOptions{32, KvType::f16});
            cuda.forward({ramp_tokens(3, model.config.vocab), 0, LogitsWanted::last});
            const size_t before = cuda_emu::kernel_launches();
            cuda.forward({std::vector<int32_t>{5}, 3, LogitsWanted::last});
            CHECK(cuda_emu::kernel_launches() - before == want);
        }
    }
}

TEST_CASE("cuda backend: every kernel of a decode step is a programmatic dependent launch") {
    // Each kernel of a decode step starts with dependent_launch::wait_and_release (the emulator faults one that
    // takes an atomic or exits first), so none needs a full launch gap: all of the step's launches, attention's
    // included, go out programmatic; in a 2-sequence batch (attention_tokens) too. Graphs off and on (the first
    // decode step after a prefill is captured, its launches counted); none with CudaOptions::programmatic_launches
    // off. (A prefill's int8 tensor-core GEMMs still launch plainly.)
    test::TempDir dir;
    for (const char* shape : {"tiny", "tiny-gemma3"}) {
        CAPTURE(shape);
        const Model model = load_model(synth_file(dir, shape, "q8_0"));
        for (const bool programmatic : {true, false}) {
            for (const bool graphs : {false, true}) {
                CAPTURE(programmatic);
                CAPTURE(graphs);
                CudaOptions options;
                options.graphs = graphs;
                options.programmatic_launches = programmatic;
                CudaBackend cuda(options);
                RunOptions run{64, KvType::f16};
                run.kv_pool_positions = 256;
                cuda.load(model.config, model.weights, run);
                // Of the step's launches (at least one), those that went out programmatic: all of them or none.
                const auto check_step = [&](const ForwardBatch& batch) {
                    const size_t all = cuda_emu::kernel_launches(), dependents = cuda_emu::programmatic_launches();
                    cuda.forward(batch);
                    const size_t step = cuda_emu::kernel_launches() - all;
                    CHECK(step > 0);
                    CHECK(cuda_emu::programmatic_launches() - dependents == (programmatic ? step : 0));
                };
                // TERN_TEST_QUICK=1: a prefill of 16 tokens (the fewest that make one) instead of 40 before the
                // counted steps; the counted decode and 2-sequence steps are the same.
                const int32_t n_prefill = quick_mode() ? 16 : 40;
                cuda.forward({ramp_tokens(n_prefill, model.config.vocab), 0, LogitsWanted::last});
                check_step({std::vector<int32_t>{5}, n_prefill, LogitsWanted::last});
                cuda.seq_create(1);
                const std::vector<int32_t> tokens = {7, 1, 2, 3};
                const std::vector<SequenceSpan> spans = {{0, 1, LogitsWanted::last}, {1, 3, LogitsWanted::all}};
                ForwardBatch batch;
                batch.tokens = tokens;
                batch.spans = spans;
                check_step(batch);
            }
        }
    }
}
#endif

TEST_CASE("cuda backend: bad batches are refused as on the CPU") {
    if (!test::shared_available()) return;
    Opened o = open_both(model_path("stories260K-f32"), 8);
    CHECK_THROWS_AS(o.cuda->forward({std::vector<int32_t>{}, 0, LogitsWanted::last}), UsageError);
    CHECK_THROWS_AS(o.cuda->forward({std::vector<int32_t>{1}, 3, LogitsWanted::last}), UsageError);
    CHECK_THROWS_AS(o.cuda->forward({std::vector<int32_t>{100000}, 0, LogitsWanted::last}), UsageError);
    CHECK_THROWS_AS(o.cuda->forward({ramp_tokens(9, 512), 0, LogitsWanted::last}), UsageError);
    CHECK_THROWS_AS(o.cuda->logits(0), UsageError);
    CHECK(o.cuda->device_kind() == DeviceKind::cuda);
    CHECK(o.cuda->device_name() == "cuda:0");
}

TEST_CASE("cuda backend: prefill attention on f16 tensor cores stays within its rounding of the CPU's logits") {
    // Head dims 64 (llama, gemma2's softcap and sliding window) and 128 (qwen3, gemma3's windows), GQA
    // groups 2 and 4, an f16 cache; a prompt of 80 tokens in one forward, then a chunk of 40 after it (pos0 >
    // 0). The tensor-core kernel rounds q and the probabilities to f16 (the cache is f16 on both sides): the
    // emulator measures logit errors up to 7e-4 against the CPU, the f32 kernel's stay below 1e-4; a run
    // that never reached the tensor cores would give the f32 kernel's logits (checked: the two CUDA runs differ).
    test::TempDir dir;
    double worst = 0.0;
    for (const char* shape : {"tiny", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3"}) {
        CAPTURE(shape);
        const Model model = load_model(synth_file(dir, shape, "f16"));
        CpuBackend cpu(CpuOptions{2, true});
        CudaOptions tc = exact();
        tc.prefill_attention = cuda::PrefillAttention::mma;
        CudaBackend cuda_tc(tc), cuda_f32(exact());
        for (Backend* b : std::initializer_list<Backend*>{&cpu, &cuda_tc, &cuda_f32})
            b->load(model.config, model.weights, RunOptions{160, KvType::f16});
        const std::vector<int32_t> tokens = ramp_tokens(120, model.config.vocab);
        for (const auto& chunk : {std::vector<int32_t>(tokens.begin(), tokens.begin() + 80),
                                  std::vector<int32_t>(tokens.begin() + 80, tokens.end())}) {
            const auto want = batch_logits(cpu, chunk);
            const double e_tc = max_row_error(batch_logits(cuda_tc, chunk), want);
            const double e_f32 = max_row_error(batch_logits(cuda_f32, chunk), want);
            CAPTURE(e_f32);
            CHECK(e_tc < kTensorCoreAttentionTolerance);
            CHECK(e_f32 < kLogitTolerance);
            CHECK(e_tc != e_f32);
            worst = std::max(worst, e_tc);
        }
    }
    MESSAGE("largest normalised logit error with tensor-core prefill attention " << worst);
}

} // namespace tern
