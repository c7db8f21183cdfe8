// tern quantize IN.gguf OUT.gguf --type TYPE (../shared/CLI.md): converts a model to another
// format with llama-quantize's type mixtures (quant/plan.h) and the reference quantizers
// (quant/reference.h), so the output is byte-identical to llama-quantize's for the standard types.
// Safety: OUT is written to a unique temporary file beside it and renamed (GgufWriter, AtomicFile);
// OUT == IN, an existing OUT without --force and an OUT that is not a regular file are refused; any
// error, Ctrl-C, SIGTERM or SIGHUP leaves no OUT and no temporary file.
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/console.h"
#include "app/signals.h"
#include "engine/tools/calibration.h"
#include "engine/model.h"
#include "engine/tools/perplexity.h"
#include "engine/text/tokenizer.h"
#include "formats/atomic_file.h"
#include "base/error.h"
#include "formats/input_file.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "kernels/cpu_features.h"
#include "quant/compensated.h"
#include "quant/imatrix.h"
#include "quant/imatrix_select.h"
#include "quant/plan.h"
#include "quant/reference.h"

namespace tern::app {

namespace {

// The writer removes its temporary file when the fill callback throws, so nothing is left behind.
constexpr const char* kInterrupted = "quantize: interrupted; OUT was not written and its temporary file was removed";

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
                         "iq4_nl, iq4_xs, f8_e4m3)");
    return {spec.substr(0, eq), *t};
}

// A head count stored as a scalar or as a per-layer array: the first layer's value (0 if absent).
int64_t first_int(const GgufFile& f, const std::string& key) {
    const GgufValue* v = f.find(key);
    if (!v) return 0;
    if (v->is_integer()) return f.get_int(key);
    if (v->type == GgufType::array && !v->array.empty() && v->array[0].is_integer()) return f.get_int_array(key)[0];
    return 0;
}

ModelFacts model_facts(const GgufFile& f) {
    ModelFacts m;
    m.arch = f.get_string("general.architecture", "");
    if (m.arch.empty()) return m;
    m.n_layer = first_int(f, m.arch + ".block_count");
    m.n_head = first_int(f, m.arch + ".attention.head_count");
    m.n_head_kv = first_int(f, m.arch + ".attention.head_count_kv");
    if (m.n_head_kv == 0) m.n_head_kv = m.n_head;
    return m;
}

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

std::string shape_of(const PlannedTensor& t) {
    std::string s = "[";
    for (int d = 0; d < std::max(1, t.n_dims); ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
    return s + "]";
}

struct Sizes {
    uint64_t in_bytes = 0, out_bytes = 0, elements = 0;
    double in_bpw() const { return elements ? 8.0 * double(in_bytes) / double(elements) : 0.0; }
    double out_bpw() const { return elements ? 8.0 * double(out_bytes) / double(elements) : 0.0; }
};

Sizes plan_sizes(const QuantPlan& plan, const GgufFile& in) {
    Sizes s;
    for (const PlannedTensor& t : plan.tensors) {
        s.in_bytes += in.tensors()[t.source_index].n_bytes;
        s.out_bytes += t.n_bytes();
        s.elements += static_cast<uint64_t>(t.n_elements());
    }
    return s;
}

// The output file's size: the input's header and metadata (two keys may be added), the tensor
// infos, and every tensor padded to 32 bytes. Exact up to the few bytes of the two keys.
uint64_t estimated_file_size(const QuantPlan& plan, const GgufFile& in) {
    uint64_t size = in.data_offset() + 2 * (8 + 32 + 4 + 4) + 32;
    for (const PlannedTensor& t : plan.tensors) size += (t.n_bytes() + 31) / 32 * 32;
    return size;
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

// What --calibrate gives one tensor's quantizer: nothing (the reference quantizer), an importance
// vector (quant/imatrix.h), or its input's second moments (quant/compensated.h).
struct TensorCalibration {
    const std::vector<float>* importance = nullptr;
    const std::vector<float>* moments = nullptr;
};

// Converts one tensor: rows are independent, so OpenMP over rows gives the same bytes for every
// thread count. Rows go in slabs so the progress bar and Ctrl-C are served between slabs.
void convert_tensor(const GgufTensor& src, const PlannedTensor& t, std::span<uint8_t> out, int n_threads,
                    const std::atomic<bool>* cancel, ProgressBar& bar, uint64_t& done_elems,
                    const TensorCalibration& cal) {
    if (!t.converted()) {
        std::memcpy(out.data(), src.data, src.n_bytes);
        done_elems += static_cast<uint64_t>(t.n_elements());
        bar.update(done_elems);
        return;
    }
    const int64_t width = t.ne[0], rows = src.n_rows();
    const size_t in_row = src.row_size(), out_row = row_bytes(t.to, width);
    const int64_t slab = std::max<int64_t>(int64_t{n_threads} * 4, std::min<int64_t>(rows, (1 << 22) / width + 1));
    std::optional<CompensationFactor> factor;
    if (cal.moments) factor = compensation_factor(cal.moments->data(), width);
    std::string error;
    for (int64_t r0 = 0; r0 < rows; r0 += slab) {
        if (cancel && cancel->load()) throw TernError(ExitCode::interrupted, kInterrupted);
        const int64_t r1 = std::min(rows, r0 + slab);
        const int nt = static_cast<int>(std::min<int64_t>(n_threads, r1 - r0));
#pragma omp parallel num_threads(nt)
        {
            std::vector<float> buf(static_cast<size_t>(width));
#pragma omp for schedule(dynamic, 4)
            for (int64_t r = r0; r < r1; ++r) {
                try {
                    dequantize_row(src.type, src.data + static_cast<size_t>(r) * in_row, buf.data(), width);
                    uint8_t* dst = out.data() + static_cast<size_t>(r) * out_row;
                    if (factor) quantize_row_compensated(t.to, buf.data(), dst, *factor);
                    else if (cal.importance) quantize_row_importance(t.to, buf.data(), dst, width, cal.importance->data());
                    else quantize_row(t.to, buf.data(), dst, width);
                } catch (const std::exception& e) {
#pragma omp critical(tern_quantize_error)
                    if (error.empty()) error = "tensor " + t.name + ", row " + std::to_string(r) + ": " + e.what();
                }
            }
        }
        if (!error.empty()) throw InputError(error);
        done_elems += static_cast<uint64_t>((r1 - r0) * width);
        bar.update(done_elems);
    }
}

// --calibrate: run the input model over the text (at most 64 chunks of up to 512 tokens) and
// collect each matrix's mean squared input per column (engine/tools/calibration.h), on two disjoint
// halves of the text for the held-out check (quant/imatrix_select.h) and on all of it; with
// fit_moments also the second moments the error-compensating quantizer needs.
SplitImportance calibrate(const QuantizeArgs& a, int n_threads, bool fit_moments) {
    const std::string text = read_input_file(a.calibrate, "the calibration text (--calibrate)", kMaxTextFileBytes);
    const Model model = load_model(a.in);
    const std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model.file);
    std::vector<int32_t> tokens = tok->encode(text, EncodeOptions{true, false});
    const int32_t n_ctx = model.config.n_ctx_train > 0 ? std::min(512, model.config.n_ctx_train) : 512;
    if (tokens.size() < 16) throw InputError(a.calibrate + ": the calibration text is too short (" +
                                             std::to_string(tokens.size()) + " tokens; give it a few thousand)");
    if (tokens.size() > static_cast<size_t>(64 * n_ctx)) tokens.resize(static_cast<size_t>(64 * n_ctx));
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t bos = tok->add_bos_token() ? tok->bos() : -1;
    SplitImportance im = collect_importance_split(model, tokens, n_ctx, bos, n_threads, fit_moments);
    im.bos = bos;
    // perplexity scores whole chunks and needs two of them: shorter ones when the half is short.
    im.check_n_ctx = std::max<int32_t>(4, std::min<int32_t>(n_ctx, static_cast<int32_t>(im.check_tokens.size() / 2)));
    std::fprintf(stderr, "tern: quantize: --calibrate: %lld tokens in chunks of %d (%lld to fit, %lld to check), %s\n",
                 static_cast<long long>(im.all.tokens), n_ctx, static_cast<long long>(im.fit.tokens),
                 static_cast<long long>(im.check.tokens),
                 format_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()).c_str());
    return im;
}

const std::vector<float>* find_importance(const ImportanceMatrix& im, const PlannedTensor& t) {
    const auto it = im.columns.find(t.name);
    if (it == im.columns.end() || static_cast<int64_t>(it->second.size()) != t.ne[0]) return nullptr;
    return &it->second;
}

const std::vector<float>* find_moments(const ImportanceMatrix& im, const PlannedTensor& t) {
    const std::vector<float>* m = im.moments_of(t.name);
    return m && static_cast<int64_t>(m->size()) == t.ne[0] * t.ne[0] ? m : nullptr;
}

// The held-out check of one tensor: does quantizing with what the fit half measured (importance
// weights, or the error-compensating factor) give a smaller output error on the check half's
// activations than the reference quantizer? score_row(row) gives both errors of one row. Per-row sums
// are added in row order, so the decision is the same for every thread count.
template <class ScoreRow>
bool calibration_wins_held_out(const GgufTensor& src, const PlannedTensor& t, int n_threads, const ScoreRow& score_row) {
    const int64_t width = t.ne[0], rows = src.n_rows();
    const size_t in_row = src.row_size();
    std::vector<HeldOutErrors> per_row(static_cast<size_t>(rows));
    std::string error;
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(n_threads, rows)))
    {
        std::vector<float> buf(static_cast<size_t>(width));
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < rows; ++r) {
            try {
                dequantize_row(src.type, src.data + static_cast<size_t>(r) * in_row, buf.data(), width);
                per_row[static_cast<size_t>(r)] = score_row(buf.data());
            } catch (const std::exception& e) {
#pragma omp critical(tern_quantize_error)
                if (error.empty()) error = "tensor " + t.name + ", row " + std::to_string(r) + ": " + e.what();
            }
        }
    }
    if (!error.empty()) throw InputError(error);
    HeldOutErrors sum;
    for (const HeldOutErrors& e : per_row) sum += e;
    return sum.keep_weighted();
}

bool weighted_wins_held_out(const GgufTensor& src, const PlannedTensor& t, const std::vector<float>& fit,
                            const std::vector<float>& check, int n_threads) {
    return calibration_wins_held_out(src, t, n_threads, [&](const float* row) {
        return held_out_errors(t.to, row, t.ne[0], fit.data(), check.data());
    });
}

bool compensated_wins_held_out(const GgufTensor& src, const PlannedTensor& t, const std::vector<float>& fit_moments,
                               const std::vector<float>& check, int n_threads) {
    const CompensationFactor factor = compensation_factor(fit_moments.data(), t.ne[0]);
    return calibration_wins_held_out(src, t, n_threads, [&](const float* row) {
        return held_out_errors_compensated(t.to, row, factor, check.data());
    });
}

// Removes the temporary check files however the function leaves (error, Ctrl-C, or done).
// The check files of --calibrate: removed on every way out, signals included (TemporaryFileName).
struct RemoveOnExit {
    std::vector<std::string> paths;
    std::vector<std::unique_ptr<TemporaryFileName>> names;
    explicit RemoveOnExit(std::vector<std::string> p) : paths(std::move(p)) {
        for (const std::string& path : paths) names.push_back(std::make_unique<TemporaryFileName>(path));
    }
    ~RemoveOnExit() {
        std::error_code ec;
        for (const std::string& p : paths) std::filesystem::remove(p, ec);
    }
};

struct HeldOutCheck {
    double nll_calibrated = 0, nll_reference = 0;
    int64_t tokens_scored = 0;
    // Strictly lower: a tie writes the default bytes.
    bool calibrated_wins() const { return nll_calibrated < nll_reference; }
};

// The mean NLL of both written candidates on the held-out tokens (engine/tools/perplexity.h's method,
// the same chunks for both, so the difference is paired).
HeldOutCheck held_out_check(const std::string& calibrated, const std::string& reference,
                            const std::vector<int32_t>& tokens, int32_t n_ctx, int32_t bos, int n_threads,
                            InterruptGuard& guard) {
    HeldOutCheck c;
    for (const std::string* path : {&calibrated, &reference}) {
        ModelOptions mo;
        mo.model = *path;
        mo.device = "cpu";
        mo.threads = n_threads;
        mo.ctx_size = n_ctx;
        LoadedSession s = load_session(mo);
        PerplexityOptions po;
        po.n_ctx = n_ctx;
        po.n_batch = 512;
        po.bos = bos;
        po.cancel = guard.flag();
        const PerplexityResult r = compute_perplexity(s.session->backend(), tokens, po);
        (path == &calibrated ? c.nll_calibrated : c.nll_reference) = r.nll_mean;
        c.tokens_scored = r.tokens_scored;
    }
    return c;
}

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
    std::vector<PlanInput> inputs;
    for (const GgufTensor& t : in.tensors()) {
        PlanInput p;
        p.name = t.name;
        p.type = t.type;
        p.n_dims = t.n_dims;
        std::copy(t.ne, t.ne + 4, p.ne);
        inputs.push_back(std::move(p));
    }
    const QuantPlan plan = make_quant_plan(inputs, model_facts(in), po);

    std::set<std::string> requantized;
    for (const PlannedTensor& t : plan.tensors) {
        if (!t.converted()) continue;
        if (!type_info(t.from).can_dequantize)
            throw InputError(a.in + ": tensor " + t.name + " is " + std::string(type_name(t.from)) +
                             ", which tern cannot read (convert from the F16/F32 original instead)");
        if (!is_float_type(t.from)) requantized.insert(std::string(type_name(t.from)));
    }
    if (!requantized.empty()) {
        std::string kinds;
        for (const std::string& k : requantized) kinds += (kinds.empty() ? "" : ", ") + k;
        std::cerr << "tern: quantize: warning: " << a.in << " holds already-quantized tensors (" << kinds
                  << "); requantizing them adds error on top of error (quantize from the F16/F32 original if you can)\n";
    }
    for (const std::string& note : plan.fallback_notes) {
        size_t n = 0;
        for (const PlannedTensor& t : plan.tensors) n += t.fallback == note;
        std::cerr << "tern: quantize: width fallback " << note << " (" << n << (n == 1 ? " tensor)\n" : " tensors)\n");
    }

    const Sizes sizes = plan_sizes(plan, in);
    const FtypeInfo& fi = ftype_info(*ftype);
    if (a.dry_run) {
        const uint64_t est = estimated_file_size(plan, in);
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

    GgufWriter writer;
    writer.copy_metadata_from(in);
    // llama-quantize re-adds these two keys at the end in this order; doing the same makes whole
    // files byte-identical to its output, not just the tensors.
    for (const char* key : {"split.no", "split.count", "split.tensors.count", "general.quantization_version",
                            "general.file_type"})
        writer.remove(key);
    writer.set("general.quantization_version", GgufValue::make_u32(2));
    writer.set("general.file_type", GgufValue::make_u32(fi.file_type));
    for (const PlannedTensor& t : plan.tensors)
        writer.add_tensor(t.name, t.to, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)));

    SplitImportance imatrix;
    bool any_compensated = false;
    for (const PlannedTensor& t : plan.tensors) any_compensated |= t.converted() && supports_compensation(t.to);
    if (!a.calibrate.empty()) imatrix = calibrate(a, n_threads, any_compensated);

    InterruptGuard guard;
    // Writes the plan to `path`, tensor i quantized as cals[i] says.
    auto write_with = [&](const std::string& path, const std::vector<TensorCalibration>& cals,
                          const std::string& what) {
        ProgressBar bar(what + " " + std::string(fi.name), sizes.elements);
        uint64_t done = 0;
        writer.write(path, [&](size_t i, std::span<uint8_t> out) {
            const PlannedTensor& t = plan.tensors[i];
            bar.set_label(what + " " + std::string(fi.name) + " " + t.name);
            convert_tensor(in.tensors()[t.source_index], t, out, n_threads, guard.flag(), bar, done, cals[i]);
            if (guard.interrupted()) throw TernError(ExitCode::interrupted, kInterrupted);
        });
        bar.finish();
    };
    const std::vector<TensorCalibration> reference(plan.tensors.size());
    std::vector<TensorCalibration> fit_cals = reference, all_cals = reference;
    size_t n_weighted = 0, n_candidates = 0, n_selected = 0;
    for (size_t i = 0; i < plan.tensors.size() && !a.calibrate.empty(); ++i) {
        if (guard.interrupted()) throw TernError(ExitCode::interrupted, kInterrupted);
        const PlannedTensor& t = plan.tensors[i];
        if (!t.converted()) continue;
        const GgufTensor& src = in.tensors()[t.source_index];
        const std::vector<float>* check = find_moments(imatrix.check, t);
        if (supports_importance(t.to)) {
            const std::vector<float>* fit = find_importance(imatrix.fit, t);
            if (!fit) continue;
            ++n_candidates;
            // Inputs wider than kMaxMomentWidth have no moments: such a tensor skips the per-tensor check and
            // is judged by the whole-model check below only.
            if (check && !weighted_wins_held_out(src, t, *fit, *check, n_threads)) continue;
            fit_cals[i].importance = fit;
            all_cals[i].importance = find_importance(imatrix.all, t);
        } else if (supports_compensation(t.to)) {
            // Compensation needs the moments themselves, so inputs wider than kMaxMomentWidth keep the
            // reference quantizer.
            const std::vector<float>* fit = find_moments(imatrix.fit, t);
            if (!fit || !check) continue;
            ++n_candidates;
            if (!compensated_wins_held_out(src, t, *fit, *check, n_threads)) continue;
            fit_cals[i].moments = fit;
            all_cals[i].moments = find_moments(imatrix.all, t);
        } else {
            continue;
        }
        ++n_selected;
    }
    std::optional<HeldOutCheck> model_check;
    if (n_selected == 0) {
        write_with(a.out, reference, "quantizing");
    } else {
        // Each tensor's output error can shrink while the model's perplexity grows (stories260K),
        // so the model as a whole must also win on the held-out half before it is written.
        // The process id in the names keeps a user's own file of the plain name from being overwritten and removed.
        const std::string pid = std::to_string(::getpid());
        const std::string candidate = a.out + ".calibrated-check-" + pid, plain = a.out + ".reference-check-" + pid;
        RemoveOnExit cleanup({candidate, plain});
        write_with(candidate, fit_cals, "checking");
        write_with(plain, reference, "checking");
        model_check = held_out_check(candidate, plain, imatrix.check_tokens, imatrix.check_n_ctx, imatrix.bos,
                                     n_threads, guard);
        if (model_check->calibrated_wins()) {
            write_with(a.out, all_cals, "quantizing");   // the winner, with the statistics of the whole text
            n_weighted = n_selected;
        } else {
            check_write_target(a.out);
            std::filesystem::rename(plain, a.out);   // exactly the default output
        }
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t out_size = std::filesystem::file_size(a.out);
    size_t n_converted = 0;
    for (const PlannedTensor& t : plan.tensors) n_converted += t.converted();

    std::fprintf(stderr, "tern: quantize: %s -> %s (%s): %s (%.2f bpw) -> %s (%.2f bpw), %zu of %zu tensors converted, "
                         "%s with %d threads\n",
                 a.in.c_str(), a.out.c_str(), std::string(fi.name).c_str(), format_bytes(in.file_size()).c_str(),
                 sizes.in_bpw(), format_bytes(out_size).c_str(), sizes.out_bpw(), n_converted, plan.tensors.size(),
                 format_duration(secs).c_str(), n_threads);
    if (!a.calibrate.empty()) {
        std::fprintf(stderr,
                     "tern: quantize: --calibrate: %zu of %zu tensors had the smaller output error with the calibration "
                     "(importance weights or error compensation) on the held-out half\n",
                     n_selected, n_candidates);
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
        nlohmann::json j = {{"input", a.in}, {"output", a.out}, {"calibrated_tensors", n_weighted}, {"calibration_candidates", n_candidates}, {"calibration_selected", n_selected}, {"type", fi.name}, {"file_type", fi.file_type},
                            {"input_bytes", in.file_size()}, {"output_bytes", out_size},
                            {"input_bpw", sizes.in_bpw()}, {"output_bpw", sizes.out_bpw()},
                            {"n_tensors", plan.tensors.size()}, {"n_converted", n_converted},
                            {"requantized", !requantized.empty()}, {"threads", n_threads}, {"seconds", secs},
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
