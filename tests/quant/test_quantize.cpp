// `tern quantize` end to end: byte-identical files with llama-quantize's shared synth outputs for
// every type they hold, the refusals (OUT == IN, existing OUT), a full disk (RLIMIT_FSIZE) leaving
// nothing behind, --dry-run, --json, requantization, and an f8_e4m3 file that tern runs.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "formats/gguf.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;
using tern::test::run_tern;
using tern::test::TempDir;

namespace {

std::string synth(const std::string& name) { return tern::test::shared_path("models/synth/" + name).string(); }

bool same_bytes(const fs::path& a, const fs::path& b) {
    return tern::test::read_file(a) == tern::test::read_file(b);
}

} // namespace

TEST_CASE("quantize reproduces llama-quantize's synth files byte for byte") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    int checked = 0;
    for (const std::string model : {"synth-k256", "synth-k256-tied", "synth-qwen2-k256"}) {
        for (const std::string type : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m",
                                       "q5_k_m", "q6_k", "f16", "bf16"}) {
            const fs::path ref = synth(model + "-" + type + ".gguf");
            if (!fs::exists(ref)) continue;
            CAPTURE(ref.string());
            const fs::path out = dir / (model + "-" + type + ".gguf");
            const auto r = run_tern({"quantize", synth(model + "-f32.gguf"), out.string(), "--type", type, "-t", "2"});
            REQUIRE(r.exit_code == 0);
            CHECK(r.out.empty());
            CHECK(r.err.find("bpw") != std::string::npos);   // the summary line
            CHECK(same_bytes(out, ref));
            ++checked;
        }
    }
    CHECK(checked == 21);
}

TEST_CASE("quantize: same bytes with any thread count") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    REQUIRE(run_tern({"quantize", synth("synth-k256-f32.gguf"), (dir / "a.gguf").string(), "--type", "q3_k_m", "-t",
                      "1"}).exit_code == 0);
    REQUIRE(run_tern({"quantize", synth("synth-k256-f32.gguf"), (dir / "b.gguf").string(), "--type", "q3_k_m", "-t",
                      "3"}).exit_code == 0);
    CHECK(same_bytes(dir / "a.gguf", dir / "b.gguf"));
}

TEST_CASE("quantize refuses OUT == IN and an existing OUT without --force") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    const fs::path in = dir / "in.gguf";
    fs::copy_file(synth("synth-k256-f32.gguf"), in);
    const std::string before = tern::test::read_file(in);

    auto r = run_tern({"quantize", in.string(), in.string(), "--type", "q8_0", "--force"});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("input file") != std::string::npos);
    // The same file through another path (a "sub/.." detour and a hard link).
    fs::create_directory(dir / "sub");
    r = run_tern({"quantize", in.string(), (dir / "sub" / ".." / "in.gguf").string(), "--type", "q8_0", "--force"});
    CHECK(r.exit_code == 1);
    fs::create_hard_link(in, dir / "link.gguf");
    r = run_tern({"quantize", in.string(), (dir / "link.gguf").string(), "--type", "q8_0", "--force"});
    CHECK(r.exit_code == 1);
    CHECK(tern::test::read_file(in) == before);

    const fs::path out = dir / "out.gguf";
    tern::test::write_file(out, "keep me");
    r = run_tern({"quantize", in.string(), out.string(), "--type", "q8_0"});
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("--force") != std::string::npos);
    CHECK(tern::test::read_file(out) == "keep me");
    r = run_tern({"quantize", in.string(), out.string(), "--type", "q8_0", "--force"});
    CHECK(r.exit_code == 0);
    CHECK(same_bytes(out, synth("synth-k256-q8_0.gguf")));

    // Bad usage
    CHECK(run_tern({"quantize", in.string(), (dir / "x.gguf").string(), "--type", "q4_k"}).exit_code == 1);
    CHECK(run_tern({"quantize", in.string(), (dir / "x.gguf").string(), "--type", "q8_0", "--tensor-type", "attn_v"})
              .exit_code == 1);
    CHECK(run_tern({"quantize", (dir / "missing.gguf").string(), (dir / "x.gguf").string(), "--type", "q8_0"})
              .exit_code == 2);
    CHECK_FALSE(fs::exists(dir / "x.gguf"));
}

TEST_CASE("quantize: a full disk (RLIMIT_FSIZE) leaves no OUT and no OUT.tmp") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    const fs::path out = dir / "out.gguf";
    // 200 blocks of 1 KiB (ulimit -f counts 1024-byte blocks): the ~1 MB output cannot fit.
    const std::string cmd = "(ulimit -f 200; '" + std::string(TERN_BIN) + "' quantize '" +
                            synth("synth-k256-f32.gguf") + "' '" + out.string() + "' --type q4_k_m) 2>'" +
                            (dir / "err").string() + "'";
    const int status = std::system(cmd.c_str());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 3);
    CHECK_FALSE(fs::exists(out));
    CHECK_FALSE(fs::exists(dir / "out.gguf.tmp"));
    const std::string err = tern::test::read_file(dir / "err");
    CHECK(err.find(out.string()) != std::string::npos);
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);
}

TEST_CASE("quantize --dry-run prints the plan and writes nothing; --json") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    auto r = run_tern({"quantize", synth("synth-k256-f32.gguf"), (dir / "o.gguf").string(), "--type", "q4_k_m",
                       "--dry-run"});
    REQUIRE(r.exit_code == 0);
    CHECK_FALSE(fs::exists(dir / "o.gguf"));
    CHECK(r.out.find("blk.1.attn_v.weight") != std::string::npos);
    CHECK(r.out.find("f32 -> q6_K") != std::string::npos);
    CHECK(r.out.find("size:") != std::string::npos);

    r = run_tern({"quantize", synth("synth-k256-f32.gguf"), "--type", "q4_k_m", "--dry-run", "--json"});
    REQUIRE(r.exit_code == 0);
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["file_type"] == 15);
    CHECK(j["tensors"].size() == 21);
    // The estimate is close to what llama-quantize wrote (1142880 bytes).
    CHECK(std::abs(j["output_bytes_estimate"].get<double>() - 1142880.0) < 256.0);

    r = run_tern({"quantize", synth("synth-k256-f32.gguf"), (dir / "o.gguf").string(), "--type", "q5_0", "--json"});
    REQUIRE(r.exit_code == 0);
    j = nlohmann::json::parse(r.out);
    CHECK(j["output_bytes"] == fs::file_size(dir / "o.gguf"));
    CHECK(j["n_converted"] == 16);
    CHECK(j["type"] == "q5_0");
    CHECK(j["output_bpw"].get<double>() < 6.0);
}

TEST_CASE("quantize: requantizing warns; widths that fit nothing fall back, reported once") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    auto r = run_tern({"quantize", synth("synth-k256-q8_0.gguf"), (dir / "r.gguf").string(), "--type", "q4_0"});
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("already-quantized") != std::string::npos);

    const std::string stories = tern::test::shared_path("models/gguf/stories260K-f32.gguf").string();
    r = run_tern({"quantize", stories, (dir / "s.gguf").string(), "--type", "q4_k_m"});
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("width fallback q4_K -> q5_0") != std::string::npos);
    const tern::GgufFile f = tern::GgufFile::open((dir / "s.gguf").string());
    CHECK(f.tensor("blk.0.ffn_down.weight").type == tern::GgmlType::F16);
    CHECK(f.get_u32("general.file_type") == 15);
    CHECK(f.get_u32("general.quantization_version") == 2);
    // q4_0 cannot hold width 172 at all: those tensors become f16, as llama-quantize 0c1e57098 does.
    r = run_tern({"quantize", stories, (dir / "q.gguf").string(), "--type", "q4_0"});
    CHECK(r.exit_code == 0);
    CHECK(r.err.find("q4_0 -> f16: width 172") != std::string::npos);
    CHECK(tern::GgufFile::open((dir / "q.gguf").string()).tensor("blk.4.ffn_down.weight").type ==
          tern::GgmlType::F16);
}

TEST_CASE("quantize to f8_e4m3: the file loads and runs in tern") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    const fs::path out = dir / "f8.gguf";
    auto r = run_tern({"quantize", synth("synth-k256-f32.gguf"), out.string(), "--type", "f8_e4m3"});
    REQUIRE(r.exit_code == 0);
    const tern::GgufFile f = tern::GgufFile::open(out.string());
    CHECK(f.get_u32("general.file_type") == 1000);
    CHECK(f.tensor("blk.0.attn_q.weight").type == tern::GgmlType::F8_E4M3);
    CHECK(f.tensor("output.weight").type == tern::GgmlType::F16);
    r = run_tern({"run", "-m", out.string(), "-p", "Once upon a time", "-n", "8", "--temp", "0", "--device", "cpu",
                  "--json"});
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["n_gen"].get<int>() >= 1);
}

TEST_CASE("quantize --calibrate: weighted q2_K/q3_K/q4_0 only where they win on held-out text, else the default bytes") {
    if (!tern::test::shared_available()) return;
    TempDir dir;
    const std::string text = tern::test::shared_path("data/tinystories/cs336-tinystories_sample.txt").string();
    // Either the weighted tensors won the held-out check (then the file differs from the default)
    // or the output is byte-identical to the default quantization; no check file is left behind.
    auto check_outcome = [&](const std::string& src, const std::string& type, const std::string& def,
                             const std::string& name) {
        auto r = run_tern({"quantize", src, (dir / name).string(), "--type", type, "--calibrate", text, "--json"});
        REQUIRE(r.exit_code == 0);
        const auto j = nlohmann::json::parse(r.out);
        const int weighted = j["calibrated_tensors"].get<int>();
        INFO(src << " " << type << ": " << j.dump().substr(0, 300));
        CHECK(j["calibration_candidates"].get<int>() >= j["calibration_selected"].get<int>());
        if (j["calibration_selected"].get<int>() > 0) {
            REQUIRE(j.contains("calibration_check"));
            const bool kept = j["calibration_check"]["kept"].get<bool>();
            CHECK(kept == (j["calibration_check"]["nll_calibrated"].get<double>() <
                           j["calibration_check"]["nll_reference"].get<double>()));
            CHECK(weighted == (kept ? j["calibration_selected"].get<int>() : 0));
        } else {
            CHECK(weighted == 0);
        }
        CHECK(same_bytes(dir / name, def) == (weighted == 0));
        for (const auto& e : std::filesystem::directory_iterator(dir.path())) {   // no check file, whatever its suffix
            const std::string f = e.path().filename().string();
            CHECK_FALSE(f.rfind(name + ".calibrated-check", 0) == 0);
            CHECK_FALSE(f.rfind(name + ".reference-check", 0) == 0);
        }
        return j;
    };
    auto j = check_outcome(synth("synth-k256-f32.gguf"), "q2_k", synth("synth-k256-q2_k.gguf"), "c.gguf");
    CHECK(j["calibration_candidates"] == 14);   // all but token_embd (Q2_K) and output (Q6_K)
    // Q4_0, the width fallback of q2_k / q3_k_*, is a candidate too.
    j = check_outcome(synth("synth-k256-f32.gguf"), "q4_0", synth("synth-k256-q4_0.gguf"), "f.gguf");
    CHECK(j["calibration_candidates"].get<int>() > 0);
    // stories260K q3_k_m: every tensor wins on its own, the model loses on the held-out half
    // (bench/results/quality.md section 2), so the default bytes are written.
    const std::string stories = tern::test::shared_path("models/gguf/stories260K-f32.gguf").string();
    run_tern({"quantize", stories, (dir / "s-def.gguf").string(), "--type", "q3_k_m"});
    j = check_outcome(stories, "q3_k_m", (dir / "s-def.gguf").string(), "s.gguf");
    CHECK(j["calibration_selected"].get<int>() > 0);
    CHECK(j["calibrated_tensors"] == 0);
    // f8_e4m3 gets the error-compensating rounding (quant/compensated.h); on llama2xs every matrix
    // wins its check and the model wins the held-out NLL (2.5704 vs 2.5756 when measured).
    const std::string xs = tern::test::shared_path("models/gguf/llama2xs-tok512-f32.gguf").string();
    run_tern({"quantize", xs, (dir / "x-def.gguf").string(), "--type", "f8_e4m3"});
    j = check_outcome(xs, "f8_e4m3", (dir / "x-def.gguf").string(), "x.gguf");
    CHECK(j["calibration_candidates"] == 35);   // every matrix but token_embd and output (f16)
    CHECK(j["calibrated_tensors"] == 35);
    auto r = run_tern({"quantize", synth("synth-k256-f32.gguf"), (dir / "d.gguf").string(), "--type", "q4_k_m",
                       "--calibrate", text});
    REQUIRE(r.exit_code == 0);
    CHECK(same_bytes(dir / "d.gguf", synth("synth-k256-q4_k_m.gguf")));
    CHECK(run_tern({"quantize", synth("synth-k256-f32.gguf"), (dir / "e.gguf").string(), "--type", "q2_k",
                    "--calibrate", (dir / "missing.txt").string()})
              .exit_code == 2);
}
