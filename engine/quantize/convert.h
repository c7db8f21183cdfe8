#pragma once
// One tensor of a quantization plan written in its target format: every row dequantized to f32 and
// quantized again with the reference quantizer (quant/reference.h), the importance-weighted one
// (quant/imatrix.h) or the error-compensating one (quant/compensated.h).
#include <atomic>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "formats/gguf.h"
#include "quant/plan.h"

namespace tern {

// The error of a conversion stopped by its cancel flag (exit code: interrupted). The writer removes its
// temporary file when its fill callback throws, so nothing is left behind.
inline constexpr const char* kQuantizeInterrupted =
    "quantize: interrupted; OUT was not written and its temporary file was removed";
[[noreturn]] void throw_quantize_interrupted();

// What calibration gives one tensor's quantizer: nothing (the reference quantizer), an importance
// vector (quant/imatrix.h), or its input's second moments (quant/compensated.h).
struct TensorCalibration {
    const std::vector<float>* importance = nullptr;
    const std::vector<float>* moments = nullptr;
};

// Converts src into out (t.n_bytes() bytes; a tensor the plan keeps is copied). Rows are independent,
// so OpenMP over rows gives the same bytes for every thread count. Rows go in slabs so that
// `progress(elements done in this tensor)` and the cancel flag are served between slabs. Throws
// InputError naming the tensor and row when a row cannot be converted.
void convert_tensor(const GgufTensor& src, const PlannedTensor& t, std::span<uint8_t> out, int n_threads,
                    const std::atomic<bool>* cancel, const TensorCalibration& calibration,
                    const std::function<void(uint64_t elements_done)>& progress);

} // namespace tern
