#include "engine/quantize/pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "engine/quantize/convert.h"
#include "formats/atomic_file.h"
#include "formats/gguf_writer.h"
#include "formats/mapped_file.h"
#include "quant/compensated.h"

namespace tern {
namespace {

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
    m.n_expert = first_int(f, m.arch + ".expert_count");
    return m;
}

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

QuantizeSizes plan_sizes(const QuantPlan& plan, const GgufFile& in) {
    QuantizeSizes s;
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

// The output's header: the input's metadata and the plan's tensors.
GgufWriter output_writer(const GgufFile& in, const QuantPlan& plan) {
    GgufWriter writer;
    writer.copy_metadata_from(in);
    // llama-quantize re-adds these two keys at the end in this order; doing the same makes whole
    // files byte-identical to its output, not just the tensors.
    for (const char* key : {"split.no", "split.count", "split.tensors.count", "general.quantization_version",
                            "general.file_type"})
        writer.remove(key);
    writer.set("general.quantization_version", GgufValue::make_u32(2));
    writer.set("general.file_type", GgufValue::make_u32(ftype_info(plan.ftype).file_type));
    for (const PlannedTensor& t : plan.tensors)
        writer.add_tensor(t.name, t.to, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)));
    return writer;
}

// The candidate files of the model-level check: removed on every way out, signals included
// (TemporaryFileName).
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

} // namespace

size_t QuantizeJob::n_converted() const {
    size_t n = 0;
    for (const PlannedTensor& t : plan.tensors) n += t.converted();
    return n;
}

bool QuantizeJob::wants_moments() const {
    for (const PlannedTensor& t : plan.tensors)
        if (t.converted() && supports_compensation(t.to)) return true;
    return false;
}

QuantizeJob plan_quantize(const GgufFile& in, const PlanOptions& options) {
    std::vector<PlanInput> inputs;
    for (const GgufTensor& t : in.tensors()) {
        PlanInput p;
        p.name = t.name;
        p.type = t.type;
        p.n_dims = t.n_dims;
        std::copy(t.ne, t.ne + 4, p.ne);
        inputs.push_back(std::move(p));
    }
    QuantizeJob job;
    job.plan = make_quant_plan(inputs, model_facts(in), options);
    std::set<std::string> requantized;
    for (const PlannedTensor& t : job.plan.tensors) {
        if (!t.converted()) continue;
        if (!type_info(t.from).can_dequantize)
            throw InputError(in.path() + ": tensor " + t.name + " is " + std::string(type_name(t.from)) +
                             ", which tern cannot read (convert from the F16/F32 original instead)");
        if (!is_float_type(t.from)) requantized.insert(std::string(type_name(t.from)));
    }
    job.requantized.assign(requantized.begin(), requantized.end());
    job.sizes = plan_sizes(job.plan, in);
    job.estimated_file_size = estimated_file_size(job.plan, in);
    return job;
}

QuantizeOutcome write_quantized(const GgufFile& in, const QuantizeJob& job, const std::string& out_path,
                                const SplitImportance* calibration, int n_threads, const std::atomic<bool>* cancel,
                                const QuantizeProgressFactory& progress) {
    const QuantPlan& plan = job.plan;
    const GgufWriter writer = output_writer(in, plan);
    // Writes the plan to `path`, tensor i quantized as cals[i] says.
    auto write_with = [&](const std::string& path, const std::vector<TensorCalibration>& cals, QuantizePass pass) {
        const std::unique_ptr<QuantizeProgress> shown = progress(pass);
        uint64_t done = 0;
        writer.write(path, [&](size_t i, std::span<uint8_t> out) {
            const PlannedTensor& t = plan.tensors[i];
            shown->tensor(t.name);
            convert_tensor(in.tensors()[t.source_index], t, out, n_threads, cancel, cals[i],
                           [&](uint64_t tensor_done) { shown->update(done + tensor_done); });
            done += static_cast<uint64_t>(t.n_elements());
            if (cancel && cancel->load()) throw_quantize_interrupted();
            // The input rewritten in place while it was read: the output would mix two files (nothing is written).
            check_mapped_files();
        });
    };
    const std::vector<TensorCalibration> reference(plan.tensors.size());
    QuantizeOutcome outcome;
    if (!calibration) {
        write_with(out_path, reference, QuantizePass::output);
        return outcome;
    }
    const CalibrationSelection chosen = select_calibrated_tensors(in, plan, *calibration, n_threads, cancel);
    outcome.n_candidates = chosen.n_candidates;
    outcome.n_selected = chosen.n_selected;
    if (chosen.n_selected == 0) {
        write_with(out_path, reference, QuantizePass::output);
        return outcome;
    }
    // The process id in the names keeps a user's own file of the plain name from being overwritten and removed.
    const std::string pid = std::to_string(::getpid());
    const std::string candidate = out_path + ".calibrated-check-" + pid, plain = out_path + ".reference-check-" + pid;
    RemoveOnExit cleanup({candidate, plain});
    write_with(candidate, chosen.fit, QuantizePass::check);
    write_with(plain, reference, QuantizePass::check);
    outcome.model_check = held_out_check(candidate, plain, calibration->check_tokens, calibration->check_n_ctx,
                                         calibration->bos, n_threads, cancel);
    if (outcome.model_check->calibrated_wins()) {
        write_with(out_path, chosen.all, QuantizePass::output);   // the winner, with the statistics of the whole text
        outcome.n_weighted = chosen.n_selected;
    } else {
        check_write_target(out_path);
        std::filesystem::rename(plain, out_path);   // exactly the default output
    }
    return outcome;
}

} // namespace tern
