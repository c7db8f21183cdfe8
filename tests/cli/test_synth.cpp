// tern synth: random-weight models of named shapes that tern loads and runs (finite logits, tokens
// from `tern run`), bytes fixed by the seed, the vocabulary copied by --vocab-from, the per-tensor
// formats of tern quantize's plan, and the errors (unknown shape/type, bad vocab file, missing dir).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/backend_factory.h"
#include "engine/model.h"
#include "engine/tools/synth.h"
#include "base/error.h"
#include "formats/gguf.h"
#include "quant/plan.h"
#include "tests/synth_file.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using namespace tern;
using tern::test::run_tern;
using tern::test::TempDir;

namespace {

// Every logit of a short prefill and of one decode step is finite, and they are not all equal.
void check_logits_finite(const std::string& path) {
    const Model m = load_model(path);
    auto backend = make_backend("cpu", CpuOptions{1});
    RunOptions run;
    run.n_ctx = 32;
    backend->load(m.config, m.weights, run);
    const std::vector<int32_t> prompt = {1, 300, 301, 302, 303, 304, 305, 306};
    backend->forward({prompt, 0, LogitsWanted::last});
    for (int step = 0; step < 2; ++step) {
        const std::span<const float> logits = backend->logits(0);
        REQUIRE(static_cast<int64_t>(logits.size()) == m.config.vocab);
        CHECK(std::all_of(logits.begin(), logits.end(), [](float x) { return std::isfinite(x); }));
        CHECK(*std::max_element(logits.begin(), logits.end()) > *std::min_element(logits.begin(), logits.end()));
        const int32_t next[1] = {400};
        backend->forward({next, backend->n_past(), LogitsWanted::last});
    }
}

} // namespace

TEST_CASE("synth: every architecture's tiny shape loads and gives finite logits") {
    TempDir dir;
    for (const std::string shape : {"tiny", "tiny-qwen2", "tiny-qwen3", "tiny-gemma2", "tiny-gemma3", "tiny-qwen3moe",
                                    "tiny-mixtral", "tiny-smollm3", "tiny-phi3", "tiny-phi3-longrope", "tiny-qwen3-yarn",
                                    "tiny-longrope", "tiny-mistral3", "tiny-glm4moe", "tiny-gemma4"}) {
        for (const std::string type : {"q4_0", "q4_k_m", "f16"}) {
            CAPTURE(shape);
            CAPTURE(type);
            check_logits_finite(synth_file(dir, shape, type));
        }
    }
}

TEST_CASE("synth: every type tern quantize accepts gives a file tern runs") {
    TempDir dir;
    for (const std::string_view type : ftype_names()) {
        CAPTURE(type);
        const std::string path = synth_file(dir, "tiny", std::string(type));
        const GgufFile f = GgufFile::open(path);
        CHECK(f.get_int("general.file_type") == ftype_info(*ftype_from_name(type)).file_type);
        check_logits_finite(path);
    }
}

TEST_CASE("synth: the file holds the shape's metadata and tern quantize's per-tensor formats") {
    TempDir dir;
    const GgufFile f = GgufFile::open(synth_file(dir, "tiny", "q4_k_m"));
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("llama.embedding_length") == 256);
    CHECK(f.get_int("llama.block_count") == 2);
    CHECK(f.get_int("llama.attention.head_count") == 4);
    CHECK(f.get_int("llama.attention.head_count_kv") == 2);
    CHECK(f.get_int("llama.feed_forward_length") == 768);
    CHECK(f.get_int("general.file_type") == 15);   // LLAMA_FTYPE_MOSTLY_Q4_K_M
    CHECK(f.get_int("general.quantization_version") == 2);
    CHECK(f.get_string_array("tokenizer.ggml.tokens").size() == 512);
    CHECK(f.find_tensor("output.weight") == nullptr);   // tied, as Llama 3.2 1B
    // q4_k_m's mixture: the tied embedding takes the output's Q6_K, the last layer's attn_v and
    // ffn_down get Q6_K (more_bits), norms stay F32.
    CHECK(f.tensor("token_embd.weight").type == GgmlType::Q6_K);
    CHECK(f.tensor("blk.0.attn_q.weight").type == GgmlType::Q4_K);
    CHECK(f.tensor("blk.1.attn_v.weight").type == GgmlType::Q6_K);
    CHECK(f.tensor("blk.1.ffn_down.weight").type == GgmlType::Q6_K);
    CHECK(f.tensor("blk.0.attn_norm.weight").type == GgmlType::F32);

    // Under `tern quantize --dry-run` the same file keeps every format: synth used the same plan.
    const auto r = run_tern({"quantize", f.path(), "--type", "q4_k_m", "--dry-run", "--json"});
    REQUIRE(r.exit_code == 0);
    const nlohmann::json plan = nlohmann::json::parse(r.out); // named: a range-for over a temporary's member dangles
    for (const auto& t : plan["tensors"]) CHECK(t["from"] == t["to"]);
}

TEST_CASE("synth: tern run generates tokens from a synthetic file") {
    TempDir dir;
    for (const std::string type : {"q8_0", "q4_k_m"}) {
        const auto r = run_tern({"run", "-m", synth_file(dir, "tiny", type), "-p", "hello world", "-n", "8", "--temp",
                                 "0", "-t", "2", "--json"});
        REQUIRE_MESSAGE(r.exit_code == 0, r.err);
        const auto j = nlohmann::json::parse(r.out);
        CHECK(j["n_gen"].get<int>() >= 1);
        CHECK(!j["tokens"].empty());
    }
}

TEST_CASE("synth: the seed fixes the bytes") {
    TempDir dir;
    const std::string a = synth_file(dir, "tiny", "q4_k_m", 7);
    const std::string a_again = (dir / "again.gguf").string();
    // Through the CLI, with another thread count: rows are seeded one by one.
    const auto r = run_tern({"synth", a_again, "--shape", "tiny", "--type", "q4_k_m", "--seed", "7", "-t", "1"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.out.empty());
    const std::string b = synth_file(dir, "tiny", "q4_k_m", 8);
    CHECK(test::read_file(a) == test::read_file(a_again));
    CHECK(test::read_file(a) != test::read_file(b));
    CHECK(fs::file_size(a) == fs::file_size(b));
}

TEST_CASE("synth: --vocab-from copies the tokenizer") {
    if (!test::shared_available()) return;
    TempDir dir;
    const std::string src = test::shared_path("models/gguf/stories260K-f32.gguf").string();
    const GgufFile from = GgufFile::open(src);
    const GgufFile f = GgufFile::open(synth_file(dir, "tiny", "q8_0", 1, src));
    const auto want = from.get_string_array("tokenizer.ggml.tokens");
    const auto got = f.get_string_array("tokenizer.ggml.tokens");
    REQUIRE(got.size() == want.size());
    CHECK(std::equal(got.begin(), got.end(), want.begin()));
    for (const GgufKv& kv : from.metadata())
        if (kv.key.starts_with("tokenizer.")) CHECK_MESSAGE((f.find(kv.key) && *f.find(kv.key) == kv.value), kv.key);

    // Another vocabulary size: the model takes the file's, with one warning.
    const std::string spm = test::shared_path("models/vocab/ggml-vocab-llama-spm.gguf").string();
    const fs::path out = dir / "spm.gguf";
    const auto r = run_tern({"synth", out.string(), "--shape", "tiny", "--type", "q4_0", "--vocab-from", spm, "-t", "2"});
    REQUIRE_MESSAGE(r.exit_code == 0, r.err);
    CHECK(r.err.find("warning") != std::string::npos);
    const GgufFile g = GgufFile::open(out.string());
    CHECK(g.tensor("token_embd.weight").ne[1] ==
          static_cast<int64_t>(g.get_string_array("tokenizer.ggml.tokens").size()));
    CHECK(g.get_int("llama.vocab_size") == g.tensor("token_embd.weight").ne[1]);
}

TEST_CASE("synth: errors name the problem and leave no file") {
    TempDir dir;
    const fs::path out = dir / "x.gguf";
    auto r = run_tern({"synth", out.string(), "--shape", "llama-99b", "--type", "q4_0"});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("llama-99b") != std::string::npos);
    CHECK(r.err.find("llama-1b") != std::string::npos);   // the choices
    r = run_tern({"synth", out.string(), "--shape", "tiny", "--type", "q9_9"});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("q4_k_m") != std::string::npos);
    CHECK(synth_shape_names().size() >= 6);
    CHECK_THROWS_AS(synth_file(dir, "nope", "q4_0"), UsageError);

    test::write_file(dir / "notes.txt", "not a model\n");
    r = run_tern({"synth", out.string(), "--shape", "tiny", "--type", "q4_0", "--vocab-from", (dir / "notes.txt").string()});
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("notes.txt") != std::string::npos);
    r = run_tern({"synth", out.string(), "--shape", "tiny", "--type", "q4_0", "--vocab-from", (dir / "missing.gguf").string()});
    CHECK(r.exit_code == 2);

    r = run_tern({"synth", (dir / "no" / "such" / "x.gguf").string(), "--shape", "tiny", "--type", "q4_0"});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("does not exist") != std::string::npos);
    CHECK(!fs::exists(out));
    CHECK(!fs::exists(dir / "x.gguf.tmp"));
}

TEST_CASE("synth: a raised cancel flag stops writing and leaves no file") {
    TempDir dir;
    std::atomic<bool> cancel{true};
    SynthOptions o;
    o.shape = "tiny";
    o.type = "q8_0";
    o.cancel = &cancel;
    const fs::path out = dir / "c.gguf";
    try {
        write_synth_model(o, out.string());
        FAIL("no interruption");
    } catch (const TernError& e) {
        CHECK(e.code() == ExitCode::interrupted);
    }
    CHECK(!fs::exists(out));
    CHECK(!fs::exists(dir / "c.gguf.tmp"));
}
