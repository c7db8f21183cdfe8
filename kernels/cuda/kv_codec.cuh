#pragma once
// The KV cache's row formats (kernels/kv_format.h) on the device: the twins of kv_store_row /
// kv_load_row (kernels/cpu/attention.h), bit for bit. Shared by kv_cache.cu (kv_write, kv_erase) and
// attention.cu (which reads rows four elements at a time).
//
// Exactness: the scalar conversions are quant/half.h and quant/fp8.h themselves (integer code, host and
// device alike); every float operation of the block encoders is written with __fmul_rn / __fdiv_rn /
// __fadd_rn / __fsub_rn so nvcc cannot contract it into an FMA the CPU (built with -ffp-contract=off)
// does not do, and sums run in the CPU's order.
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/unroll.h"
#include "kernels/kv_format.h"
#include "quant/fp8.h"
#include "quant/half.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace kv_codec {

inline constexpr int kBlockElems = 32; // q8_0 and f8_e4m3: 32 elements after an f16 scale
inline constexpr int kBlockBytes = 34;

// The float formats (one element per 4 or 2 bytes), which take any head dim the kernels' 4-element
// steps divide; the block formats (q8_0, f8_e4m3) take whole 32-element blocks only.
constexpr bool is_float_format(KvType t) {
    return t == KvType::f32 || t == KvType::f16 || t == KvType::bf16;
}

// Host: the head dims and cache shape every kernel of the KV cache takes, at least one head and one
// position, and head dims up to 256 (the attention kernel sizes its shared tiles and register tiles for
// at most 256): multiples of 4 from 4 for the float formats (the kernels move rows 4 elements at a time:
// 16 bytes of f32, 8 of f16 / bf16, which keeps every row start aligned for those loads), multiples of
// 32 from 32 for the block formats (whole blocks per row). Throws std::invalid_argument.
inline void check_kv_shape(KvType type, int64_t head_dim, int64_t head_dim_v, int64_t n_kv_heads, int64_t n_ctx,
                           const char* what) {
    const int64_t step = is_float_format(type) ? 4 : kBlockElems;
    auto dim_ok = [step](int64_t d) { return d >= step && d <= 256 && d % step == 0; };
    if (!dim_ok(head_dim) || !dim_ok(head_dim_v) || n_kv_heads < 1 || n_ctx < 1)
        throw std::invalid_argument(std::string(what) + ": head dims " + std::to_string(head_dim) + " / " +
                                    std::to_string(head_dim_v) + " (" + std::string(kv_format_info(type).name) +
                                    " takes multiples of " + std::to_string(step) + " from " + std::to_string(step) +
                                    " to 256), " + std::to_string(n_kv_heads) + " KV heads, " + std::to_string(n_ctx) +
                                    " positions");
}

__device__ __forceinline__ uint16_t load_u16(const uint8_t* p) {
    return *reinterpret_cast<const uint16_t*>(p);
}

// e4m3 code -> float, exact: the 7 magnitude bits placed at the top of an f16's exponent and mantissa
// give the same value times 2^-8 (f16's bias is 8 more than e4m3's, subnormals included), and the f16
// -> f32 conversion is one instruction; the NaN codes stay NaN as in quant/fp8.h.
__device__ __forceinline__ float e4m3_value(uint32_t q) {
    const uint32_t h = ((q & 0x7Fu) << 7) | ((q & 0x80u) << 8);
    const float v = __half2float(__ushort_as_half(static_cast<unsigned short>(h))) * 256.0f;
    return (q & 0x7Fu) == 0x7Fu ? __uint_as_float(0x7FFFFFFFu) : v;
}

// Elements c .. c + 3 of a row (c a multiple of 4), decoded as kv_load_row does. Float rows need 8-byte
// (f16, bf16) or 16-byte (f32) aligned row starts, which the cache layout gives (head dims are multiples
// of 4); block rows are read in 2-byte units (a 34-byte block starts at any even offset).
template <KvType F> __device__ __forceinline__ float4 load4(const uint8_t* row, int c) {
    if constexpr (F == KvType::f32) {
        return *reinterpret_cast<const float4*>(row + 4 * c);
    } else if constexpr (F == KvType::f16 || F == KvType::bf16) {
        const uint2 u = *reinterpret_cast<const uint2*>(row + 2 * c);
        if constexpr (F == KvType::f16) {
            return make_float4(__half2float(__ushort_as_half(static_cast<unsigned short>(u.x & 0xFFFFu))),
                               __half2float(__ushort_as_half(static_cast<unsigned short>(u.x >> 16))),
                               __half2float(__ushort_as_half(static_cast<unsigned short>(u.y & 0xFFFFu))),
                               __half2float(__ushort_as_half(static_cast<unsigned short>(u.y >> 16))));
        } else {
            return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u),
                               __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xFFFF0000u));
        }
    } else {
        const uint8_t* block = row + (c / kBlockElems) * kBlockBytes;
        const float d = __half2float(__ushort_as_half(load_u16(block)));
        const uint8_t* qs = block + 2 + c % kBlockElems;
        const uint32_t lo = load_u16(qs), hi = load_u16(qs + 2);
        if constexpr (F == KvType::q8_0) {
            return make_float4(__fmul_rn(static_cast<float>(static_cast<int8_t>(lo & 0xFFu)), d),
                               __fmul_rn(static_cast<float>(static_cast<int8_t>(lo >> 8)), d),
                               __fmul_rn(static_cast<float>(static_cast<int8_t>(hi & 0xFFu)), d),
                               __fmul_rn(static_cast<float>(static_cast<int8_t>(hi >> 8)), d));
        } else {
            return make_float4(__fmul_rn(d, e4m3_value(lo & 0xFFu)), __fmul_rn(d, e4m3_value(lo >> 8)),
                               __fmul_rn(d, e4m3_value(hi & 0xFFu)), __fmul_rn(d, e4m3_value(hi >> 8)));
        }
    }
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
    return v;
}

// The largest |x| of a block as the CPU's std::max loop finds it: NaN elements never win (they count 0).
__device__ __forceinline__ float block_amax(float x) {
    const float a = fabsf(x);
    return warp_max(a >= 0.0f ? a : 0.0f);
}

// Q8_0 (quant/reference_legacy.cpp quantize_q8): d = amax / 127, codes roundf(x / d) (ties away from
// zero), the scale stored as f16 of the unrounded d. One warp per block, lane j holds element j.
__device__ __forceinline__ void store_q8_0_block(float x, int lane, uint8_t* block) {
    const float amax = block_amax(x);
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    block[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(roundf(__fmul_rn(x, id)))));
    if (lane == 0) *reinterpret_cast<uint16_t*>(block) = f32_to_f16(d);
}

// Scratch of one warp for store_f8_block: the squared errors of 16 candidates (rows of 33 floats, so
// lane k summing row k reads its own bank) and their sums.
inline constexpr int kF8Candidates = 16;
inline constexpr int kF8ScratchFloats = kF8Candidates * 33 + kF8Candidates;

// F8_E4M3 with the KV cache's fast search (quant/reference.cpp quantize_block_f8_e4m3, F8Search::fast):
// the 16 scales amax / 448 * 2^(k/16), each rounded to f16 and encoded with, the one with the least
// squared error kept (the first on ties). One warp per block, lane j holds element j; every lane
// encodes its element under all 16 scales, lane k sums candidate k's errors in element order (as the
// CPU does), and all lanes then pick the winner with the CPU's comparison.
__device__ __forceinline__ void store_f8_block(float x, int lane, uint8_t* block, float* scratch) {
    // kF8ScaleFactor[4k] of quant/reference.cpp: 2^(k/16), the same float literals.
    const float factor[kF8Candidates] = {1.0f,        1.04427373f, 1.09050775f, 1.13878858f, 1.18920708f, 1.24185777f,
                                         1.29683959f, 1.35425556f, 1.41421354f, 1.47682619f, 1.54221082f, 1.61049032f,
                                         1.68179286f, 1.75625217f, 1.8340081f,  1.91520655f};
    const float amax = block_amax(x);
    const float base = __fdiv_rn(amax, E4M3_MAX);
    uint16_t dh = f32_to_f16(base);
    uint8_t code = 0;
    if (f16_to_f32(dh) == 0.0f) { // all zero, or too small for an f16 scale
        code = f32_to_e4m3(__fmul_rn(x, 0.0f));
    } else {
        uint16_t cand_d[kF8Candidates];
        uint8_t cand_q[kF8Candidates];
        TERN_UNROLL
        for (int k = 0; k < kF8Candidates; ++k) {
            cand_d[k] = f32_to_f16(__fmul_rn(base, factor[k]));
            const float d = f16_to_f32(cand_d[k]), id = __fdiv_rn(1.0f, d);
            cand_q[k] = f32_to_e4m3(__fmul_rn(x, id));
            const float e = __fsub_rn(__fmul_rn(d, e4m3_to_f32(cand_q[k])), x);
            scratch[k * 33 + lane] = __fmul_rn(e, e);
        }
        __syncwarp();
        if (lane < kF8Candidates) {
            float err = 0.0f;
            for (int j = 0; j < kBlockElems; ++j)
                err = __fadd_rn(err, scratch[lane * 33 + j]);
            scratch[kF8Candidates * 33 + lane] = err;
        }
        __syncwarp();
        float best = -1.0f;
        int best_k = 0;
        for (int k = 0; k < kF8Candidates; ++k) {
            const float err = scratch[kF8Candidates * 33 + k];
            if (best < 0.0f || err < best) {
                best = err;
                best_k = k;
            }
        }
        __syncwarp(); // every lane has read the sums before the scratch serves the next block
        TERN_UNROLL
        for (int k = 0; k < kF8Candidates; ++k) {
            if (k == best_k) {
                dh = cand_d[k];
                code = cand_q[k];
            }
        }
    }
    block[2 + lane] = code;
    if (lane == 0) *reinterpret_cast<uint16_t*>(block) = dh;
}

// Bytes of one element of a float format.
template <KvType F> constexpr int float_bytes() {
    static_assert(is_float_format(F));
    return F == KvType::f32 ? 4 : 2;
}

// Element i of a float-format row stored as kv_store_row(F) stores it.
template <KvType F> __device__ __forceinline__ void store_float(float x, uint8_t* row, int i) {
    static_assert(is_float_format(F));
    if constexpr (F == KvType::f32)
        reinterpret_cast<float*>(row)[i] = x;
    else if constexpr (F == KvType::f16)
        reinterpret_cast<uint16_t*>(row)[i] = f32_to_f16(x);
    else
        reinterpret_cast<uint16_t*>(row)[i] = f32_to_bf16(x);
}

// Bytes of 32 consecutive elements of a row: the block formats' rows are whole segments (their head
// dims are multiples of 32), and so are the float formats' rows at those head dims.
template <KvType F> constexpr int segment_bytes() {
    return F == KvType::f32 ? 128 : (F == KvType::f16 || F == KvType::bf16) ? 64 : kBlockBytes;
}

// Elements 32s .. 32s + 31 of a row (src[0..31] f32, global or shared) stored as kv_store_row(F) stores
// them, at dst = the row + s * segment_bytes<F>(), by one warp (lane j: element j). `scratch` is the
// warp's kF8ScratchFloats of shared memory (used by f8_e4m3 only).
template <KvType F>
__device__ __forceinline__ void store_segment(const float* src, uint8_t* dst, int lane, float* scratch) {
    const float x = src[lane];
    if constexpr (is_float_format(F))
        store_float<F>(x, dst, lane);
    else if constexpr (F == KvType::q8_0)
        store_q8_0_block(x, lane, dst);
    else
        store_f8_block(x, lane, dst, scratch);
}

// A row of n elements stored by one warp: block formats by whole 32-element segments (n a multiple of
// 32), float formats element by element (lane j: elements j, j + 32, ...), which takes any n.
template <KvType F> __device__ void store_row_warp(const float* src, uint8_t* dst, int n, int lane, float* scratch) {
    if constexpr (is_float_format(F)) {
        for (int i = lane; i < n; i += 32)
            store_float<F>(src[i], dst, i);
    } else {
        for (int s = 0; s < n / kBlockElems; ++s)
            store_segment<F>(src + s * kBlockElems, dst + s * segment_bytes<F>(), lane, scratch);
    }
}

// One row decoded as kv_load_row(F) does, by one warp (dst global or shared; n a multiple of 32 for the
// block formats, any n for the float formats).
template <KvType F> __device__ void load_row_warp(const uint8_t* src, float* dst, int n, int lane) {
    if constexpr (F == KvType::f32) {
        const float* s = reinterpret_cast<const float*>(src);
        for (int i = lane; i < n; i += 32)
            dst[i] = s[i];
    } else if constexpr (F == KvType::f16 || F == KvType::bf16) {
        const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
        for (int i = lane; i < n; i += 32)
            dst[i] = F == KvType::f16 ? f16_to_f32(s[i]) : bf16_to_f32(s[i]);
    } else {
        for (int b = 0; b < n / kBlockElems; ++b) {
            const uint8_t* block = src + b * kBlockBytes;
            const float d = f16_to_f32(load_u16(block));
            const uint8_t q = block[2 + lane];
            dst[b * kBlockElems + lane] = F == KvType::q8_0 ? __fmul_rn(static_cast<float>(static_cast<int8_t>(q)), d)
                                                            : __fmul_rn(d, e4m3_to_f32(q));
        }
    }
}

} // namespace kv_codec
} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
