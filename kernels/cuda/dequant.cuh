#pragma once
// Device-side dequantization of the weight formats, bit for bit the CPU reference (quant/reference.h
// dequantize_row: the arithmetic of quant/reference_legacy.cpp, reference_kquants.cpp, reference_iq4.cpp
// reference_mxfp4.cpp and reference.cpp). For every kernel that reads weights in their uploaded formats.
//
// The unit is a slice of 8 elements of a row, what one lane dequantizes at a time:
//   - block formats: slice q is part s = q % 4 of the 32-element group q / 4 (a whole block of the
//     32-element formats, sub-block (q / 4) % 8 of block q / 32 of the 256-element ones), elements
//     4s .. 4s + 3 and 16 + 4s .. 16 + 4s + 3 of the group. Packed nibbles hold elements t and t + 16 in
//     one byte, so these are one 4-byte word of codes; every format uses the same split so that the four
//     lanes of a group read consecutive words of codes and of activations;
//   - plain float formats (F32, F16, BF16): slice q is elements 8q .. 8q + 7 (one or two 16-byte loads).
// Dequant<T>::slice(row, q, y) writes the slice's values to y[0..7]; y[0..3] are elements first(q) ..
// first(q) + 3 of the row and y[4..7] elements first(q) + kSecond .. first(q) + kSecond + 3.
//
// Bit-exactness: every product and sum of the reference is one correctly rounded f32 operation
// (__fmul_rn / __fsub_rn / __fadd_rn, which nvcc never contracts into an FMA), in the reference's order,
// or an explicit FMA where the product is exact so that the FMA rounds as the two operations would
// (exact_product_add); integer codes and scales become floats exactly (code_to_float). f16 scales
// convert with the hardware conversion, which is exact (NaN payloads aside: the device writes a
// canonical NaN).
//
// Alignment: rows are whole blocks, so a tensor that starts 16-byte aligned keeps every block at its
// natural alignment; loads never go wider than that: bytes for MXFP4's 17-byte blocks, 2-byte halves for
// the 18/22/34/110/210-byte blocks, 4-byte words for the others, 16-byte vectors for the plain formats.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/runtime.h"
#include "kernels/cuda/unroll.h"
#include "quant/blocks.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace dequant {

// ---- small exact conversions --------------------------------------------------------------------

// float(n) - bias exactly, for 0 <= n < 2^22 and a small integer bias: the bits 0x4B000000 | n are the
// float 2^23 + n, and subtracting 2^23 + bias is exact (both are integers below 2^24). An OR and an add
// instead of an int -> float conversion, which runs at a quarter of the rate.
__device__ __forceinline__ float code_to_float(uint32_t n, float bias) {
    return __fsub_rn(__uint_as_float(0x4B000000u | n), 8388608.0f + bias);
}

// a * b + c where the product a * b is exact in f32 (the callers' products have at most 22 significant
// bits: an f16 scale's 11 times small integer codes and scales): one FMA then rounds exactly as the
// reference's separate multiply and add do, in one instruction instead of two.
__device__ __forceinline__ float exact_product_add(float a, float b, float c) { return __fmaf_rn(a, b, c); }

__device__ __forceinline__ float f16_to_float(uint32_t bits) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits & 0xFFFFu)));
}

__device__ __forceinline__ float bf16_to_float(uint32_t bits) { return __uint_as_float(bits << 16); }

// e4m3 (quant/fp8.h): its sign, exponent and mantissa bits moved into an f16's fields (exponent bias 15
// instead of 7) are the same number times 2^-8, subnormals included; the f16 -> f32 conversion and the
// multiplication by 2^8 are exact. 0x7F / 0xFF are NaN in e4m3 (1.875 * 2^8 as an f16 pattern).
__device__ __forceinline__ float e4m3_to_float(uint32_t q) {
    const uint32_t h = ((q & 0x80u) << 8) | ((q & 0x7Fu) << 7);
    const float v = __fmul_rn(f16_to_float(h), 256.0f);
    return (q & 0x7Fu) == 0x7Fu ? __uint_as_float(0x7FC00000u | ((q & 0x80u) << 24)) : v;
}

// kIq4Values[n] as a float (exact), looked up from registers with byte permutes: a table in memory would
// be read with up to 16 different addresses per warp instruction. The words hold kIq4Values[n] + 128 (all
// in 1..241), four per word, little-endian; checked against the code book below.
inline constexpr uint32_t kIq4Word0 = 0x3F2D1801u;   // -127 -104 -83 -65
inline constexpr uint32_t kIq4Word1 = 0x766A5D4Fu;   //  -49  -35 -22 -10
inline constexpr uint32_t kIq4Word2 = 0xA6998D81u;   //    1   13  25  38
inline constexpr uint32_t kIq4Word3 = 0xF1D9C5B5u;   //   53   69  89 113
constexpr bool iq4_words_match_code_book() {
    constexpr uint32_t words[4] = {kIq4Word0, kIq4Word1, kIq4Word2, kIq4Word3};
    for (int n = 0; n < 16; ++n)
        if (static_cast<int>((words[n / 4] >> (8 * (n % 4))) & 0xFFu) - 128 != kIq4Values[n]) return false;
    return true;
}
static_assert(iq4_words_match_code_book());
__device__ __forceinline__ float iq4_value(uint32_t n) {
    const uint32_t sel = n & 7u;   // __byte_perm reads three selector bits (the fourth means sign replication)
    const uint32_t b = (n & 8u) ? __byte_perm(kIq4Word2, kIq4Word3, sel) : __byte_perm(kIq4Word0, kIq4Word1, sel);
    return code_to_float(b & 0xFFu, 128.0f);
}

// kMxfp4Values[n] as a float (exact), the same way: the words hold kMxfp4Values[n] + 128 (116..140), so code 8
// (the doubled E2M1 -0) reads as +0 as in the reference.
inline constexpr uint32_t kMxfp4Word0 = 0x83828180u;   //   0   1   2   3
inline constexpr uint32_t kMxfp4Word1 = 0x8C888684u;   //   4   6   8  12
inline constexpr uint32_t kMxfp4Word2 = 0x7D7E7F80u;   //   0  -1  -2  -3
inline constexpr uint32_t kMxfp4Word3 = 0x74787A7Cu;   //  -4  -6  -8 -12
constexpr bool mxfp4_words_match_code_book() {
    constexpr uint32_t words[4] = {kMxfp4Word0, kMxfp4Word1, kMxfp4Word2, kMxfp4Word3};
    for (int n = 0; n < 16; ++n)
        if (static_cast<int>((words[n / 4] >> (8 * (n % 4))) & 0xFFu) - 128 != kMxfp4Values[n]) return false;
    return true;
}
static_assert(mxfp4_words_match_code_book());
__device__ __forceinline__ float mxfp4_value(uint32_t n) {
    const uint32_t sel = n & 7u;
    const uint32_t b =
        (n & 8u) ? __byte_perm(kMxfp4Word2, kMxfp4Word3, sel) : __byte_perm(kMxfp4Word0, kMxfp4Word1, sel);
    return code_to_float(b & 0xFFu, 128.0f);
}

// MXFP4's half scale 2^(e - 128) (quant/blocks.h mxfp4_scale_half), built from its bits.
__device__ __forceinline__ float mxfp4_half_scale(uint32_t e) {
    return __uint_as_float(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}

// ---- loads and bit fields -----------------------------------------------------------------------

__device__ __forceinline__ uint32_t load_u16(const uint8_t* p) { return *reinterpret_cast<const uint16_t*>(p); }
// A little-endian word from a 4-byte aligned address.
__device__ __forceinline__ uint32_t load_u32(const uint8_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
// A little-endian word from any address (MXFP4's 17-byte blocks leave the codes byte-aligned).
__device__ __forceinline__ uint32_t load_u32_a1(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
           (static_cast<uint32_t>(p[3]) << 24);
}
// A little-endian word from a 2-byte aligned address.
__device__ __forceinline__ uint32_t load_u32_a2(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return static_cast<uint32_t>(h[0]) | (static_cast<uint32_t>(h[1]) << 16);
}

// Slice element i (0..7) in two words of bytes (bytes of elements 4s.. and 16 + 4s..), shifted right by
// `shift` inside its byte.
__device__ __forceinline__ uint32_t byte_of(uint32_t lo, uint32_t hi, int i, int shift) {
    return ((i < 4 ? lo : hi) >> (8 * (i % 4) + shift));
}
// Slice element i (0..7) in one word of packed nibbles: element 4s + i is the low nibble of byte i,
// element 16 + 4s + i the high nibble.
__device__ __forceinline__ uint32_t nibble_of(uint32_t w, int i) { return (w >> (8 * (i % 4) + 4 * (i / 4))) & 15u; }

template <typename Block> __device__ __forceinline__ const uint8_t* block_at(const uint8_t* row, int i) {
    return row + i * static_cast<int>(sizeof(Block));
}

// ---- slice layouts ------------------------------------------------------------------------------

struct BlockSlices {
    static constexpr int kSecond = 16;
    __device__ static int first(int q) { return 32 * (q / 4) + 4 * (q % 4); }
};
struct PlainSlices {
    static constexpr int kSecond = 4;
    __device__ static int first(int q) { return 8 * q; }
};

template <GgmlType T> struct Dequant;

// ---- plain floats -------------------------------------------------------------------------------

template <> struct Dequant<GgmlType::F32> : PlainSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const float4* p = reinterpret_cast<const float4*>(row) + 2 * q;
        const float4 a = p[0], b = p[1];
        y[0] = a.x;
        y[1] = a.y;
        y[2] = a.z;
        y[3] = a.w;
        y[4] = b.x;
        y[5] = b.y;
        y[6] = b.z;
        y[7] = b.w;
    }
};

template <> struct Dequant<GgmlType::F16> : PlainSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint4 v = reinterpret_cast<const uint4*>(row)[q];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) {
            y[2 * i] = f16_to_float(w[i]);
            y[2 * i + 1] = f16_to_float(w[i] >> 16);
        }
    }
};

template <> struct Dequant<GgmlType::BF16> : PlainSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint4 v = reinterpret_cast<const uint4*>(row)[q];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) {
            y[2 * i] = bf16_to_float(w[i] & 0xFFFFu);
            y[2 * i + 1] = __uint_as_float(w[i] & 0xFFFF0000u);
        }
    }
};

// ---- 32-element blocks --------------------------------------------------------------------------

// y = float(q - 8) * d.
template <> struct Dequant<GgmlType::Q4_0> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ4_0>(row, q / 4);
        const float d = f16_to_float(load_u16(b));
        const uint32_t w = load_u32_a2(b + offsetof(BlockQ4_0, qs) + 4 * (q % 4));
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = __fmul_rn(code_to_float(nibble_of(w, i), 8.0f), d);
    }
};

// y = float(q) * d + m.
template <> struct Dequant<GgmlType::Q4_1> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ4_1>(row, q / 4);
        const uint32_t dm = load_u32(b);
        const float d = f16_to_float(dm), m = f16_to_float(dm >> 16);
        const uint32_t w = load_u32(b + offsetof(BlockQ4_1, qs) + 4 * (q % 4));
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = exact_product_add(code_to_float(nibble_of(w, i), 0.0f), d, m);
    }
};

// The fifth bit of element e is bit e of qh: for slice element i, bit 4s + i (i < 4) or 16 + 4s + i - 4.
__device__ __forceinline__ uint32_t q5_high_bit(uint32_t qh, int s, int i) {
    return ((qh >> (4 * s + i % 4 + 16 * (i / 4))) & 1u) << 4;
}

// y = float(q - 16) * d.
template <> struct Dequant<GgmlType::Q5_0> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ5_0>(row, q / 4);
        const int s = q % 4;
        const float d = f16_to_float(load_u16(b));
        const uint32_t qh = load_u32_a2(b + offsetof(BlockQ5_0, qh));
        const uint32_t w = load_u32_a2(b + offsetof(BlockQ5_0, qs) + 4 * s);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = __fmul_rn(code_to_float(nibble_of(w, i) | q5_high_bit(qh, s, i), 16.0f), d);
    }
};

// y = float(q) * d + m.
template <> struct Dequant<GgmlType::Q5_1> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ5_1>(row, q / 4);
        const int s = q % 4;
        const uint32_t dm = load_u32(b);
        const float d = f16_to_float(dm), m = f16_to_float(dm >> 16);
        const uint32_t qh = load_u32(b + offsetof(BlockQ5_1, qh));
        const uint32_t w = load_u32(b + offsetof(BlockQ5_1, qs) + 4 * s);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) {
            const uint32_t code = nibble_of(w, i) | q5_high_bit(qh, s, i);
            y[i] = exact_product_add(code_to_float(code, 0.0f), d, m);
        }
    }
};

// y = float(int8 q) * d; a byte xor 0x80 is q + 128.
template <> struct Dequant<GgmlType::Q8_0> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ8_0>(row, q / 4);
        const float d = f16_to_float(load_u16(b));
        const uint8_t* qs = b + offsetof(BlockQ8_0, qs) + 4 * (q % 4);
        const uint32_t lo = load_u32_a2(qs) ^ 0x80808080u, hi = load_u32_a2(qs + 16) ^ 0x80808080u;
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = __fmul_rn(code_to_float(byte_of(lo, hi, i, 0) & 0xFFu, 128.0f), d);
    }
};

// y = d * e4m3(q).
template <> struct Dequant<GgmlType::F8_E4M3> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockF8_E4M3>(row, q / 4);
        const float d = f16_to_float(load_u16(b));
        const uint8_t* qs = b + offsetof(BlockF8_E4M3, qs) + 4 * (q % 4);
        const uint32_t lo = load_u32_a2(qs), hi = load_u32_a2(qs + 16);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = __fmul_rn(d, e4m3_to_float(byte_of(lo, hi, i, 0) & 0xFFu));
    }
};

// y = d * float(kIq4Values[q]).
template <> struct Dequant<GgmlType::IQ4_NL> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockIQ4_NL>(row, q / 4);
        const float d = f16_to_float(load_u16(b));
        const uint32_t w = load_u32_a2(b + offsetof(BlockIQ4_NL, qs) + 4 * (q % 4));
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = __fmul_rn(d, iq4_value(nibble_of(w, i)));
    }
};

// y = float(kMxfp4Values[q]) * 2^(e - 128): the product is exact (a power of two times an integer up to 12),
// so the order of the factors does not matter. Byte loads: the blocks are 17 bytes.
template <> struct Dequant<GgmlType::MXFP4> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockMXFP4>(row, q / 4);
        const float d = mxfp4_half_scale(b[offsetof(BlockMXFP4, e)]);
        const uint32_t w = load_u32_a1(b + offsetof(BlockMXFP4, qs) + 4 * (q % 4));
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = __fmul_rn(mxfp4_value(nibble_of(w, i)), d);
    }
};

// ---- 256-element super-blocks: sub-block j = (q / 4) % 8 of block q / 32, element l of it ----------

// 16-element halves with scale sc & 15 and min sc >> 4: y = (d * sc) * q - dmin * min; q is bit pair
// j % 4 of qs[32 * (j / 4) + l]. The slice's first four elements are in half 0, the others in half 1.
template <> struct Dequant<GgmlType::Q2_K> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ2_K>(row, q / 32);
        const int j = (q / 4) % 8, s = q % 4;
        const uint32_t dd = load_u32(b + offsetof(BlockQ2_K, d));
        const float d = f16_to_float(dd), dmin = f16_to_float(dd >> 16);
        const uint32_t sc = load_u16(b + offsetof(BlockQ2_K, scales) + 2 * j);
        float dl[2], ml[2];
        TERN_UNROLL
        for (int h = 0; h < 2; ++h) {
            dl[h] = __fmul_rn(d, code_to_float((sc >> (8 * h)) & 15u, 0.0f));
            ml[h] = __fmul_rn(dmin, code_to_float((sc >> (8 * h + 4)) & 15u, 0.0f));
        }
        const uint8_t* qs = b + offsetof(BlockQ2_K, qs) + 32 * (j / 4) + 4 * s;
        const uint32_t lo = load_u32(qs), hi = load_u32(qs + 16);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) {
            const uint32_t code = byte_of(lo, hi, i, 2 * (j % 4)) & 3u;
            y[i] = exact_product_add(dl[i / 4], code_to_float(code, 0.0f), -ml[i / 4]);
        }
    }
};

// 16-element halves with six-bit scales u: y = (d * float(u - 32)) * q, q = the low 2 bits (as Q2_K)
// minus 4 unless bit j of hmask[l] is set.
template <> struct Dequant<GgmlType::Q3_K> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ3_K>(row, q / 32);
        const int j = (q / 4) % 8, s = q % 4;
        const float d = f16_to_float(load_u16(b + offsetof(BlockQ3_K, d)));
        float dl[2];
        TERN_UNROLL
        for (int h = 0; h < 2; ++h) {
            const int u = q3_k_scale(b + offsetof(BlockQ3_K, scales), 2 * j + h);
            dl[h] = __fmul_rn(d, code_to_float(static_cast<uint32_t>(u), 32.0f));
        }
        const uint8_t* hm = b + offsetof(BlockQ3_K, hmask) + 4 * s;
        const uint8_t* qs = b + offsetof(BlockQ3_K, qs) + 32 * (j / 4) + 4 * s;
        const uint32_t h_lo = load_u32_a2(hm), h_hi = load_u32_a2(hm + 16);
        const uint32_t q_lo = load_u32_a2(qs), q_hi = load_u32_a2(qs + 16);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) {
            const uint32_t low = byte_of(q_lo, q_hi, i, 2 * (j % 4)) & 3u;
            const uint32_t high = byte_of(h_lo, h_hi, i, j) & 1u;
            y[i] = __fmul_rn(dl[i / 4], code_to_float(low | (high << 2), 4.0f));   // low + 4 high - 4
        }
    }
};

// Six-bit scale and min per sub-block: y = (d * sc) * q - dmin * m, q nibble j % 2 of qs[32 * (j / 2) + l].
template <> struct Dequant<GgmlType::Q4_K> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ4_K>(row, q / 32);
        const int j = (q / 4) % 8, s = q % 4;
        const uint32_t dd = load_u32(b);
        uint8_t sc, m;
        q4_k_scale_min(b + offsetof(BlockQ4_K, scales), j, sc, m);
        const float dl = __fmul_rn(f16_to_float(dd), code_to_float(sc, 0.0f));
        const float ml = __fmul_rn(f16_to_float(dd >> 16), code_to_float(m, 0.0f));
        const uint8_t* qs = b + offsetof(BlockQ4_K, qs) + 32 * (j / 2) + 4 * s;
        const uint32_t lo = load_u32(qs), hi = load_u32(qs + 16);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) {
            const uint32_t code = byte_of(lo, hi, i, 4 * (j % 2)) & 15u;
            y[i] = exact_product_add(dl, code_to_float(code, 0.0f), -ml);
        }
    }
};

// Q4_K plus bit j of qh[l] as the 16s bit.
template <> struct Dequant<GgmlType::Q5_K> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ5_K>(row, q / 32);
        const int j = (q / 4) % 8, s = q % 4;
        const uint32_t dd = load_u32(b);
        uint8_t sc, m;
        q4_k_scale_min(b + offsetof(BlockQ5_K, scales), j, sc, m);
        const float dl = __fmul_rn(f16_to_float(dd), code_to_float(sc, 0.0f));
        const float ml = __fmul_rn(f16_to_float(dd >> 16), code_to_float(m, 0.0f));
        const uint8_t* qh = b + offsetof(BlockQ5_K, qh) + 4 * s;
        const uint8_t* qs = b + offsetof(BlockQ5_K, qs) + 32 * (j / 2) + 4 * s;
        const uint32_t h_lo = load_u32(qh), h_hi = load_u32(qh + 16);
        const uint32_t q_lo = load_u32(qs), q_hi = load_u32(qs + 16);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) {
            const uint32_t code = (byte_of(q_lo, q_hi, i, 4 * (j % 2)) & 15u) | ((byte_of(h_lo, h_hi, i, j) & 1u) << 4);
            y[i] = exact_product_add(dl, code_to_float(code, 0.0f), -ml);
        }
    }
};

// 16-element halves with signed 8-bit scales: y = (d * sc) * (q - 32). Sub-block j = 4c + r: q is nibble
// r / 2 of ql[64c + 32 (r % 2) + l] with bit pair r of qh[32c + l] above it.
template <> struct Dequant<GgmlType::Q6_K> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockQ6_K>(row, q / 32);
        const int j = (q / 4) % 8, s = q % 4, c = j / 4, r = j % 4;
        const float d = f16_to_float(load_u16(b + offsetof(BlockQ6_K, d)));
        const uint32_t sc = load_u16(b + offsetof(BlockQ6_K, scales) + 2 * j);
        float dl[2];
        TERN_UNROLL
        for (int h = 0; h < 2; ++h) dl[h] = __fmul_rn(d, code_to_float(((sc >> (8 * h)) & 0xFFu) ^ 0x80u, 128.0f));
        const uint8_t* ql = b + offsetof(BlockQ6_K, ql) + 64 * c + 32 * (r % 2) + 4 * s;
        const uint8_t* qh = b + offsetof(BlockQ6_K, qh) + 32 * c + 4 * s;
        const uint32_t l_lo = load_u32_a2(ql), l_hi = load_u32_a2(ql + 16);
        const uint32_t h_lo = load_u32_a2(qh), h_hi = load_u32_a2(qh + 16);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) {
            const uint32_t low = byte_of(l_lo, l_hi, i, 4 * (r / 2)) & 15u;
            const uint32_t high = byte_of(h_lo, h_hi, i, 2 * r) & 3u;
            y[i] = __fmul_rn(dl[i / 4], code_to_float(low | (high << 4), 32.0f));
        }
    }
};

// Six-bit scale ls per sub-block: y = (d * float(ls - 32)) * kIq4Values[q], nibbles packed as IQ4_NL's
// in qs[16 j ..].
template <> struct Dequant<GgmlType::IQ4_XS> : BlockSlices {
    __device__ static void slice(const uint8_t* row, int q, float (&y)[8]) {
        const uint8_t* b = block_at<BlockIQ4_XS>(row, q / 32);
        const int j = (q / 4) % 8, s = q % 4;
        const uint32_t dh = load_u32(b);   // d, scales_h
        const uint32_t sl = load_u32(b + offsetof(BlockIQ4_XS, scales_l));
        const uint32_t ls = ((sl >> (4 * j)) & 15u) | (((dh >> (16 + 2 * j)) & 3u) << 4);
        const float dl = __fmul_rn(f16_to_float(dh), code_to_float(ls, 32.0f));
        const uint32_t w = load_u32(b + offsetof(BlockIQ4_XS, qs) + 16 * j + 4 * s);
        TERN_UNROLL
        for (int i = 0; i < 8; ++i) y[i] = __fmul_rn(dl, iq4_value(nibble_of(w, i)));
    }
};

// ---- scalar access for the plain formats --------------------------------------------------------

inline constexpr bool is_plain(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Element i of a plain float row, for rows whose length is not a multiple of 8.
template <GgmlType T> __device__ __forceinline__ float plain_element(const uint8_t* row, int i) {
    static_assert(is_plain(T), "plain float formats only");
    if constexpr (T == GgmlType::F32) return reinterpret_cast<const float*>(row)[i];
    else if constexpr (T == GgmlType::F16) return f16_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
    else return bf16_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
}

} // namespace dequant
} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
