// The quantize pipeline as a library (engine/quantize/pipeline.h): plan_quantize's numbers, written
// files byte-identical to what `tern quantize` writes (plain and --calibrate, whose held-out numbers
// the library returns), progress events, cancellation, and the per-tensor held-out selection.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/quantize/calibration.h"
#include "engine/quantize/held_out.h"
#include "engine/quantize/pipeline.h"
#include "formats/gguf.h"
#include "formats/mapped_file.h"
#include "quant/plan.h"
#include "tests/test_support.h"

namespace fs = std::filesystem;

namespace tern {
namespace {

std::string gguf(const std::string& name) { return test::shared_path("models/gguf/" + name + ".gguf").string(); }

PlanOptions plan_for(const std::string& type) {
    PlanOptions po;
    po.ftype = *ftype_from_name(type);
    return po;
}

// Counts what a write reports.
struct Events {
    std::vector<QuantizePass> passes;
    std::vector<std::string> tensors;   // of the last pass
    uint64_t last = 0;
    bool monotonic = true;
};

class CountingProgress final : public QuantizeProgress {
public:
    explicit CountingProgress(Events& e) : e_(e) {}
    void tensor(const std::string& name) override { e_.tensors.push_back(name); }
    void update(uint64_t done) override {
        e_.monotonic &= done >= e_.last;
        e_.last = done;
    }

private:
    Events& e_;
};

QuantizeProgressFactory counting(Events& e) {
    return [&e](QuantizePass pass) {
        e.passes.push_back(pass);
        e.tensors.clear();
        e.last = 0;
        return std::make_unique<CountingProgress>(e);
    };
}

bool only_file_in(const fs::path& dir, const std::string& name) {
    for (const auto& entry : fs::directory_iterator(dir))
        if (entry.path().filename() != name) return false;
    return true;
}

} // namespace

TEST_CASE("plan_quantize: the plan's sizes, requantized formats and an estimate of the file") {
    if (!test::shared_available()) return;
    const GgufFile f32 = GgufFile::open(gguf("stories260K-f32"));
    const QuantizeJob job = plan_quantize(f32, plan_for("q8_0"));
    CHECK(job.requantized.empty());
    CHECK(job.plan.tensors.size() == f32.tensors().size());
    CHECK(job.n_converted() > 0);
    CHECK(job.sizes.out_bytes == job.plan.data_bytes());
    uint64_t elements = 0, in_bytes = 0;
    for (const GgufTensor& t : f32.tensors()) {
        in_bytes += t.n_bytes;
        elements += static_cast<uint64_t>(t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]);
    }
    CHECK(job.sizes.in_bytes == in_bytes);
    CHECK(job.sizes.elements == elements);
    CHECK(job.sizes.in_bpw() == doctest::Approx(32.0));
    CHECK_FALSE(job.wants_moments());
    CHECK(plan_quantize(f32, plan_for("f8_e4m3")).wants_moments());

    const GgufFile q4 = GgufFile::open(gguf("stories260K-q4_k_m"));
    const QuantizeJob re = plan_quantize(q4, plan_for("q8_0"));
    CHECK_FALSE(re.requantized.empty());
    CHECK(std::is_sorted(re.requantized.begin(), re.requantized.end()));

    // The estimate is exact up to the two metadata keys' few bytes.
    test::TempDir dir;
    const fs::path out = dir / "out.gguf";
    write_quantized(f32, job, out.string(), nullptr, 2, nullptr, [](QuantizePass) {
        struct Quiet final : QuantizeProgress {
            void tensor(const std::string&) override {}
            void update(uint64_t) override {}
        };
        return std::make_unique<Quiet>();
    });
    const uint64_t size = fs::file_size(out);
    CHECK(size <= job.estimated_file_size);
    CHECK(job.estimated_file_size - size < 128);
}

TEST_CASE("write_quantized writes what `tern quantize` writes, and reports each tensor once") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    for (const std::string type : {"q4_0", "q4_k_m"}) {
        CAPTURE(type);
        const std::string in = gguf("babyllama-tok105-f32");
        const fs::path cli = dir / ("cli-" + type + ".gguf"), lib = dir / ("lib-" + type + ".gguf");
        const test::CommandResult r = test::run_tern({"quantize", in, cli.string(), "--type", type, "-t", "2"});
        REQUIRE(r.exit_code == 0);
        const GgufFile f = GgufFile::open(in);
        const QuantizeJob job = plan_quantize(f, plan_for(type));
        Events e;
        const QuantizeOutcome o = write_quantized(f, job, lib.string(), nullptr, 2, nullptr, counting(e));
        CHECK(test::read_file(lib) == test::read_file(cli));
        CHECK(o.n_candidates == 0);
        CHECK_FALSE(o.model_check.has_value());
        CHECK(e.passes == std::vector<QuantizePass>{QuantizePass::output});
        CHECK(e.tensors.size() == job.plan.tensors.size());
        CHECK(e.monotonic);
        CHECK(e.last == job.sizes.elements);
    }
}

TEST_CASE("write_quantized with a calibration matches `tern quantize --calibrate`, numbers included") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    const std::string text = test::read_file(test::shared_path("data/tinystories/cs336-tinystories_sample.txt")).substr(0, 6000);
    test::write_file(dir / "text.txt", text);
    struct Case {
        std::string model, type;
    };
    for (const Case& c : {Case{"babyllama-tok105-f32", "q4_0"}, Case{"stories260K-f32", "q2_k"}}) {
        CAPTURE(c.model);
        const std::string in = gguf(c.model);
        const fs::path cli = dir / "cli.gguf", lib = dir / "lib.gguf";
        const test::CommandResult r = test::run_tern({"quantize", in, cli.string(), "--type", c.type, "--calibrate",
                                                      (dir / "text.txt").string(), "-t", "2", "--json", "--force"});
        REQUIRE(r.exit_code == 0);
        const nlohmann::json j = nlohmann::json::parse(r.out);

        const GgufFile f = GgufFile::open(in);
        const QuantizeJob job = plan_quantize(f, plan_for(c.type));
        const Calibration cal = calibrate_model(in, text, "text.txt", 2, job.wants_moments());
        Events e;
        const QuantizeOutcome o = write_quantized(f, job, lib.string(), &cal.importance, 2, nullptr, counting(e));
        CHECK(test::read_file(lib) == test::read_file(cli));
        CHECK(o.n_candidates == j["calibration_candidates"].get<size_t>());
        CHECK(o.n_selected == j["calibration_selected"].get<size_t>());
        CHECK(o.n_weighted == j["calibrated_tensors"].get<size_t>());
        REQUIRE(o.model_check.has_value());
        CHECK(o.model_check->nll_calibrated == j["calibration_check"]["nll_calibrated"].get<double>());
        CHECK(o.model_check->nll_reference == j["calibration_check"]["nll_reference"].get<double>());
        CHECK(o.model_check->tokens_scored == j["calibration_check"]["tokens_scored"].get<int64_t>());
        CHECK(o.model_check->calibrated_wins() == j["calibration_check"]["kept"].get<bool>());
        // Two candidates for the model-level check, then OUT only when calibration won.
        std::vector<QuantizePass> expect{QuantizePass::check, QuantizePass::check};
        if (o.model_check->calibrated_wins()) expect.push_back(QuantizePass::output);
        CHECK(e.passes == expect);
        CHECK(o.n_weighted == (o.model_check->calibrated_wins() ? o.n_selected : 0));
        // The check candidates are gone: only the text and the two outputs are left.
        fs::remove(cli);
        fs::remove(lib);
        CHECK(only_file_in(dir.path(), "text.txt"));
    }
}

TEST_CASE("select_calibrated_tensors: importance where the format takes it, compensation for f8_e4m3") {
    if (!test::shared_available()) return;
    const std::string in = gguf("llama2xs-tok512-f16");
    const GgufFile f = GgufFile::open(in);
    const std::string text = test::read_file(test::shared_path("data/tinystories/cs336-tinystories_sample.txt")).substr(0, 4000);
    for (const std::string type : {"q4_0", "f8_e4m3"}) {
        CAPTURE(type);
        const QuantizeJob job = plan_quantize(f, plan_for(type));
        const Calibration cal = calibrate_model(in, text, "text", 2, job.wants_moments());
        const CalibrationSelection s = select_calibrated_tensors(f, job.plan, cal.importance, 2, nullptr);
        CHECK(s.n_candidates > 0);
        CHECK(s.n_selected <= s.n_candidates);
        size_t chosen = 0;
        for (size_t i = 0; i < job.plan.tensors.size(); ++i) {
            const TensorCalibration& fit = s.fit[i];
            const TensorCalibration& all = s.all[i];
            CHECK((fit.importance != nullptr) == (all.importance != nullptr));
            CHECK((fit.moments != nullptr) == (all.moments != nullptr));
            if (type == "f8_e4m3") CHECK(fit.importance == nullptr);
            else CHECK(fit.moments == nullptr);
            chosen += fit.importance || fit.moments;
        }
        CHECK(chosen == s.n_selected);
    }
}

TEST_CASE("write_quantized stops at a raised cancel flag and leaves no file") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    const GgufFile f = GgufFile::open(gguf("stories260K-f32"));
    const QuantizeJob job = plan_quantize(f, plan_for("q4_0"));
    const std::atomic<bool> cancel{true};
    Events e;
    try {
        write_quantized(f, job, (dir / "out.gguf").string(), nullptr, 2, &cancel, counting(e));
        FAIL("the write was not stopped");
    } catch (const TernError& err) {
        CHECK(err.code() == ExitCode::interrupted);
        CHECK(std::string(err.what()) == kQuantizeInterrupted);
    }
    CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("write_quantized stops when its input is rewritten in place, naming it, and leaves no file") {
    if (!test::shared_available()) return;
    test::TempDir dir;
    const fs::path in = dir / "in.gguf";
    fs::copy_file(gguf("stories260K-f32"), in);
    fs::last_write_time(in, fs::last_write_time(in) - std::chrono::hours(1));   // a write now changes the time
    const GgufFile f = GgufFile::open(in.string());
    const QuantizeJob job = plan_quantize(f, plan_for("q4_0"));
    {
        std::fstream rewrite(in, std::ios::in | std::ios::out | std::ios::binary);
        rewrite.seekp(static_cast<std::streamoff>(fs::file_size(in) / 2));
        rewrite.write("\0\0\0\0", 4);
    }
    fs::create_directory(dir / "out");
    Events e;
    try {
        write_quantized(f, job, (dir / "out" / "out.gguf").string(), nullptr, 2, nullptr, counting(e));
        FAIL("the write did not notice the rewrite");
    } catch (const FileChanged& err) {
        CHECK(err.code() == ExitCode::runtime);
        CHECK(err.path == in.string());
    }
    CHECK(e.tensors.size() == 1);   // noticed after the first tensor
    CHECK(fs::is_empty(dir / "out"));
}

} // namespace tern
