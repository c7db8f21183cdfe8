// The CPU backend's prepared weights (prepared_weights.h): the path of each projection and its repacked copy.
#include "engine/cpu/prepared_weights.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <unordered_map>

#include "base/parallel_for.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemm_f16.h"
#include "kernels/cpu/gemm_packed.h"
#include "quant/repack.h"
#include "quant/repack_f16.h"

namespace tern {
namespace {

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

// Packs w (rows [0, n_out)) into dst, releasing the mapped source pages slice by slice.
void pack_matrix(const WeightRef& w, bool panels, uint8_t* dst, int n_threads) {
    const int64_t n_out = w.n_out(), n_in = w.n_in();
    // Slices of ~4 MiB of source rows, each released as soon as it is packed, so the transient
    // double copy is one slice, not the whole tensor (a tied 128K-vocab embedding is 150+ MB).
    const int64_t groups = (n_out + kPackRows - 1) / kPackRows;
    const size_t group_src = w.row_size() * kPackRows;
    const int64_t per_slice = std::max<int64_t>(1, static_cast<int64_t>((4u << 20) / group_src));
    static_assert(kF16PanelRows == kPackRows, "one slicing serves both layouts");
    for (int64_t g0 = 0; g0 < groups; g0 += per_slice) {
        const int64_t g1 = std::min(groups, g0 + per_slice);
        parallel_for(g1 - g0, n_threads, 16, [&](int64_t a, int64_t b) {
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

// Whether ws can share one packed matrix: one packed format in k (packing_pays is false for the F16/BF16 panel
// formats), one input width, and parts of whole 16-row groups.
bool fusable(std::initializer_list<const WeightRef*> ws, const CpuKernels& k) {
    const WeightRef& first = **ws.begin();
    for (const WeightRef* w : ws)
        if (!w->present() || w->type != first.type || w->n_in() != first.n_in() || w->n_out() % kPackRows != 0 ||
            !packing_pays(w->type, w->n_in(), k))
            return false;
    return ws.size() > 1;
}

// The path of one projection (its copy is made later).
PreparedProjection plan(const WeightRef& w, bool exact_matmul, const CpuKernels& k) {
    PreparedProjection p;
    p.source = w;
    if (exact_matmul || !w.present() || !has_dot_kernel(w.type, w.n_in(), k)) return p;
    p.acts = act_format_for(w.type);
    p.path = panel16_pays(w.type, w.n_in(), k)   ? MatmulPath::panels
             : packing_pays(w.type, w.n_in(), k) ? MatmulPath::packed
                                                 : MatmulPath::dot;
    return p;
}

class Builder {
public:
    Builder(PreparedWeights& out, int n_threads) : out_(out), n_threads_(n_threads) {}

    // Packs the parts back to back into one matrix; each part's copy is its slice.
    void fuse(FusedProjections& f, std::initializer_list<PreparedProjection*> parts) {
        const WeightRef& first = (*parts.begin())->source;
        f.type = first.type;
        f.n_in = first.n_in();
        for (const PreparedProjection* p : parts) f.n_out += p->source.n_out();
        uint8_t* data = allocate(packed_bytes(f.type, f.n_out, f.n_in));
        size_t offset = 0;   // parts are whole groups, so each starts where the previous one's bytes end
        for (PreparedProjection* p : parts) {
            pack_matrix(p->source, false, data + offset, n_threads_);
            p->copy = data + offset;
            offset += packed_bytes(p->source.type, p->source.n_out(), p->source.n_in());
        }
        f.data = data;
    }

    // Gives p its own copy when its path reads one (the same bytes as an earlier projection of the same tensor).
    void copy(PreparedProjection& p) {
        if (p.copy || (p.path != MatmulPath::packed && p.path != MatmulPath::panels)) return;
        const WeightRef& w = p.source;
        const uint8_t*& done = copied_[w.data];
        if (!done) {
            const bool panels = p.path == MatmulPath::panels;
            uint8_t* dst = allocate(panels ? panel16_bytes(w.n_out(), w.n_in()) : packed_bytes(w.type, w.n_out(), w.n_in()));
            pack_matrix(w, panels, dst, n_threads_);
            done = dst;
        }
        p.copy = done;
    }

private:
    uint8_t* allocate(size_t bytes) {
        out_.copies.emplace_back(new uint8_t[bytes]);
        uint8_t* p = out_.copies.back().get();
        advise_huge_pages(p, bytes);
        return p;
    }

    PreparedWeights& out_;
    int n_threads_;
    std::unordered_map<const uint8_t*, const uint8_t*> copied_;   // source bytes -> their copy
};

} // namespace

bool has_dot_kernel(GgmlType t, int64_t n_in, const CpuKernels& k) {
    if (!k.find_dot(t)) return false;
    return n_in > 0 && n_in % block_elems(t) == 0 && n_in % act_block_elems(act_format_for(t)) == 0;
}

PreparedWeights prepare_weights(const ModelWeights& weights, bool exact_matmul, int n_threads, const CpuKernels& k) {
    PreparedWeights out;
    out.layers.resize(weights.layers.size());
    for (size_t l = 0; l < weights.layers.size(); ++l) {
        const LayerWeights& lw = weights.layers[l];
        PreparedLayer& pl = out.layers[l];
        pl.q = plan(lw.wq, exact_matmul, k);
        pl.k = plan(lw.wk, exact_matmul, k);
        pl.v = plan(lw.wv, exact_matmul, k);
        pl.o = plan(lw.wo, exact_matmul, k);
        pl.gate = plan(lw.w_gate, exact_matmul, k);
        pl.up = plan(lw.w_up, exact_matmul, k);
        pl.down = plan(lw.w_down, exact_matmul, k);
        pl.gate_shexp = plan(lw.gate_shexp, exact_matmul, k);
        pl.up_shexp = plan(lw.up_shexp, exact_matmul, k);
        pl.down_shexp = plan(lw.down_shexp, exact_matmul, k);
        pl.per_layer_gate = plan(lw.per_layer_gate, exact_matmul, k);
        pl.per_layer_proj = plan(lw.per_layer_proj, exact_matmul, k);
        if (lw.ffn_gate_inp.present()) {
            pl.router = plan(lw.ffn_gate_inp, exact_matmul, k);
            for (int64_t e = 0; e < lw.gate_exps.n_mats; ++e) {
                pl.gate_exps.push_back(plan(lw.gate_exps.matrix(e), exact_matmul, k));
                pl.up_exps.push_back(plan(lw.up_exps.matrix(e), exact_matmul, k));
                pl.down_exps.push_back(plan(lw.down_exps.matrix(e), exact_matmul, k));
            }
            pl.gate_up_exps.resize(pl.gate_exps.size());
        }
    }
    out.output = plan(weights.output, exact_matmul, k);
    out.per_layer_model_proj = plan(weights.per_layer_model_proj, exact_matmul, k);
    if (exact_matmul) return out;

    Builder build(out, n_threads);
    // The fused groups first, then every other copy in forward order.
    for (size_t l = 0; l < weights.layers.size(); ++l) {
        const LayerWeights& lw = weights.layers[l];
        PreparedLayer& pl = out.layers[l];
        if (fusable({&lw.wq, &lw.wk, &lw.wv}, k)) build.fuse(pl.qkv, {&pl.q, &pl.k, &pl.v});
        if (fusable({&lw.w_gate, &lw.w_up}, k)) build.fuse(pl.gate_up, {&pl.gate, &pl.up});
        if (fusable({&lw.gate_shexp, &lw.up_shexp}, k)) build.fuse(pl.gate_up_shexp, {&pl.gate_shexp, &pl.up_shexp});
        for (size_t e = 0; e < pl.gate_exps.size(); ++e)
            if (fusable({&pl.gate_exps[e].source, &pl.up_exps[e].source}, k))
                build.fuse(pl.gate_up_exps[e], {&pl.gate_exps[e], &pl.up_exps[e]});
    }
    for (PreparedLayer& pl : out.layers) {
        for (PreparedProjection* p : {&pl.q, &pl.k, &pl.v, &pl.o, &pl.gate, &pl.up, &pl.down, &pl.router,
                                      &pl.gate_shexp, &pl.up_shexp, &pl.down_shexp,
                                      &pl.per_layer_gate, &pl.per_layer_proj})
            build.copy(*p);
        for (size_t e = 0; e < pl.gate_exps.size(); ++e)
            for (PreparedProjection* p : {&pl.gate_exps[e], &pl.up_exps[e], &pl.down_exps[e]}) build.copy(*p);
    }
    build.copy(out.output);
    build.copy(out.per_layer_model_proj);
    return out;
}

} // namespace tern
