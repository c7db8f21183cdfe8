// `tern info MODEL [--tensors] [--json] [--check]`: what a GGUF file holds. A file `tern run` would open is
// checked as `run` checks it (the same functions); --check also decodes every tensor's values.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "app/commands.h"
#include "app/console.h"
#include "app/model_summary.h"
#include "base/error.h"
#include "base/terminal_text.h"
#include "engine/model.h"
#include "engine/tensor_scan.h"
#include "engine/text/tokenizer.h"
#include "kernels/cpu_features.h"

namespace tern::app {
namespace {

struct InfoArgs {
    std::string model;
    bool tensors = false;
    bool json = false;
    bool check = false;
};

std::string human_bytes(uint64_t n) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(n);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    char buf[32];
    std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
    return buf;
}

std::string human_count(uint64_t n) {
    char buf[32];
    if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2fB", n / 1e9);
    else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.2fM", n / 1e6);
    else if (n >= 1000ull) std::snprintf(buf, sizeof buf, "%.1fK", n / 1e3);
    else std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(n));
    return buf;
}

// Every string below comes from the file (or its name) and goes to a terminal: terminal_safe()
// shows an escape sequence planted in general.name as text instead of running it. --json escapes
// on its own.
void print_text(const GgufFile& file, const ModelSummary& s, bool with_tensors, const TensorScan* scan) {
    const auto safe = [](const std::string& text) { return terminal_safe(text); };
    std::cout << "file:            " << safe(file.path()) << "\n";
    std::cout << "gguf version:    " << file.version() << " (" << file.metadata().size() << " metadata keys, "
              << file.tensors().size() << " tensors, alignment " << file.alignment() << ")\n";
    std::cout << "file size:       " << human_bytes(file.file_size()) << " (" << file.file_size() << " bytes)\n";
    std::cout << "name:            " << (s.name.empty() ? "-" : safe(s.name)) << "\n";
    std::cout << "architecture:    " << (s.architecture.empty() ? "-" : safe(s.architecture))
              << (s.architecture_supported ? "" : "  (not supported by tern run)") << "\n";
    if (s.n_layers > 0) {
        std::cout << "shape:           " << s.n_layers << " layers, dim " << s.dim << ", ffn " << s.ffn_dim << ", "
                  << s.n_heads << " heads / " << s.n_kv_heads << " kv heads, head dim " << s.head_dim << "\n";
    }
    if (s.head_dim_swa > 0 || s.shared_kv_layers > 0 || s.per_layer_dim > 0)
        std::cout << "layers:          sliding-window head dim " << (s.head_dim_swa > 0 ? s.head_dim_swa : s.head_dim)
                  << ", " << s.shared_kv_layers << " layers on shared KV, per-layer embedding width "
                  << s.per_layer_dim << "\n";
    std::cout << "parameters:      " << human_count(s.n_params) << " (" << s.n_params << ")\n";
    if (s.n_expert > 0) {
        std::cout << "experts:         " << s.n_expert << ", " << s.n_expert_used << " used per token, expert ffn "
                  << s.expert_ffn_dim << "\n";
        if (s.n_expert_shared > 0 || s.n_dense_lead > 0)
            std::cout << "shared experts:  " << s.n_expert_shared << "; leading dense layers: " << s.n_dense_lead
                      << "\n";
        std::cout << "active params:   " << human_count(s.n_active_params) << " (" << s.n_active_params
                  << ") per token\n";
    }
    if (s.n_nextn > 0)
        std::cout << "nextn layers:    " << s.n_nextn << " next-token-prediction (loaded, not run)\n";
    std::cout << "context length:  " << (s.context_length > 0 ? std::to_string(s.context_length) : "-") << "\n";
    std::cout << "file type:       " << (s.file_type.empty() ? "-" : s.file_type) << "\n";
    std::cout << "formats:        ";
    for (const FormatUse& f : s.formats)
        std::cout << " " << f.name << " x" << f.n_tensors << " (" << human_bytes(f.n_bytes) << ")";
    if (s.formats.empty()) std::cout << " - (no tensors: vocabulary-only file)";
    std::cout << "\n";
    if (s.n_params > 0) std::printf("bits per weight: %.2f\n", s.bits_per_weight);
    std::cout << "tokenizer:       "
              << (s.tokenizer_model.empty()
                      ? "-"
                      : safe(s.tokenizer_model) + (s.tokenizer_pre.empty() ? "" : " / " + safe(s.tokenizer_pre)))
              << ", " << s.vocab_size << " tokens";
    if (s.bos >= 0) std::cout << ", bos " << s.bos;
    if (s.eos >= 0) std::cout << ", eos " << s.eos;
    std::cout << "\n";
    std::cout << "chat template:   " << s.chat_template << "\n";
    if (scan)
        std::cout << "check:           passed: " << scan->tensors_checked << " tensors, every value finite"
                  << (scan->skipped.empty()
                          ? ""
                          : " (" + std::to_string(scan->skipped.size()) + " in formats tern cannot decode not checked)")
                  << "\n";
    if (!with_tensors) return;
    std::cout << "\n";
    for (const GgufTensor& t : file.tensors()) {
        std::printf("%-40s %-8s %-24s %12llu bytes at %llu\n", safe(t.name).c_str(), std::string(type_name(t.type)).c_str(),
                    t.shape_string().c_str(), static_cast<unsigned long long>(t.n_bytes),
                    static_cast<unsigned long long>(file.data_offset() + t.offset));
    }
}

void print_json(const GgufFile& file, const ModelSummary& s, bool with_tensors, const TensorScan* scan) {
    nlohmann::ordered_json j;
    j["file"] = file.path();
    j["gguf_version"] = file.version();
    j["file_size"] = file.file_size();
    j["name"] = s.name;
    j["architecture"] = s.architecture;
    j["architecture_supported"] = s.architecture_supported;
    j["n_layers"] = s.n_layers;
    j["dim"] = s.dim;
    j["ffn_dim"] = s.ffn_dim;
    j["n_heads"] = s.n_heads;
    j["n_kv_heads"] = s.n_kv_heads;
    j["head_dim"] = s.head_dim;
    if (s.head_dim_swa > 0) j["head_dim_swa"] = s.head_dim_swa;
    if (s.shared_kv_layers > 0) j["shared_kv_layers"] = s.shared_kv_layers;
    if (s.per_layer_dim > 0) j["per_layer_dim"] = s.per_layer_dim;
    j["n_params"] = s.n_params;
    if (s.n_expert > 0) {
        j["n_expert"] = s.n_expert;
        j["n_expert_used"] = s.n_expert_used;
        j["expert_ffn_dim"] = s.expert_ffn_dim;
        j["n_active_params"] = s.n_active_params;
        if (s.n_expert_shared > 0) j["n_expert_shared"] = s.n_expert_shared;
        if (s.n_dense_lead > 0) j["n_dense_lead"] = s.n_dense_lead;
    }
    if (s.n_nextn > 0) j["n_nextn_layers"] = s.n_nextn;
    j["context_length"] = s.context_length;
    j["file_type"] = s.file_type;
    j["bits_per_weight"] = s.bits_per_weight;
    nlohmann::ordered_json formats = nlohmann::ordered_json::object();
    for (const FormatUse& f : s.formats) formats[f.name] = {{"tensors", f.n_tensors}, {"bytes", f.n_bytes}};
    j["formats"] = formats;
    j["tokenizer"] = {{"model", s.tokenizer_model}, {"pre", s.tokenizer_pre}, {"vocab_size", s.vocab_size},
                      {"bos", s.bos}, {"eos", s.eos}};
    j["chat_template"] = s.chat_template;
    j["n_metadata"] = file.metadata().size();
    j["n_tensors"] = file.tensors().size();
    if (scan)
        j["check"] = {{"passed", scan->passed()},
                      {"tensors_checked", scan->tensors_checked},
                      {"bytes_checked", scan->bytes_checked},
                      {"not_checked", scan->skipped}};
    if (with_tensors) {
        nlohmann::ordered_json ts = nlohmann::ordered_json::array();
        for (const GgufTensor& t : file.tensors()) {
            nlohmann::ordered_json ne = nlohmann::ordered_json::array();
            for (int d = 0; d < t.n_dims; ++d) ne.push_back(t.ne[d]);
            ts.push_back({{"name", t.name}, {"type", type_name(t.type)}, {"ne", ne}, {"bytes", t.n_bytes},
                          {"offset", file.data_offset() + t.offset}});
        }
        j["tensors"] = ts;
    }
    std::cout << j.dump(1) << "\n";
}

// What `tern run` checks when it opens a model (engine/model.h's loading checks and the tokenizer), for a file
// it would open: one with tensors and a supported architecture. Others are described as they are.
void check_as_run_would(const GgufFile& file, const ModelSummary& s) {
    if (!s.architecture_supported || file.tensors().empty()) return;
    check_model_file(file);
    Tokenizer::from_gguf(file);
}

// Every tensor's values, with a progress bar on a terminal and a summary line on stderr; a bad block is the
// command's one error line (exit 2).
TensorScan check_values(const GgufFile& file) {
    const auto t0 = std::chrono::steady_clock::now();
    ProgressBar bar("check", 1000); // in thousandths of the bytes to decode
    TensorScan scan = scan_tensor_values(file, resolve_threads(0), [&bar](uint64_t done, uint64_t total) {
        bar.update(total ? done * 1000 / total : 1000);
    });
    bar.finish();
    if (scan.bad) throw InputError(describe_bad_tensor(file, *scan.bad));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << "tern info: checked " << scan.tensors_checked << " tensors (" << format_bytes(scan.bytes_checked)
              << ") in " << format_duration(seconds) << ": every value finite";
    if (!scan.skipped.empty())
        std::cerr << "; not checked, in formats tern cannot decode: "
                  << (scan.skipped.size() == 1 ? "" : std::to_string(scan.skipped.size()) + " tensors, the first ")
                  << terminal_safe(scan.skipped.front());
    std::cerr << "\n";
    return scan;
}

} // namespace

Command add_info_command(CLI::App& root) {
    auto* cmd = root.add_subcommand("info", "architecture, sizes, formats, tokenizer and chat template of a model");
    auto args = std::make_shared<InfoArgs>();
    cmd->add_option("model", args->model, "GGUF file")->required();
    cmd->add_flag("--tensors", args->tensors, "also list every tensor: name, format, shape, bytes, offset");
    cmd->add_flag("--json", args->json, "print one JSON document instead of text");
    cmd->add_flag("--check", args->check,
                  "also decode every tensor's values: the first NaN, inf or invalid block (e.g. an MXFP4 scale of "
                  "0xff) is an error naming the tensor and block (exit 2)");
    return {cmd, [args] {
                const GgufFile file = GgufFile::open(args->model);
                const ModelSummary summary = summarize_model(file);
                check_as_run_would(file, summary);
                std::optional<TensorScan> scan;
                if (args->check) scan = check_values(file);
                const TensorScan* checked = scan ? &*scan : nullptr;
                if (args->json)
                    print_json(file, summary, args->tensors, checked);
                else
                    print_text(file, summary, args->tensors, checked);
                std::cout.flush();
                return 0;
            }};
}

} // namespace tern::app
