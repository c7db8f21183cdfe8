#pragma once
// Run-time choice of the CPU kernels, made ONCE: one table of function pointers per kernel set (dot products
// per weight format, activation quantizers, packed and 16-bit panel tiles, packed decode, attention chunks,
// SwiGLU), filled from cpu_features() on first use and consulted by every kernel family; no caller compares
// ISAs itself. TERN_CPU_ISA=scalar|avx2|avx512|neon forces one (tests, benchmarks); asking for a set this CPU
// or this build cannot run is an error, not a silent fallback.
//
// Sets and what they need:
//   scalar  always                      (dot_scalar.cpp and the other scalar twins, the oracles)
//   avx2    AVX2 + FMA + F16C           (dot_avx2.cpp, gemm_packed_avx2.cpp, gemm_f16_avx2.cpp, attention_avx2.cpp,
//                                        silu_avx2.cpp, causal_conv1d_avx2.cpp, gated_delta_avx2.cpp)
//   avx512  AVX-512 F/BW/VL + VNNI      (dot_avx512.cpp: 256-bit VNNI for the k-quants, 512-bit for the rest;
//                                        gemm_packed_avx512.cpp, gemm_f16_avx512.cpp, gated_delta_avx512.cpp;
//                                        AVX2 attention, SwiGLU and causal conv1d)
//   neon    aarch64 with dotprod        (dot_neon.cpp, built only for aarch64; scalar twins for the rest)
// Tests ask for the table of one set (cpu_kernels_for) to compare its kernels with the scalar set's.
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/dot.h"
#include "kernels/cpu/quantize_act.h"

namespace tern {

enum class CpuIsa : uint8_t { scalar, avx2, avx512, neon };
const char* cpu_isa_name(CpuIsa isa);

// The signatures of the table's kernel families; each family's header says what a kernel computes.
// Packed tile and decode kernels (gemm_packed.h).
using PackedTileFn = void (*)(int64_t nb, const uint8_t* group, const uint8_t* x, size_t x_stride, const int32_t* corr,
                              size_t corr_stride, int n_cols, float* out);
using PackedDecodeFn = void (*)(int64_t nb, const uint8_t* first, size_t group_bytes, int n_groups, const uint8_t* x,
                                const int32_t* corr, float* out);
// 16-bit panel tiles and the widening of 16-bit activations to f32 (gemm_f16.h).
using F16TileFn = void (*)(GgmlType t, int64_t n_in, const uint16_t* panels, int n_panels, const float* x,
                           int64_t n_cols, float* out);
using Widen16Fn = void (*)(GgmlType t, const uint16_t* src, float* dst, int64_t n);
// One chunk of flash attention (attention.h).
struct AttnParams;
using AttnChunkFn = void (*)(const AttnParams& p, const float* q, int64_t q_stride, const void* k, const void* v,
                             int64_t n_keys, float* scores, float* m, float* l, float* acc);
// SwiGLU rows (silu.h).
using SwigluFn = void (*)(const float* gate, const float* up, float* y, int64_t n);
// The causal conv1d of a recurrent mixer over channels [c_begin, c_end) (causal_conv1d.h), and the gated delta
// rule over v heads [h_begin, h_end) (gated_delta.h).
struct CausalConv1dArgs;
using CausalConv1dFn = void (*)(const CausalConv1dArgs& a, int64_t c_begin, int64_t c_end);
struct GatedDeltaArgs;
using GatedDeltaFn = void (*)(const GatedDeltaArgs& a, int h_begin, int h_end);

struct CpuKernels {
    CpuIsa isa = CpuIsa::scalar;

    // Dot products (dot.h), one per weight format. Every set has them all: the scalar ones where the ISA has none.
    VecDotFn q4_0 = nullptr, q4_1 = nullptr, q5_0 = nullptr, q5_1 = nullptr, q8_0 = nullptr;
    VecDotFn q2_k = nullptr, q3_k = nullptr, q4_k = nullptr, q5_k = nullptr, q6_k = nullptr;
    VecDotFn iq4_nl = nullptr, iq4_xs = nullptr, f8_e4m3 = nullptr, mxfp4 = nullptr;
    VecDotFn f16 = nullptr, bf16 = nullptr, f32 = nullptr;
    QuantizeActFn quantize[6] = {};   // indexed by ActFormat
    // Several columns a row (dot.h), where the ISA has them: null otherwise.
    VecDotColsFn q5_0_cols = nullptr;

    // Tiles over row-interleaved packed weights (gemm_packed.h) per packed format, and the decode kernel that
    // reads several groups side by side. A null tile: this set has none, so those weights stay in the file layout
    // and go through the dot kernels. A null decode: decode takes the tile one group at a time.
    struct Packed {
        PackedTileFn tile = nullptr;
        PackedDecodeFn decode = nullptr;
    };
    Packed packed_q4_0, packed_q8_0, packed_q4_k, packed_q6_k;

    // Tiles over F16 / BF16 panels (gemm_f16.h), null likewise, and the widening of 16-bit activations to f32.
    F16TileFn panel_f16 = nullptr, panel_bf16 = nullptr;
    Widen16Fn widen16 = nullptr;

    // Flash attention's chunk kernel (attention.h), for head dims that are multiples of 8 (the scalar twin takes
    // the others), and SwiGLU (silu.h).
    AttnChunkFn attn_chunk = nullptr;
    SwigluFn swiglu = nullptr;

    // A Gated DeltaNet layer's causal conv1d and its delta rule, token by token and chunked.
    CausalConv1dFn causal_conv1d = nullptr;
    GatedDeltaFn gated_delta_recurrent = nullptr, gated_delta_chunked = nullptr;

    // The dot kernel for weight format `w`, or nullptr for a format without one.
    VecDotFn find_dot(GgmlType w) const;
    // The same, throwing std::invalid_argument when there is none.
    VecDotFn dot(GgmlType w) const;
    // The several-column kernel for weight format `w`, or nullptr (then call the dot kernel per column).
    VecDotColsFn find_dot_cols(GgmlType w) const;
    QuantizeActFn quantizer(ActFormat f) const { return quantize[static_cast<int>(f)]; }
    // The packed kernels for weight format `w` (both null for a format without a packed layout).
    Packed packed(GgmlType w) const;
    // The panel tile for weight format `w` (null for formats other than F16 / BF16).
    F16TileFn panel_tile(GgmlType w) const;
};

// The set for this process: the best the CPU supports, or TERN_CPU_ISA. Chosen on the first call.
const CpuKernels& cpu_kernels();
// A specific set, or nullptr when this build or this CPU cannot run it (tests compare sets with it).
const CpuKernels* cpu_kernels_for(CpuIsa isa);

// Filled by each ISA's files (internal to kernels/cpu; dispatch.cpp calls the x86 ones only in x86-64 builds and
// the NEON one only in aarch64 builds). A set starts as the scalar set and each call overrides what it has.
void fill_cpu_kernels_scalar(CpuKernels& k);   // dots and quantizers (dot_scalar.cpp)
void fill_cpu_kernels_avx2(CpuKernels& k);     // dot_avx2.cpp
void fill_cpu_kernels_avx512(CpuKernels& k);   // dot_avx512.cpp
void fill_cpu_kernels_neon(CpuKernels& k);     // dot_neon.cpp
void fill_packed_avx2(CpuKernels& k);          // gemm_packed_avx2.cpp: tiles and decode
void fill_packed_avx512(CpuKernels& k);        // gemm_packed_avx512.cpp: tiles only
void fill_panels_avx2(CpuKernels& k);          // gemm_f16_avx2.cpp
void fill_panels_avx512(CpuKernels& k);        // gemm_f16_avx512.cpp
void fill_attention_avx2(CpuKernels& k);       // attention_avx2.cpp
void fill_swiglu_avx2(CpuKernels& k);          // silu_avx2.cpp
void fill_causal_conv1d_avx2(CpuKernels& k);   // causal_conv1d_avx2.cpp
void fill_gated_delta_avx2(CpuKernels& k);     // gated_delta_avx2.cpp
void fill_gated_delta_avx512(CpuKernels& k);   // gated_delta_avx512.cpp

} // namespace tern
