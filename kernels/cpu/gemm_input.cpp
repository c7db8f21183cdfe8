// Fused RMSNorm + activation quantization (gemm_input.h).
#include "kernels/cpu/gemm_input.h"

#include <stdexcept>
#include <string>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"
#include "base/parallel_for.h"
#include "kernels/cpu/quantize_act.h"

namespace tern {

void rmsnorm_quantize_rows(const float* x, const float* w, float eps, int64_t n_rows, int64_t width, ActFormat f,
                           float* xn, void* q, int n_threads) {
    if (width % act_block_elems(f) != 0)
        throw std::invalid_argument("rmsnorm_quantize_rows: " + std::to_string(width) + " elements is not a multiple of the " +
                                    act_format_name(f) + " block size");
    const QuantizeActFn quantize = cpu_kernels().quantizer(f);
    const size_t rb = act_row_bytes(f, width);
    const int threads = n_rows > 1 ? threads_for_elems(n_rows * width, n_threads) : 1;
    parallel_for(n_rows, threads, 16, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
            float* row = xn + i * width;
            rmsnorm_f32(x + i * width, w, row, width, eps);
            quantize(row, static_cast<char*>(q) + static_cast<size_t>(i) * rb, width);
        }
    });
}

} // namespace tern
