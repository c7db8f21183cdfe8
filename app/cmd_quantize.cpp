// tern quantize IN.gguf OUT.gguf --type TYPE (../shared/CLI.md): the flags, their checks and what is
// printed; the conversion itself (llama-quantize's type mixtures, the reference quantizers, calibration
// and its held-out checks) is engine/quantize/pipeline.h.
// Safety: OUT is written to a unique temporary file beside it and renamed (GgufWriter, AtomicFile);
// OUT == IN, an existing OUT without --force and an OUT that is not a regular file are refused; any
// error, Ctrl-C, SIGTERM or SIGHUP leaves no OUT and no temporary file.
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/console.h"
#include "app/engine_wording.h"
#include "app/signals.h"
#include "base/error.h"
#include "engine/quantize/calibration.h"
#include "engine/quantize/pipeline.h"
#include "formats/atomic_file.h"
#include "formats/gguf.h"
#include "formats/input_file.h"
#include "kernels/cpu_features.h"
#include "quant/plan.h"

namespace tern::app {

namespace {

struct QuantizeArgs {
    std::string in;
    std::string out;
    std::string type;
    int threads = 0;
    bool force = false;
    bool json = false;
    bool dry_run = false;
    bool pure = false;
    std::vector<std::string> tensor_types;
    std::string calibrate;   // text file for --calibrate
};

std::string join_names(const std::vector<std::string_view>& names) {
    std::string s;
    for (std::string_view n : names) s += (s.empty() ? "" : ", ") + std::string(n);
    return s;
}

// "PATTERN=TYPE"; the last '=' splits, so a pattern may itself contain '='.
TypeOverride parse_override(const std::string& spec) {
    const size_t eq = spec.rfind('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
        throw UsageError("--tensor-type " + spec + ": expected PATTERN=TYPE, e.g. attn_v=q8_0");
    const std::string type_name_s = spec.substr(eq + 1);
    const std::optional<GgmlType> t = type_from_name(type_name_s);
    if (!t || !type_info(*t).can_quantize || *t == GgmlType::Q8_1 || *t == GgmlType::Q8_K)
        throw UsageError("--tensor-type " + spec + ": unknown tensor format '" + type_name_s +
                         "' (choices: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k, q6_k, "
                         "iq4_nl, iq4_xs, mxfp4, f8_e4m3)");
    return {spec.substr(0, eq), *t};
}

std::string shape_of(const PlannedTensor& t) {
    std::string s = "[";
    for (int d = 0; d < std::max(1, t.n_dims); ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
    return s + "]";
}

nlohmann::json plan_json(const QuantPlan& plan) {
    nlohmann::json arr = nlohmann::json::array();
    for (const PlannedTensor& t : plan.tensors) {
        nlohmann::json j = {{"name", t.name}, {"shape", nlohmann::json::array()}, {"from", type_name(t.from)},
                            {"to", type_name(t.to)}, {"bytes", t.n_bytes()}};
        for (int d = 0; d < std::max(1, t.n_dims); ++d) j["shape"].push_back(t.ne[d]);
        if (!t.reason.empty()) j["reason"] = t.reason;
        if (!t.fallback.empty()) j["fallback"] = t.fallback;
        arr.push_back(std::move(j));
    }
    return arr;
}

void print_plan(const QuantPlan& plan) {
    size_t w = 4;
    for (const PlannedTensor& t : plan.tensors) w = std::max(w, t.name.size());
    for (const PlannedTensor& t : plan.tensors) {
        std::string line = t.name + std::string(w + 2 - t.name.size(), ' ');
        std::string shape = shape_of(t);
        line += shape + std::string(shape.size() < 16 ? 16 - shape.size() : 1, ' ');
        std::string conv = std::string(type_name(t.from)) + (t.converted() ? " -> " + std::string(type_name(t.to)) : "");
        line += conv;
        std::string note = t.fallback.empty() ? t.reason : (t.reason.empty() ? t.fallback : t.reason + "; " + t.fallback);
        if (!note.empty()) line += std::string(conv.size() < 18 ? 18 - conv.size() : 1, ' ') + "(" + note + ")";
        std::cout << line << "\n";
    }
}

void check_paths(const QuantizeArgs& a) {
    struct stat si {}, so {};
    if (stat(a.in.c_str(), &si) != 0)
        throw InputError(a.in + ": cannot open the input model: " + std::strerror(errno));
    if (stat(a.out.c_str(), &so) == 0) {
        if (si.st_dev == so.st_dev && si.st_ino == so.st_ino)
            throw UsageError(a.out + ": is the input file itself; quantize writes a new file (choose another OUT)");
    }
    // A symlink, directory, device node or FIFO at OUT is refused even with --force, never replaced.
    check_write_target(a.out);
    if (::lstat(a.out.c_str(), &so) == 0 && !a.force)
        throw UsageError(a.out + ": already exists (use --force to overwrite it)");
    // Before the model is read: a typo in OUT's directory should not cost a whole conversion.
    const std::filesystem::path parent = std::filesystem::path(a.out).parent_path();
    std::error_code ec;
    if (!parent.empty() && !std::filesystem::is_directory(parent, ec))
        throw UsageError(a.out + ": the directory " + parent.string() + " does not exist (create it first)");
}

// --calibrate: run the input model over the text (at most 64 chunks of up to 512 tokens) and
// collect each matrix's mean squared input per column (engine/quantize/calibration.h), on two disjoint
// halves of the text for the held-out check and on all of it; with fit_moments also the second moments
// the error-compensating quantizer needs.
SplitImportance calibrate(const QuantizeArgs& a, int n_threads, bool fit_moments) {
    const std::string text = read_input_file(a.calibrate, "the calibration text (--calibrate)", kMaxTextFileBytes);
    Calibration c = calibrate_model(a.in, text, a.calibrate, n_threads, fit_moments);
    const SplitImportance& im = c.importance;
    std::fprintf(stderr, "tern: quantize: --calibrate: %lld tokens in chunks of %d (%lld to fit, %lld to check), %s\n",
                 static_cast<long long>(im.all.tokens), c.n_ctx, static_cast<long long>(im.fit.tokens),
                 static_cast<long long>(im.check.tokens), format_duration(c.seconds).c_str());
    return std::move(c.importance);
}

// A write's progress on the terminal: "quantizing q4_0 blk.0.attn_q.weight [####  ]".
class ProgressLine final : public QuantizeProgress {
public:
    ProgressLine(std::string prefix, uint64_t total) : prefix_(std::move(prefix)), bar_(prefix_, total) {}
    void tensor(const std::string& name) override { bar_.set_label(prefix_ + " " + name); }
    void update(uint64_t elements_done) override { bar_.update(elements_done); }

private:
    std::string prefix_;
    ProgressBar bar_;
};

int run_quantize(QuantizeArgs& a) {
    const std::optional<QuantFtype> ftype = ftype_from_name(a.type);
    if (!ftype) throw UsageError("--type " + a.type + ": unknown type (choices: " + join_names(ftype_names()) + ")");
    if (a.threads < 0) throw UsageError("--threads: must be > 0 (or 0 for the number of physical cores)");
    PlanOptions po;
    po.ftype = *ftype;
    po.pure = a.pure;
    for (const std::string& s : a.tensor_types) po.overrides.push_back(parse_override(s));
    if (!a.dry_run) {
        if (a.out.empty()) throw UsageError("quantize: no output file (give IN.gguf OUT.gguf, or --dry-run)");
        check_paths(a);
    }
    const int n_threads = resolve_threads(a.threads);

    const auto t0 = std::chrono::steady_clock::now();
    const GgufFile in = GgufFile::open(a.in);
    const QuantizeJob job = plan_quantize(in, po);
    const QuantPlan& plan = job.plan;
    if (!job.requantized.empty()) {
        std::string kinds;
        for (const std::string& k : job.requantized) kinds += (kinds.empty() ? "" : ", ") + k;
        std::cerr << "tern: quantize: warning: " << a.in << " holds already-quantized tensors (" << kinds
                  << "); requantizing them adds error on top of error (quantize from the F16/F32 original if you can)\n";
    }
    for (const std::string& note : plan.fallback_notes) {
        size_t n = 0;
        for (const PlannedTensor& t : plan.tensors) n += t.fallback == note;
        std::cerr << "tern: quantize: width fallback " << note << " (" << n << (n == 1 ? " tensor)\n" : " tensors)\n");
    }

    const QuantizeSizes& sizes = job.sizes;
    const FtypeInfo& fi = ftype_info(*ftype);
    if (a.dry_run) {
        const uint64_t est = job.estimated_file_size;
        if (a.json) {
            nlohmann::json j = {{"input", a.in}, {"type", fi.name}, {"file_type", fi.file_type},
                                {"dry_run", true}, {"input_bytes", in.file_size()}, {"output_bytes_estimate", est},
                                {"input_bpw", sizes.in_bpw()}, {"output_bpw", sizes.out_bpw()},
                                {"fallbacks", plan.fallback_notes}, {"tensors", plan_json(plan)}};
            std::cout << j.dump(1) << "\n";
        } else {
            print_plan(plan);
            std::printf("size: %s (%.2f bpw) -> about %s (%.2f bpw), %zu tensors\n",
                        format_bytes(in.file_size()).c_str(), sizes.in_bpw(), format_bytes(est).c_str(),
                        sizes.out_bpw(), plan.tensors.size());
        }
        return 0;
    }

    std::optional<SplitImportance> imatrix;
    if (!a.calibrate.empty()) imatrix = calibrate(a, n_threads, job.wants_moments());

    InterruptGuard guard;
    // The held-out check opens the candidate files as models: a memory shortfall there is worded here.
    const QuantizeOutcome outcome = with_flag_words([&] {
        return write_quantized(
            in, job, a.out, imatrix ? &*imatrix : nullptr, n_threads, guard.flag(), [&](QuantizePass pass) {
                const char* what = pass == QuantizePass::check ? "checking" : "quantizing";
                return std::make_unique<ProgressLine>(what + std::string(" ") + std::string(fi.name), sizes.elements);
            });
    });
    const std::optional<HeldOutCheck>& model_check = outcome.model_check;
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t out_size = std::filesystem::file_size(a.out);
    const size_t n_converted = job.n_converted();

    std::fprintf(stderr, "tern: quantize: %s -> %s (%s): %s (%.2f bpw) -> %s (%.2f bpw), %zu of %zu tensors converted, "
                         "%s with %d threads\n",
                 a.in.c_str(), a.out.c_str(), std::string(fi.name).c_str(), format_bytes(in.file_size()).c_str(),
                 sizes.in_bpw(), format_bytes(out_size).c_str(), sizes.out_bpw(), n_converted, plan.tensors.size(),
                 format_duration(secs).c_str(), n_threads);
    if (!a.calibrate.empty()) {
        std::fprintf(stderr,
                     "tern: quantize: --calibrate: %zu of %zu tensors had the smaller output error with the calibration "
                     "(importance weights or error compensation) on the held-out half\n",
                     outcome.n_selected, outcome.n_candidates);
        if (model_check)
            std::fprintf(stderr,
                         "tern: quantize: --calibrate: held-out NLL (%lld tokens scored) %.6f weighted vs %.6f reference: "
                         "%s\n",
                         static_cast<long long>(model_check->tokens_scored), model_check->nll_calibrated,
                         model_check->nll_reference,
                         model_check->calibrated_wins() ? "kept the weighted tensors (fitted on the whole text)"
                                                        : "wrote the reference quantization (calibration did not help)");
    }
    if (a.json) {
        nlohmann::json j = {{"input", a.in}, {"output", a.out}, {"calibrated_tensors", outcome.n_weighted}, {"calibration_candidates", outcome.n_candidates}, {"calibration_selected", outcome.n_selected}, {"type", fi.name}, {"file_type", fi.file_type},
                            {"input_bytes", in.file_size()}, {"output_bytes", out_size},
                            {"input_bpw", sizes.in_bpw()}, {"output_bpw", sizes.out_bpw()},
                            {"n_tensors", plan.tensors.size()}, {"n_converted", n_converted},
                            {"requantized", !job.requantized.empty()}, {"threads", n_threads}, {"seconds", secs},
                            {"fallbacks", plan.fallback_notes}, {"tensors", plan_json(plan)}};
        if (model_check)
            j["calibration_check"] = {{"nll_calibrated", model_check->nll_calibrated},
                                      {"nll_reference", model_check->nll_reference},
                                      {"tokens_scored", model_check->tokens_scored},
                                      {"kept", model_check->calibrated_wins()}};
        std::cout << j.dump() << "\n";
    }
    return 0;
}

} // namespace

Command add_quantize_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("quantize", "convert a GGUF model to another format (llama-quantize's mixtures)");
    auto a = std::make_shared<QuantizeArgs>();
    cmd->add_option("IN", a->in, "input GGUF model (any format tern reads)")->required();
    cmd->add_option("OUT", a->out, "output GGUF file (written to a temporary file beside it, then renamed)");
    cmd->add_option("--type", a->type, "output type: " + join_names(ftype_names()))->required();
    cmd->add_option("-t,--threads", a->threads, "threads (default: physical cores)")
        ->check(integer_in_range(0, max_threads(), "0 = one per physical core"));
    cmd->add_flag("--force", a->force, "overwrite an existing OUT");
    cmd->add_flag("--json", a->json, "print a JSON summary (or, with --dry-run, the plan) on stdout");
    cmd->add_flag("--dry-run", a->dry_run, "print the per-tensor plan and the resulting size; write nothing");
    cmd->add_flag("--pure", a->pure, "no mixture: the type's default format for every quantizable tensor");
    cmd->add_option("--tensor-type", a->tensor_types,
                    "PATTERN=TYPE: tensors whose name matches the regex PATTERN get tensor format TYPE (repeatable; "
                    "the first match wins)");
    cmd->add_option("--calibrate", a->calibrate,
                    "TEXT file: run the model on it and weight q2_K/q3_K/q4_0 quantization by each column's activations, "
                    "and round f8_e4m3 with error compensation, where that wins on a held-out half of the text");
    return {cmd, [a] { return run_quantize(*a); }};
}

} // namespace tern::app
