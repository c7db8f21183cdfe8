// The CPU backend's projections: y = W x (+ bias) through the SIMD quantized matmul, each input's
// quantized form made once and shared by every projection that reads it.
#include <sys/mman.h>
#include <unistd.h>

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
#include "base/parallel_for.h"
#include "kernels/cpu/quantize_act.h"
#include "quant/repack.h"
#include "quant/repack_f16.h"

namespace tern {
namespace {

// Whether weights of format t with rows of n_in elements have a dot kernel (else: matmul_dequant).
bool has_dot_kernel(GgmlType t, int64_t n_in) {
    switch (t) {
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q8_0:
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_NL:
    case GgmlType::IQ4_XS:
    case GgmlType::F8_E4M3:
    case GgmlType::F16:
    case GgmlType::BF16:
    case GgmlType::F32:
        break;
    default:
        return false;
    }
    return n_in > 0 && n_in % block_elems(t) == 0 && n_in % act_block_elems(act_format_for(t)) == 0;
}

void add_bias(const std::vector<float>& bias, int64_t n_out, int64_t n_cols, float* y) {
    if (bias.empty()) return;
    for (int64_t c = 0; c < n_cols; ++c)
        for (int64_t r = 0; r < n_out; ++r)
            y[c * n_out + r] += bias[static_cast<size_t>(r)];
}

// madvise(advice) on the whole `unit`-sized pages inside [p, p + n), none of the partial ones at its ends. Advice
// only: a failure changes nothing that matters, so it is ignored.
void advise_inside(const uint8_t* p, size_t n, uintptr_t unit, int advice) {
    const uintptr_t lo = (reinterpret_cast<uintptr_t>(p) + unit - 1) / unit * unit;
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + n) / unit * unit;
    if (hi > lo) ::madvise(reinterpret_cast<void*>(lo), hi - lo, advice);
}

// Drops the resident pages of [p, p + n) that lie wholly inside it: the mapping is private and read-only, so
// the kernel just forgets them (a later read, e.g. a tied embedding's row lookup, faults the page back in
// from the page cache). Failure only costs memory.
void release_pages(const uint8_t* p, size_t n) {
    advise_inside(p, n, static_cast<uintptr_t>(sysconf(_SC_PAGESIZE)), MADV_DONTNEED);
}

// Asks for transparent huge pages on the whole 2 MiB pages inside a packed buffer. Decode streams every
// weight once per token, and with 4 KiB pages that is a TLB miss every 4 KiB; the read-bandwidth probe uses
// huge pages too. Measured (llama-1b, tern bench -p 16 -n 64, interleaved A/B): Q4_0 -t 2 decode +7%,
// Q4_K_M +3..13%, Q4_0 -t 1 +17%. Only the interior is advised, so a buffer's partial first and last
// huge page never becomes resident beyond its bytes (peak RSS unchanged: 809 MiB on llama-1b Q4_0).
// Where THP is off, nothing changes.
void advise_huge_pages(const uint8_t* p, size_t n) {
#if defined(MADV_HUGEPAGE)
    advise_inside(p, n, uintptr_t(2) << 20, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

// Whether ws can share one packed matrix: one packed format on this CPU (packing_pays is false for the
// F16/BF16 panel formats), one input width, and parts of whole 16-row groups.
bool fusable(std::initializer_list<const WeightRef*> ws, const CpuKernels& k) {
    const WeightRef& first = **ws.begin();
    for (const WeightRef* w : ws)
        if (!w->present() || w->type != first.type || w->n_in() != first.n_in() || w->n_out() % kPackRows != 0 ||
            !packing_pays(w->type, w->n_in(), k))
            return false;
    return ws.size() > 1;
}

} // namespace

void CpuBackend::pack_matrix(const WeightRef& w, bool panels, uint8_t* dst) {
    const int64_t n_out = w.n_out(), n_in = w.n_in();
    // Slices of ~4 MiB of source rows, each released as soon as it is packed, so the transient
    // double copy is one slice, not the whole tensor (a tied 128K-vocab embedding is 150+ MB).
    const int64_t groups = (n_out + kPackRows - 1) / kPackRows;
    const size_t group_src = w.row_size() * kPackRows;
    const int64_t per_slice = std::max<int64_t>(1, static_cast<int64_t>((4u << 20) / group_src));
    static_assert(kF16PanelRows == kPackRows, "one slicing serves both layouts");
    for (int64_t g0 = 0; g0 < groups; g0 += per_slice) {
        const int64_t g1 = std::min(groups, g0 + per_slice);
        parallel_for(g1 - g0, n_threads_, 16, [&](int64_t a, int64_t b) {
            const int64_t r0 = (g0 + a) * kPackRows, r1 = std::min(n_out, (g0 + b) * kPackRows);
            if (panels)
                repack_panel16(w.data, n_out, n_in, dst, r0, r1);
            else
                repack_rows(w.type, w.data, n_out, n_in, dst, r0, r1);
        });
        const int64_t r0 = g0 * kPackRows, r1 = std::min(n_out, g1 * kPackRows);
        release_pages(w.data + static_cast<size_t>(r0) * w.row_size(), static_cast<size_t>(r1 - r0) * w.row_size());
    }
}

void CpuBackend::pack_weights() {
    const CpuKernels& k = cpu_kernels();
    for (const LayerWeights& lw : weights_.layers)
        for (const auto group : {std::initializer_list<const WeightRef*>{&lw.wq, &lw.wk, &lw.wv},
                                 std::initializer_list<const WeightRef*>{&lw.w_gate, &lw.w_up}}) {
            const WeightRef& first = **group.begin();
            if (!fusable(group, k) || fused_.count(first.data)) continue;
            FusedGroup f;
            f.type = first.type;
            f.n_in = first.n_in();
            for (const WeightRef* w : group) f.n_out += w->n_out();
            const size_t bytes = packed_bytes(f.type, f.n_out, f.n_in);
            f.data.reset(new uint8_t[bytes]);
            advise_huge_pages(f.data.get(), bytes);
            size_t offset = 0;   // parts are whole groups, so each starts where the previous one's bytes end
            for (const WeightRef* w : group) {
                pack_matrix(*w, false, f.data.get() + offset);
                offset += packed_bytes(w->type, w->n_out(), w->n_in());
            }
            fused_.emplace(first.data, std::move(f));
        }

    std::vector<const WeightRef*> todo;
    for (const LayerWeights& lw : weights_.layers) {
        // Fused groups already hold their parts.
        const bool qkv = fused_.count(lw.wq.data) > 0, ffn = fused_.count(lw.w_gate.data) > 0;
        for (const WeightRef* w : {&lw.wq, &lw.wk, &lw.wv})
            if (!qkv) todo.push_back(w);
        todo.push_back(&lw.wo);
        for (const WeightRef* w : {&lw.w_gate, &lw.w_up})
            if (!ffn) todo.push_back(w);
        todo.push_back(&lw.w_down);
    }
    todo.push_back(&weights_.output);
    for (const WeightRef* w : todo) {
        if (!w->present() || packed_.count(w->data)) continue;
        // F16 / BF16: 16-row panels for the 16-bit GEMM (kernels/cpu/gemm_f16.h); the rest: packed groups.
        const bool panels = panel16_pays(w->type, w->n_in(), k);
        if (!panels && !packing_pays(w->type, w->n_in(), k)) continue;
        std::unique_ptr<uint8_t[]>& dst = packed_[w->data];
        const size_t bytes = panels ? panel16_bytes(w->n_out(), w->n_in()) : packed_bytes(w->type, w->n_out(), w->n_in());
        dst.reset(new uint8_t[bytes]);
        advise_huge_pages(dst.get(), bytes);
        pack_matrix(*w, panels, dst.get());
    }
}

void CpuBackend::project_shared(std::initializer_list<const WeightRef*> ws,
                                std::initializer_list<const std::vector<float>*> biases, MatmulInput& in,
                                std::initializer_list<float*> ys) {
    const auto it = exact_matmul_ ? fused_.end() : fused_.find((*ws.begin())->data);
    if (it == fused_.end()) {
        auto b = biases.begin();
        auto y = ys.begin();
        for (const WeightRef* w : ws) project(*w, **b++, in, *y++);
        return;
    }
    const FusedGroup& f = it->second;
    const ActFormat fmt = act_format_for(f.type);
    const QuantizedActs acts{fmt, in.acts(fmt), in.n_in, in.n_cols, 0};
    fused_out_.resize(static_cast<size_t>(in.n_cols * f.n_out));
    matmul_packed(PackedMatrixView{f.type, f.data.get(), f.n_in, f.n_out}, acts, fused_out_.data(), n_threads_);
    int64_t row0 = 0;
    auto b = biases.begin();
    auto y = ys.begin();
    for (const WeightRef* w : ws) {
        const int64_t n_out = w->n_out();
        for (int64_t c = 0; c < in.n_cols; ++c)
            std::memcpy(*y + c * n_out, fused_out_.data() + c * f.n_out + row0, static_cast<size_t>(n_out) * sizeof(float));
        add_bias(**b++, n_out, in.n_cols, *y++);
        row0 += n_out;
    }
}

void CpuBackend::norm_input(const float* x, const std::vector<float>& w, int64_t n, int64_t dim, float* xn,
                            const WeightRef& reader) {
    input_.reset(xn, dim, n);
    const float eps = config_.rms_eps;
    if (exact_matmul_ || !has_dot_kernel(reader.type, dim)) {
        for (int64_t i = 0; i < n; ++i) rmsnorm_f32(x + i * dim, w.empty() ? nullptr : w.data(), xn + i * dim, dim, eps);
        return;
    }
    const ActFormat f = act_format_for(reader.type);
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

void CpuBackend::project(const WeightRef& w, const std::vector<float>& bias, MatmulInput& in, float* y) {
    if (exact_matmul_ || !has_dot_kernel(w.type, w.n_in())) {
        matmul_dequant(w.type, w.data, w.n_in(), w.n_out(), in.x, in.n_cols, y, n_threads_);
    } else if (const auto it = packed_.find(w.data); it != packed_.end()) {
        const ActFormat f = act_format_for(w.type);
        const QuantizedActs acts{f, in.acts(f), in.n_in, in.n_cols, 0};
        if (panel16_packable(w.type, w.n_in()))
            matmul_f16_panels(Panel16MatrixView{w.type, it->second.get(), w.n_in(), w.n_out()}, acts, y, n_threads_);
        else
            matmul_packed(PackedMatrixView{w.type, it->second.get(), w.n_in(), w.n_out()}, acts, y, n_threads_);
    } else {
        const ActFormat f = act_format_for(w.type);
        const QuantizedActs acts{f, in.acts(f), in.n_in, in.n_cols, 0};
        matmul_q(WeightMatrixView{w.type, w.data, w.n_in(), w.n_out(), 0}, acts, y, n_threads_);
    }
    add_bias(bias, w.n_out(), in.n_cols, y);
}

} // namespace tern
