#pragma once
// The CPU backend's projections as the forward multiplies them, decided once at load: for each projection of
// each layer (q, k, v, o, gate, up, down) and the output, the matmul path this process's kernel set takes
// (kernels/cpu/dispatch.h), the activation format its input is quantized to, and the repacked copy the path reads;
// projections that read one input (q/k/v, gate/up) also as one fused packed matrix. The forward uses these
// objects directly: nothing is looked up per matmul.
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/weights.h"
#include "kernels/cpu/dot.h"

namespace tern {

struct CpuKernels;

// How y = W x is computed for one projection.
enum class MatmulPath : uint8_t {
    dequant,   // weight rows dequantized to f32 (kernels/cpu/ops.h matmul_dequant): CpuOptions::exact_matmul, or a
               // format (or row length) without a dot kernel
    dot,       // the file layout and the set's dot kernels (kernels/cpu/matmul_quant.h matmul_q)
    packed,    // a row-interleaved packed copy (quant/repack.h, kernels/cpu/gemm_packed.h)
    panels,    // a 16-row panel copy of F16 / BF16 weights (quant/repack_f16.h, kernels/cpu/gemm_f16.h)
};

struct PreparedProjection {
    WeightRef source;                      // the weight in the mapping (absent: not present())
    MatmulPath path = MatmulPath::dequant;
    ActFormat acts = ActFormat::f32;       // the format its input is quantized to (every path but dequant)
    const uint8_t* copy = nullptr;         // the packed / panel bytes (paths packed and panels; owned by PreparedWeights)
};

// Projections that read one input, packed back to back as one matrix: one matmul streams all their rows, so decode
// pays one fork/join and one prefetch ramp per group instead of one per matrix. Made only for packed (not panel)
// formats whose parts share format and input width and each fill whole 16-row groups, so every part starts on a
// group boundary (and each part's own copy is its slice of these bytes). data == nullptr: not fused.
struct FusedProjections {
    GgmlType type = GgmlType::F32;
    int64_t n_in = 0, n_out = 0;           // n_out: the parts' rows together
    const uint8_t* data = nullptr;         // owned by PreparedWeights
    explicit operator bool() const { return data != nullptr; }
};

struct PreparedLayer {
    PreparedProjection q, k, v, o, gate, up, down;
    FusedProjections qkv, gate_up;
    // gemma4's per-layer input block: inp_gate and proj (absent elsewhere).
    PreparedProjection per_layer_gate, per_layer_proj;
    // Mixture of experts: the router, and each expert's matrices (its slice of the stacked tensor) as projections
    // of their own, gate and up fused per expert where they can be. Empty for a dense layer.
    PreparedProjection router;
    std::vector<PreparedProjection> gate_exps, up_exps, down_exps;
    std::vector<FusedProjections> gate_up_exps;
    // The shared experts' FFN (ModelConfig::n_expert_shared), gate and up fused where they can be.
    PreparedProjection gate_shexp, up_shexp, down_shexp;
    FusedProjections gate_up_shexp;
};

struct PreparedWeights {
    std::vector<PreparedLayer> layers;
    PreparedProjection output;
    PreparedProjection per_layer_model_proj;   // gemma4: the embedding to every layer's per-layer input
    // The bytes of the copies above: new[] without value-initialisation, so pages become resident only as they are
    // written.
    std::vector<std::unique_ptr<uint8_t[]>> copies;
};

// Whether weights of format t with rows of n_in elements have a dot kernel in the set k (else: matmul_dequant).
bool has_dot_kernel(GgmlType t, int64_t n_in, const CpuKernels& k);

// The prepared form of `weights` for the kernel set k. exact_matmul: every path is dequant and nothing is copied.
// Otherwise every projection whose format k has a packed or panel tile for is copied into that layout (n_threads
// threads), and the mapped pages of each copied tensor are released as it is copied (the file stays mapped), so
// resident memory stays about one copy of the weights (a later read of those rows, e.g. a tied embedding's row
// lookup, faults them back in from the file).
PreparedWeights prepare_weights(const ModelWeights& weights, bool exact_matmul, int n_threads, const CpuKernels& k);

} // namespace tern
