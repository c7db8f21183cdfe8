// tern bench (-m MODEL | --synthetic SHAPE:TYPE) [-p 512] [-n 128] [-r 5] [--depth D] [--json]
// (../shared/CLI.md): prefill and decode speed on pseudo-random tokens (engine/tools/bench.h), the bytes a
// decoded token reads, and that traffic against the read bandwidth this machine measures for the
// same thread count (kernels/cpu/membw.h). stdout: a small table, or one JSON object.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/console.h"
#include "app/model_summary.h"
#include "engine/backend.h"
#include "engine/backend_factory.h"
#include "engine/tools/bench.h"
#include "engine/model.h"
#include "engine/tools/synth.h"
#include "formats/atomic_file.h"
#include "base/error.h"
#include "kernels/cpu/membw.h"
#include "quant/plan.h"
#include "kernels/cpu_features.h"
#include "kernels/gpu_info.h"

namespace tern::app {

namespace {

struct BenchArgs {
    ModelOptions model;
    std::string synthetic;   // SHAPE:TYPE
    BenchOptions bench;
    double peak_gbps = 0;    // 0: measure
    bool json = false;
};

std::string cpu_model_name() {
    std::ifstream f("/proc/cpuinfo");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("model name", 0) == 0) {
            const size_t colon = line.find(':');
            if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
        }
    return "unknown CPU";
}

// The file's declared type (general.file_type), else the format holding the most bytes.
std::string model_format(const GgufFile& file) {
    const ModelSummary s = summarize_model(file);
    if (!s.file_type.empty()) return s.file_type;
    return s.formats.empty() ? "unknown" : s.formats.front().name;
}

// --synthetic: the model is written to a file under $TMPDIR (default /tmp) that is unlinked as soon as it
// is mapped, so it never outlives the process. While it is being written (the only window in which it
// has a name), SIGINT, SIGTERM, SIGHUP and SIGQUIT unlink it -- and the writer's temporary file --
// before the process ends (formats/atomic_file.h).
namespace synth_file {

// Owns the temporary name from creation to unlink.
class Guard {
public:
    Guard() {
        const char* dir = std::getenv("TMPDIR");
        std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/tern-bench-synth-XXXXXX.gguf";
        std::vector<char> name(pattern.begin(), pattern.end());
        name.push_back('\0');
        const int fd = mkstemps(name.data(), 5);
        if (fd < 0) {
            const std::string why = std::strerror(errno);
            throw RuntimeFailure(pattern + ": cannot create the temporary model for --synthetic: " + why +
                                 " (set TMPDIR to a writable directory)");
        }
        close(fd);
        path_ = name.data();
        registered_ = std::make_unique<TemporaryFileName>(path_);
    }
    ~Guard() { release(); }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    const std::string& path() const { return path_; }
    // Removes the name (the mapping, if any, stays valid).
    void release() {
        if (path_.empty()) return;
        registered_.reset();
        unlink(path_.c_str());
        path_.clear();
    }

private:
    std::string path_;
    std::unique_ptr<TemporaryFileName> registered_;
};

} // namespace synth_file

// "llama-1b:q4_0" -> a mapped random-weight model whose file is already gone.
Model load_synthetic(const std::string& spec, int threads) {
    const size_t colon = spec.rfind(':');
    std::string shapes, types;
    for (const std::string& n : synth_shape_names()) shapes += (shapes.empty() ? "" : ", ") + n;
    for (std::string_view n : ftype_names()) types += (types.empty() ? "" : ", ") + std::string(n);
    if (colon == std::string::npos || colon == 0 || colon + 1 == spec.size())
        throw UsageError("--synthetic " + spec + ": expected SHAPE:TYPE, e.g. llama-1b:q4_0 (shapes: " + shapes + ")");
    SynthOptions o;
    o.shape = spec.substr(0, colon);
    o.type = spec.substr(colon + 1);
    const std::vector<std::string> names = synth_shape_names();
    if (std::find(names.begin(), names.end(), o.shape) == names.end())
        throw UsageError("--synthetic " + spec + ": unknown shape '" + o.shape + "' (shapes: " + shapes + ")");
    if (!ftype_from_name(o.type))
        throw UsageError("--synthetic " + spec + ": unknown type '" + o.type + "' (types: " + types + ")");
    o.n_threads = threads;
    synth_file::Guard file;
    std::cerr << "tern: bench: writing the random-weight " << o.shape << " " << o.type << " model to " << file.path()
              << " (removed once mapped)\n";
    write_synth_model(o, file.path());
    Model model = load_model(file.path());
    file.release();
    return model;
}

double share_of(double gbps, double peak) { return peak > 0 ? gbps / peak : 0.0; }

// Whether decode steps replay CUDA graphs (engine/backend_factory.cpp reads the same variable).
bool cuda_graphs_on() {
    const char* v = std::getenv("TERN_CUDA_GRAPHS");
    return v == nullptr || std::string_view(v) != "0";
}

// The prefill GEMM TERN_CUDA_PREFILL forces (engine/backend_factory.cpp reads the same variable), "auto" when unset:
// the path a format that allows it takes; the others keep the automatic choice.
std::string cuda_prefill_knob() {
    const char* v = std::getenv("TERN_CUDA_PREFILL");
    return v && *v ? std::string(v) : std::string("auto");
}

// Whether the forward's kernels may go out as programmatic dependent launches (TERN_CUDA_PDL, read by
// engine/backend_factory.cpp too; the backend uses them on compute capability 9.0+ only).
bool cuda_pdl_on() {
    const char* v = std::getenv("TERN_CUDA_PDL");
    return v == nullptr || std::string_view(v) != "0";
}

// One verification forward's time over one decode step's (the median decode over its tokens).
double verify_cost_ratio(const BenchOptions& o, const BenchResult& r) {
    return r.decode_ms_median > 0 && o.n_gen > 0 ? r.verify_ms_median / (r.decode_ms_median / o.n_gen) : 0.0;
}

void print_table(const BenchArgs& a, const std::string& model_label, const std::string& format, uint64_t file_bytes,
                 const std::string& device, int threads, const BenchResult& r, double bytes_per_token,
                 double decode_gbps, double peak, const std::string& peak_method) {
    std::printf("model    %s (%s, %s)\n", model_label.c_str(), format.c_str(), format_bytes(file_bytes).c_str());
    std::printf("device   %s, %d thread%s (%s), KV %s, depth %d\n", device.c_str(), threads, threads == 1 ? "" : "s",
                cpu_model_name().c_str(), a.model.kv_type.c_str(), a.bench.depth);
    std::printf("\n%-8s %7s %12s %10s %9s %7s\n", "test", "tokens", "median ms", "tok/s", "GB/s", "peak");
    if (a.bench.n_prompt > 0)
        std::printf("%-8s %7d %12.2f %10.2f %9s %7s\n", "prefill", a.bench.n_prompt, r.prefill_ms_median, r.prefill_tps,
                    "-", "-");
    if (a.bench.n_gen > 0) {
        char share[16] = "-";
        if (peak > 0) std::snprintf(share, sizeof share, "%.0f%%", 100.0 * share_of(decode_gbps, peak));
        std::printf("%-8s %7d %12.2f %10.2f %9.2f %7s\n", "decode", a.bench.n_gen, r.decode_ms_median, r.decode_tps,
                    decode_gbps, share);
    }
    if (a.bench.n_verify > 0) {
        std::printf("%-8s %7d %12.2f %10s %9s %7s\n", "verify", a.bench.n_verify, r.verify_ms_median, "-", "-", "-");
        if (r.decode_ms_median > 0)
            std::printf("verifying %d tokens costs %.2fx one decode step\n", a.bench.n_verify,
                        verify_cost_ratio(a.bench, r));
    }
    std::printf("\nmedian of %d runs after a warm-up; decode reads %s per token (weights + KV)\n", a.bench.repetitions,
                format_bytes(static_cast<uint64_t>(bytes_per_token)).c_str());
    if (peak > 0)
        std::printf("peak read bandwidth %.2f GB/s (%s)\n", peak, peak_method.c_str());
}

int run_bench_command(BenchArgs& a) {
    // Flag errors before any model is opened or written.
    if (a.model.model.empty() == a.synthetic.empty())
        throw UsageError("bench: give exactly one of -m/--model and --synthetic SHAPE:TYPE");
    if (a.model.threads < 0) throw UsageError("--threads: must be > 0 (or 0 for the number of physical cores)");
    if (a.model.ctx_size < 0) throw UsageError("--ctx-size: must be > 0 (or 0 for what the benchmark needs)");
    if (a.bench.n_prompt < 0) throw UsageError("-p/--n-prompt: must be >= 0");
    if (a.bench.n_gen < 0) throw UsageError("-n/--n-gen: must be >= 0");
    if (a.bench.n_prompt == 0 && a.bench.n_gen == 0) throw UsageError("-p/-n: nothing to measure (both are 0)");
    if (a.bench.repetitions < 1) throw UsageError("-r/--repetitions: must be >= 1");
    if (a.bench.depth < 0) throw UsageError("--depth: must be >= 0");
    if (a.bench.n_verify < 0) throw UsageError("--verify: must be >= 0 (0 = skip)");
    if (a.peak_gbps < 0) throw UsageError("--peak-gbps: must be > 0 (or 0 to measure it)");

    // bench sizes its own context (what the runs need, or -c when larger): never the automatic one.
    OpenRequest request = open_request(a.model);
    request.n_ctx = std::max(a.model.ctx_size, bench_context_size(a.bench));
    request.on_context = nullptr;
    if (!a.synthetic.empty()) request.open_file = [&] { return load_synthetic(a.synthetic, a.model.threads); };
    const std::string model_label = a.synthetic.empty() ? a.model.model : "synthetic " + a.synthetic;
    OpenedModel opened = open_model_for(request);
    const Model& model = *opened.model;
    Backend* backend = opened.backend.get();
    const KvType kv_type = request.kv_type;
    const std::string device = backend->device_name();
    const bool on_cpu = backend->device_kind() == DeviceKind::cpu;
    const int threads = resolve_threads(a.model.threads);

    a.bench.model_path = model_label;
    ProgressBar bar("bench", static_cast<uint64_t>(a.bench.repetitions + 1));
    a.bench.progress = [&](int run_index, int) { bar.update(static_cast<uint64_t>(run_index + 1)); };
    const BenchResult r = run_bench(*backend, model.config.vocab, a.bench);
    bar.finish();

    const double bytes_per_token =
        a.bench.n_gen > 0 ? decode_bytes_per_token(model.weights, model.config, kv_type, a.bench.depth, a.bench.n_gen)
                          : static_cast<double>(weight_bytes_per_token(model.weights, model.config));
    const double decode_gbps = bytes_per_token * r.decode_tps / 1e9;

    // The device's ceiling, measured after the timed runs so its buffers never compete with them: the
    // CPU's read bandwidth, or the GPU's copy bandwidth.
    double peak = a.peak_gbps;
    std::string peak_method = peak > 0 ? "given (--peak-gbps)" : "";
    double plain_peak = 0;   // the plain loop's best (STREAM's number), beside the peak of the faster loop
    if (peak == 0 && on_cpu) {
        const ReadBandwidth bw = measure_read_bandwidth(threads);
        peak = bw.best_gbps;
        plain_peak = bw.plain_best_gbps;
        peak_method = bw.method;
    } else if (peak == 0 && backend->device_kind() == DeviceKind::cuda) {
        peak = measure_cuda_copy_gbps(parse_device(device) ? parse_device(device)->index : 0, &peak_method);
    }

    const std::string format = model_format(model.file);
    if (a.json) {
        nlohmann::json j = {
            {"model", model_label},
            {"synthetic", a.synthetic.empty() ? nlohmann::json(nullptr) : nlohmann::json(a.synthetic)},
            {"format", format},
            {"model_bytes", model.file.file_size()},
            {"device", device},
            {"cpu", cpu_model_name()},
            {"threads", threads},
            {"kv_type", a.model.kv_type},
            {"depth", a.bench.depth},
            {"repetitions", a.bench.repetitions},
            {"prefill_tokens", a.bench.n_prompt},
            {"prefill_tps", r.prefill_tps},
            {"prefill_ms_median", r.prefill_ms_median},
            {"prefill_ms", r.prefill_ms},
            {"decode_tokens", a.bench.n_gen},
            {"decode_tps", r.decode_tps},
            {"decode_ms_median", r.decode_ms_median},
            {"decode_ms", r.decode_ms},
            {"verify_tokens", a.bench.n_verify},
            {"verify_ms_median", r.verify_ms_median},
            {"verify_ms", r.verify_ms},
            {"verify_vs_decode_step", verify_cost_ratio(a.bench, r)},
            {"cuda_graphs", backend->device_kind() == DeviceKind::cuda ? nlohmann::json(cuda_graphs_on())
                                                                        : nlohmann::json(nullptr)},
            {"cuda_prefill", backend->device_kind() == DeviceKind::cuda ? nlohmann::json(cuda_prefill_knob())
                                                                         : nlohmann::json(nullptr)},
            {"cuda_pdl", backend->device_kind() == DeviceKind::cuda ? nlohmann::json(cuda_pdl_on())
                                                                     : nlohmann::json(nullptr)},
            {"weight_bytes_per_token", weight_bytes_per_token(model.weights, model.config)},
            {"bytes_per_token", bytes_per_token},
            {"decode_gbps", decode_gbps},
            {"peak_gbps", peak > 0 ? nlohmann::json(peak) : nlohmann::json(nullptr)},
            {"peak_method", peak_method},
            {"plain_read_gbps", plain_peak > 0 ? nlohmann::json(plain_peak) : nlohmann::json(nullptr)},
            {"bandwidth_share", peak > 0 ? nlohmann::json(share_of(decode_gbps, peak)) : nlohmann::json(nullptr)},
        };
        std::cout << j.dump() << "\n";
    } else {
        print_table(a, model_label, format, model.file.file_size(), device, threads, r, bytes_per_token, decode_gbps,
                    peak, peak_method);
    }
    return 0;
}

} // namespace

Command add_bench_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("bench", "prefill/decode speed and memory bandwidth use (like llama-bench)");
    auto a = std::make_shared<BenchArgs>();
    add_model_options(*cmd, a->model);
    CLI::Option* model = cmd->get_option("--model");
    model->required(false);
    model->description("GGUF model file (or --synthetic)");
    cmd->get_option("--ctx-size")->description("KV positions to allocate (default: --depth + max(-p, -n))");
    cmd->add_option("--synthetic", a->synthetic, "bench a random-weight model of a named shape, e.g. llama-1b:q4_0")
        ->excludes(model);
    cmd->add_option("-p,--n-prompt", a->bench.n_prompt, "prefill tokens, one forward (default 512; 0 = skip)");
    cmd->add_option("-n,--n-gen", a->bench.n_gen, "decoded tokens, one forward each (default 128; 0 = skip)");
    cmd->add_option("-r,--repetitions", a->bench.repetitions, "timed runs after a warm-up; medians reported (default 5)");
    cmd->add_option("-d,--depth", a->bench.depth, "KV cache positions filled before measuring (default 0)");
    cmd->add_option("--verify", a->bench.n_verify,
                    "also time one forward of this many drafted tokens with every row's logits, as speculative "
                    "decoding verifies them, against one decode step (default 0 = skip)");
    cmd->add_option("--peak-gbps", a->peak_gbps, "peak read bandwidth to compare with (default: measure it)");
    cmd->add_flag("--json", a->json, "print one JSON object on stdout");
    return {cmd, [a] { return run_bench_command(*a); }};
}

} // namespace tern::app
