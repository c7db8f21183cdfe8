#pragma once
// `tern quantize` as a library: plan a conversion of a GGUF file (llama-quantize's type mixtures,
// quant/plan.h), then write it, optionally calibrated (calibration.h) and checked on held-out text
// (held_out.h). The output is byte-identical to llama-quantize's for the standard types. Nothing
// here prints: the caller gets numbers back and shows progress through QuantizeProgress.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/quantize/calibration.h"
#include "engine/quantize/held_out.h"
#include "formats/gguf.h"
#include "quant/plan.h"

namespace tern {

struct QuantizeSizes {
    uint64_t in_bytes = 0, out_bytes = 0, elements = 0;   // out_bytes: the tensors in their target formats
    double in_bpw() const { return elements ? 8.0 * double(in_bytes) / double(elements) : 0.0; }
    double out_bpw() const { return elements ? 8.0 * double(out_bytes) / double(elements) : 0.0; }
};

// The plan for one input file and what follows from it.
struct QuantizeJob {
    QuantPlan plan;
    std::vector<std::string> requantized;   // already-quantized formats that get converted again (sorted)
    QuantizeSizes sizes;
    uint64_t estimated_file_size = 0;       // the output file, exact up to a few bytes of metadata

    size_t n_converted() const;
    // Whether a converted tensor's target format takes error compensation (its calibration then needs
    // the second moments of the fit half too).
    bool wants_moments() const;
};

// Reads the input's tensors and metadata and plans their conversion. Throws InputError naming the file
// when a tensor to convert has a format tern cannot read, UsageError for an override regex that does
// not compile.
QuantizeJob plan_quantize(const GgufFile& in, const PlanOptions& options);

// Which file a write is producing.
enum class QuantizePass {
    check,   // a candidate for the model-level held-out check (removed afterwards)
    output,  // OUT itself
};

// Progress of one file's write: tensor() as each tensor starts, update() with the elements done so far
// (out of the job's sizes.elements). Destroyed when the file is written or the write fails.
class QuantizeProgress {
public:
    virtual ~QuantizeProgress() = default;
    virtual void tensor(const std::string& name) = 0;
    virtual void update(uint64_t elements_done) = 0;
};
using QuantizeProgressFactory = std::function<std::unique_ptr<QuantizeProgress>(QuantizePass pass)>;

struct QuantizeOutcome {
    size_t n_candidates = 0;   // tensors calibration could apply to (held_out.h)
    size_t n_selected = 0;     // those where it won the per-tensor check
    size_t n_weighted = 0;     // those written calibrated (n_selected when the model-level check was won, else 0)
    std::optional<HeldOutCheck> model_check;   // when a tensor was selected
};

// Writes the job's output to out_path atomically (formats/gguf_writer.h). With a calibration, the tensors
// that win the per-tensor check are tried: both candidates are written beside out_path (names with
// ".calibrated-check-PID" / ".reference-check-PID", removed on every way out), and out_path gets the
// calibrated tensors (fitted on the whole text) only when they also win the model-level check, else
// exactly the reference output. cancel is checked between slabs of rows and tensors; raised, the write
// stops with the interruption error (convert.h) and leaves no file.
QuantizeOutcome write_quantized(const GgufFile& in, const QuantizeJob& job, const std::string& out_path,
                                const SplitImportance* calibration, int n_threads, const std::atomic<bool>* cancel,
                                const QuantizeProgressFactory& progress);

} // namespace tern
