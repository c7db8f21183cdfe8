#include "engine/quantize/convert.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "base/error.h"
#include "quant/compensated.h"
#include "quant/imatrix.h"
#include "quant/reference.h"

namespace tern {

void throw_quantize_interrupted() {
    throw TernError(ExitCode::interrupted, kQuantizeInterrupted);
}

void convert_tensor(const GgufTensor& src, const PlannedTensor& t, std::span<uint8_t> out, int n_threads,
                    const std::atomic<bool>* cancel, const TensorCalibration& cal,
                    const std::function<void(uint64_t elements_done)>& progress) {
    if (!t.converted()) {
        std::memcpy(out.data(), src.data, src.n_bytes);
        progress(static_cast<uint64_t>(t.n_elements()));
        return;
    }
    const int64_t width = t.ne[0], rows = src.n_rows();
    const size_t in_row = src.row_size(), out_row = row_bytes(t.to, width);
    const int64_t slab = std::max<int64_t>(int64_t{n_threads} * 4, std::min<int64_t>(rows, (1 << 22) / width + 1));
    std::optional<CompensationFactor> factor;
    if (cal.moments) factor = compensation_factor(cal.moments->data(), width);
    std::string error;
    for (int64_t r0 = 0; r0 < rows; r0 += slab) {
        if (cancel && cancel->load()) throw_quantize_interrupted();
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
        progress(static_cast<uint64_t>(r1 * width));
    }
}

} // namespace tern
