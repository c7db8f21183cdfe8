// The CPU backend's projections: y = W x (+ bias) along each projection's prepared path (prepared_weights.h),
// each input's quantized form made once and shared by every projection that reads it.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/cpu/backend_cpu.h"
#include "kernels/cpu/gemm_f16.h"
#include "kernels/cpu/gemm_input.h"
#include "kernels/cpu/gemm_packed.h"
#include "kernels/cpu/matmul_quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quantize_act.h"

namespace tern {
namespace {

void add_bias(const std::vector<float>& bias, int64_t n_out, int64_t n_cols, float* y) {
    if (bias.empty()) return;
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t r = 0; r < n_out; ++r)
            y[c * n_out + r] += bias[static_cast<size_t>(r)];
}

} // namespace

void CpuBackend::project_shared(const FusedProjections& fused, std::initializer_list<const PreparedProjection*> ps,
                                std::initializer_list<const std::vector<float>*> biases, MatmulInput& in,
                                std::initializer_list<float*> ys) {
    if (!fused) {
        auto b = biases.begin();
        auto y = ys.begin();
        for (const PreparedProjection* p : ps) project(*p, **b++, in, *y++);
        return;
    }
    const ActFormat fmt = act_format_for(fused.type);
    const QuantizedActs acts{fmt, in.acts(fmt), in.n_in, in.n_cols, 0};
    fused_out_.resize(static_cast<size_t>(in.n_cols * fused.n_out));
    matmul_packed(PackedMatrixView{fused.type, fused.data, fused.n_in, fused.n_out}, acts, fused_out_.data(), n_threads_);
    int64_t row0 = 0;
    auto b = biases.begin();
    auto y = ys.begin();
    for (const PreparedProjection* p : ps) {
        const int64_t n_out = p->source.n_out();
        for (int64_t c = 0; c < in.n_cols; ++c)
            std::memcpy(*y + c * n_out, fused_out_.data() + c * fused.n_out + row0, static_cast<size_t>(n_out) * sizeof(float));
        add_bias(**b++, n_out, in.n_cols, *y++);
        row0 += n_out;
    }
}

void CpuBackend::norm_input(const float* x, const std::vector<float>& w, int64_t n, int64_t dim, float* xn,
                            const PreparedProjection& reader) {
    input_.reset(xn, dim, n);
    const float eps = config_.rms_eps;
    if (reader.path == MatmulPath::dequant) {
        for (int64_t i = 0; i < n; ++i) rmsnorm_f32(x + i * dim, w.empty() ? nullptr : w.data(), xn + i * dim, dim, eps);
        return;
    }
    const ActFormat f = reader.acts;
    const auto fi = static_cast<size_t>(f);
    input_.bytes[fi].resize(act_row_bytes(f, dim) * static_cast<size_t>(n));
    rmsnorm_quantize_rows(x, w.empty() ? nullptr : w.data(), eps, n, dim, f, xn, input_.bytes[fi].data(), n_threads_);
    input_.ready[fi] = true;
}

void CpuBackend::MatmulInput::reset(const float* x_new, int64_t n_in_new, int64_t n_cols_new) {
    x = x_new;
    n_in = n_in_new;
    n_cols = n_cols_new;
    ready.fill(false);
}

const void* CpuBackend::MatmulInput::acts(ActFormat f) {
    const size_t i = static_cast<size_t>(f);
    if (!ready[i]) {
        bytes[i].resize(act_row_bytes(f, n_in) * static_cast<size_t>(n_cols));
        quantize_acts(f, x, n_in, n_cols, bytes[i].data(), n_threads);
        ready[i] = true;
    }
    return bytes[i].data();
}

void CpuBackend::project(const PreparedProjection& p, const std::vector<float>& bias, MatmulInput& in, float* y) {
    const WeightRef& w = p.source;
    if (p.path == MatmulPath::dequant) {
        matmul_dequant(w.type, w.data, w.n_in(), w.n_out(), in.x, in.n_cols, y, n_threads_);
    } else {
        const QuantizedActs acts{p.acts, in.acts(p.acts), in.n_in, in.n_cols, 0};
        switch (p.path) {
        case MatmulPath::panels:
            matmul_f16_panels(Panel16MatrixView{w.type, p.copy, w.n_in(), w.n_out()}, acts, y, n_threads_);
            break;
        case MatmulPath::packed:
            matmul_packed(PackedMatrixView{w.type, p.copy, w.n_in(), w.n_out()}, acts, y, n_threads_);
            break;
        default: matmul_q(WeightMatrixView{w.type, w.data, w.n_in(), w.n_out(), 0}, acts, y, n_threads_); break;
        }
    }
    add_bias(bias, w.n_out(), in.n_cols, y);
}

} // namespace tern
