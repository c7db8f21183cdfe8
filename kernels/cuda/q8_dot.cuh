#pragma once
// Integer dot products of weight codes with int8 activation codes (the "q8 units" of kernels/cuda/matmul_q8.h),
// per weight format, for kernels/cuda/matmul_q8.cu.
//
// The unit is 16 elements of a 32-element group (a block of the 32-element formats, sub-block (u / 2) % 8 of
// super-block u / 16 of the 256-element ones): unit u is half h = u % 2 of group u / 2, elements 8h .. 8h + 7
// and 16 + 8h .. 16 + 8h + 7 of the group, the 16 elements whose codes every format keeps in 8 consecutive
// bytes (twice 8 for the byte-per-element fields). Q8Unit<T>::load(row, u, wu) turns them into four words
// of signed 8-bit codes in the activation's unit order (wu.q[0..1] the first 8 elements, wu.q[2..3] the
// last 8) plus the factors that scale their dot product:
//
//   sum over the unit of w_e * a_e * dx = dx * (d * D + m * S), with
//     D = q[0..3] . a[0..3] (4 dp4a); for Q3_K and Q6_K, whose 16-element halves have integer scales that do
//         not fit a byte together with the code, D = sc[0] * (q[0..1] . a[0..1]) + sc[1] * (q[2..3] . a[2..3])
//         (Q2_K's 2-bit codes and 4-bit scales do: its codes come already scaled);
//     S = min_bytes[0] * sum(a[0..1]) + min_bytes[1] * sum(a[2..3]) (1 dp2a on the stored 8-element sums),
//         only for the formats with an offset: Q4_1, Q5_1 (m = the block's m, min_bytes 1, 1), Q4_K, Q5_K
//         (m = -dmin * m_j, min_bytes 1, 1) and Q2_K (m = -dmin, min_bytes = the two halves' 4-bit mins).
//
// Everything that depends only on the weights (unpacking, code offsets, table lookups, sub-scales) happens
// once per unit in load(); per column there remain the dp4a / dp2a, the integer to float conversion and
// two or three f32 operations. D and S are exact integers; kMaxDot / kMaxSum bound them for codes
// |a| <= 128 (quantize_activations writes |a| <= 127), which picks the exact conversion below.
#include <cstddef>
#include <cstdint>

#include "kernels/cuda/dequant.cuh"
#include "kernels/cuda/format_list.h"
#include "kernels/cuda/runtime.h"
#include "quant/blocks.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace q8dot {

using dequant::code_to_float;
using dequant::f16_to_float;
using dequant::load_u16;
using dequant::load_u32;
using dequant::load_u32_a1;
using dequant::load_u32_a2;

// ---- exact integer -> float -------------------------------------------------------------------------

// float(v) for |v| <= kMaxAbs. Below 2^22 the bits 0x4B400000 + v are the float 1.5 * 2^23 + v (ulp 1 in
// [2^23, 2^24)) and subtracting 1.5 * 2^23 is exact: an integer add and a float add, both full-rate, where
// I2F runs at a quarter of the rate. Larger sums (Q6_K's) take the conversion, exact below 2^24.
template <int kMaxAbs> __device__ __forceinline__ float exact_int_to_float(int v) {
    static_assert(kMaxAbs < (1 << 24), "the integer sum must be exact in f32");
    if constexpr (kMaxAbs < (1 << 22)) return __fsub_rn(__int_as_float(0x4B400000 + v), 12582912.0f);
    else return __int2float_rn(v);
}

// ---- byte-wise helpers ------------------------------------------------------------------------------

inline constexpr uint32_t kLowNibbles = 0x0F0F0F0Fu;

// Every byte minus k, for bytes in [0, 127 + k]: adding 128 - k cannot carry out of a byte, and flipping
// bit 7 then subtracts 128 (two's complement).
__device__ __forceinline__ int bytes_minus(uint32_t w, uint32_t k) {
    return static_cast<int>((w + (128u - k) * 0x01010101u) ^ 0x80808080u);
}

// Bits 0..3 of x to bit 0 of bytes 0..3: x * 0x00204081 places copies of x at bits 0, 7, 14 and 21, which
// do not overlap (no carries), so bit i of x lands on bit 8i.
__device__ __forceinline__ uint32_t spread_bits4(uint32_t x) { return ((x & 15u) * 0x00204081u) & 0x01010101u; }

// An 8-byte word pair from an 8-byte aligned address.
__device__ __forceinline__ uint2 load_u32x2(const uint8_t* p) { return *reinterpret_cast<const uint2*>(p); }

// The IQ4 code book as signed bytes, four per word, looked up with byte permutes (a table in memory would
// be read with up to 32 different addresses per warp instruction); checked against kIq4Values below.
// Scalars rather than an array: device code may use a host constexpr scalar's value, not index an array.
inline constexpr uint32_t kIq4Signed0 = 0xBFAD9881u;   // -127 -104 -83 -65
inline constexpr uint32_t kIq4Signed1 = 0xF6EADDCFu;   //  -49  -35 -22 -10
inline constexpr uint32_t kIq4Signed2 = 0x26190D01u;   //    1   13  25  38
inline constexpr uint32_t kIq4Signed3 = 0x71594535u;   //   53   69  89 113
constexpr bool iq4_signed_words_match_code_book() {
    constexpr uint32_t words[4] = {kIq4Signed0, kIq4Signed1, kIq4Signed2, kIq4Signed3};
    for (int n = 0; n < 16; ++n)
        if (static_cast<int8_t>((words[n / 4] >> (8 * (n % 4))) & 0xFFu) != kIq4Values[n]) return false;
    return true;
}
static_assert(iq4_signed_words_match_code_book());

// MXFP4's doubled E2M1 code book (kMxfp4Values, -12..12) the same way.
inline constexpr uint32_t kMxfp4Signed0 = 0x03020100u;   //  0  1  2   3
inline constexpr uint32_t kMxfp4Signed1 = 0x0C080604u;   //  4  6  8  12
inline constexpr uint32_t kMxfp4Signed2 = 0xFDFEFF00u;   //  0 -1 -2  -3
inline constexpr uint32_t kMxfp4Signed3 = 0xF4F8FAFCu;   // -4 -6 -8 -12
constexpr bool mxfp4_signed_words_match_code_book() {
    constexpr uint32_t words[4] = {kMxfp4Signed0, kMxfp4Signed1, kMxfp4Signed2, kMxfp4Signed3};
    for (int n = 0; n < 16; ++n)
        if (static_cast<int8_t>((words[n / 4] >> (8 * (n % 4))) & 0xFFu) != kMxfp4Values[n]) return false;
    return true;
}
static_assert(mxfp4_signed_words_match_code_book());

// Entry n_i of a 16-entry signed-byte code book (four words, entries 0-3, 4-7, 8-11, 12-15) for the four
// indices n_i (0..15) in the bytes of `idx`, as four signed bytes. __byte_perm takes four 3-bit selectors in
// the low 16 bits (its fourth bit means sign replication on the device, so it stays clear): both halves of
// the code book are looked up and bit 3 of each index picks one.
template <uint32_t W0, uint32_t W1, uint32_t W2, uint32_t W3>
__device__ __forceinline__ int code_book_lookup(uint32_t idx) {
    const uint32_t low3 = idx & 0x07070707u;
    const uint32_t pairs = low3 | (low3 >> 4);                 // byte 0: n0 | n1 << 4, byte 2: n2 | n3 << 4
    const uint32_t sel = __byte_perm(pairs, 0u, 0x0020u);      // bytes 0 and 2 of `pairs` side by side
    const uint32_t lo = __byte_perm(W0, W1, sel);
    const uint32_t hi = __byte_perm(W2, W3, sel);
    const uint32_t upper = ((idx >> 3) & 0x01010101u) * 0xFFu;   // 0xFF in the bytes whose index is >= 8
    return static_cast<int>((lo & ~upper) | (hi & upper));
}
__device__ __forceinline__ int iq4_lookup(uint32_t idx) {
    return code_book_lookup<kIq4Signed0, kIq4Signed1, kIq4Signed2, kIq4Signed3>(idx);
}
__device__ __forceinline__ int mxfp4_lookup(uint32_t idx) {
    return code_book_lookup<kMxfp4Signed0, kMxfp4Signed1, kMxfp4Signed2, kMxfp4Signed3>(idx);
}

// ---- the unit -------------------------------------------------------------------------------------

struct WeightUnit {
    int q[4];              // signed 8-bit codes, in the activation unit's order
    float d;               // factor of the code dot product D
    float m;               // factor of the activation-sum term S (offset formats)
    int sc[2];             // integer scales of the two 8-element halves (Q3_K, Q6_K)
    uint32_t min_bytes;    // bytes 0 and 1: integer weights of the two halves' activation sums in S
};

// Unit u of a 32-element-block row: the block and half.
template <typename Block> __device__ __forceinline__ const uint8_t* block_of_unit(const uint8_t* row, int u) {
    return row + (u >> 1) * static_cast<int>(sizeof(Block));
}
// Unit u of a 256-element super-block row: the super-block, sub-block j = (u / 2) % 8.
template <typename Block> __device__ __forceinline__ const uint8_t* super_block_of_unit(const uint8_t* row, int u) {
    return row + (u >> 4) * static_cast<int>(sizeof(Block));
}

// Eight bytes of packed nibbles (element t in the low nibble of byte t, t + 16 in the high one): the low
// nibbles are the unit's first 8 elements, the high nibbles its last 8.
__device__ __forceinline__ void split_nibbles(uint32_t w0, uint32_t w1, uint32_t (&n)[4]) {
    n[0] = w0 & kLowNibbles;
    n[1] = w1 & kLowNibbles;
    n[2] = (w0 >> 4) & kLowNibbles;
    n[3] = (w1 >> 4) & kLowNibbles;
}

// Bit 4 of the unit's four code words from a 32-bit qh whose bit e belongs to element e of the block: the
// words hold elements 8h, 8h + 4, 16 + 8h and 20 + 8h onwards.
__device__ __forceinline__ void add_q5_high_bits(uint32_t qh, int h, uint32_t (&n)[4]) {
    const int base = 8 * h;
    n[0] |= spread_bits4(qh >> base) << 4;
    n[1] |= spread_bits4(qh >> (base + 4)) << 4;
    n[2] |= spread_bits4(qh >> (base + 16)) << 4;
    n[3] |= spread_bits4(qh >> (base + 20)) << 4;
}

// Four words at p, p + 4, p + 16, p + 20 (a unit's two 8-byte halves of a byte-per-element field).
__device__ __forceinline__ void load_unit_bytes_a2(const uint8_t* p, uint32_t (&w)[4]) {
    w[0] = load_u32_a2(p);
    w[1] = load_u32_a2(p + 4);
    w[2] = load_u32_a2(p + 16);
    w[3] = load_u32_a2(p + 20);
}
__device__ __forceinline__ void load_unit_bytes_a4(const uint8_t* p, uint32_t (&w)[4]) {
    w[0] = load_u32(p);
    w[1] = load_u32(p + 4);
    w[2] = load_u32(p + 16);
    w[3] = load_u32(p + 20);
}
__device__ __forceinline__ void load_unit_bytes_a8(const uint8_t* p, uint32_t (&w)[4]) {
    const uint2 a = load_u32x2(p), b = load_u32x2(p + 16);
    w[0] = a.x;
    w[1] = a.y;
    w[2] = b.x;
    w[3] = b.y;
}

// The head of a Q4_K / Q5_K super-block (d and dmin, then the 12 scale bytes) in one 16-byte load, and
// sub-block j's six-bit scale and min from it as quant/blocks.h's q4_k_scale_min finds them, with selects
// instead of its branch and byte loads: the branch split a lane's unrolled units into blocks, so ptxas could
// not issue the next unit's loads before this one's arithmetic. On an H100 this made the 8-column kernels
// 1.6-2.4x faster and left the one-column (decode) ones as they were (bench/results/gpu-2026-11-26-f11600f.md).
// Super-blocks of 144 and 176 bytes from a 16-byte aligned row are 16-byte aligned.
static_assert(offsetof(BlockQ4_K, scales) == 4 && offsetof(BlockQ5_K, scales) == 4 && sizeof(BlockQ4_K) % 16 == 0 &&
              sizeof(BlockQ5_K) % 16 == 0);
__device__ __forceinline__ void q4_k_head(const uint8_t* block, int j, uint32_t& dd, uint32_t& sc, uint32_t& m) {
    const uint4 h = *reinterpret_cast<const uint4*>(block);
    const int k = 8 * (j & 3);
    const uint32_t s0 = (h.y >> k) & 0xFFu, s4 = (h.z >> k) & 0xFFu, s8 = (h.w >> k) & 0xFFu;   // scales[k/8 + 0, 4, 8]
    const bool low = j < 4;
    sc = low ? s0 & 63u : (s8 & 15u) | ((s0 >> 6) << 4);
    m = low ? s4 & 63u : (s8 >> 4) | ((s4 >> 6) << 4);
    dd = h.x;
}

// Traits: kTwoScales (D uses sc), kOffset (the S term exists), kMaxDot / kMaxSum (bounds of |D| / |S| for
// |a| <= 128), load().
template <GgmlType T> struct Q8Unit;

struct SingleScale {
    static constexpr bool kTwoScales = false, kOffset = false;
    static constexpr int kMaxSum = 0;
};
struct ScaleAndOffset {
    static constexpr bool kTwoScales = false, kOffset = true;
    static constexpr int kMaxSum = 16 * 128;   // S = sum(a) over the unit (min_bytes = 1, 1)
};

// w = d * (q - 8).
template <> struct Q8Unit<GgmlType::Q4_0> : SingleScale {
    static constexpr int kMaxDot = 16 * 8 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = block_of_unit<BlockQ4_0>(row, u);
        const uint8_t* qs = b + offsetof(BlockQ4_0, qs) + 8 * (u & 1);
        uint32_t n[4];
        split_nibbles(load_u32_a2(qs), load_u32_a2(qs + 4), n);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = bytes_minus(n[i], 8);
        wu.d = f16_to_float(load_u16(b));
    }
};

// The d and m that lead a Q4_1 / Q5_1 block (two f16, one 4-byte load); S counts each 8-element sum once.
__device__ __forceinline__ void load_d_and_m(const uint8_t* b, WeightUnit& wu) {
    const uint32_t dm = load_u32(b);
    wu.d = f16_to_float(dm);
    wu.m = f16_to_float(dm >> 16);
    wu.min_bytes = 0x0101u;
}

// w = d * q + m.
template <> struct Q8Unit<GgmlType::Q4_1> : ScaleAndOffset {
    static constexpr int kMaxDot = 16 * 15 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = block_of_unit<BlockQ4_1>(row, u);
        const uint8_t* qs = b + offsetof(BlockQ4_1, qs) + 8 * (u & 1);
        uint32_t n[4];
        split_nibbles(load_u32(qs), load_u32(qs + 4), n);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = static_cast<int>(n[i]);
        load_d_and_m(b, wu);
    }
};

// w = d * (q - 16), bit 4 of q from qh.
template <> struct Q8Unit<GgmlType::Q5_0> : SingleScale {
    static constexpr int kMaxDot = 16 * 16 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = block_of_unit<BlockQ5_0>(row, u);
        const uint8_t* qs = b + offsetof(BlockQ5_0, qs) + 8 * (u & 1);
        uint32_t n[4];
        split_nibbles(load_u32_a2(qs), load_u32_a2(qs + 4), n);
        add_q5_high_bits(load_u32_a2(b + offsetof(BlockQ5_0, qh)), u & 1, n);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = bytes_minus(n[i], 16);
        wu.d = f16_to_float(load_u16(b));
    }
};

// w = d * q + m, bit 4 of q from qh. 24-byte blocks keep qs 8-byte aligned.
template <> struct Q8Unit<GgmlType::Q5_1> : ScaleAndOffset {
    static constexpr int kMaxDot = 16 * 31 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = block_of_unit<BlockQ5_1>(row, u);
        const uint2 w = load_u32x2(b + offsetof(BlockQ5_1, qs) + 8 * (u & 1));
        uint32_t n[4];
        split_nibbles(w.x, w.y, n);
        add_q5_high_bits(load_u32(b + offsetof(BlockQ5_1, qh)), u & 1, n);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = static_cast<int>(n[i]);
        load_d_and_m(b, wu);
    }
};

// w = d * q, q signed bytes.
template <> struct Q8Unit<GgmlType::Q8_0> : SingleScale {
    static constexpr int kMaxDot = 16 * 128 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = block_of_unit<BlockQ8_0>(row, u);
        uint32_t w[4];
        load_unit_bytes_a2(b + offsetof(BlockQ8_0, qs) + 8 * (u & 1), w);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = static_cast<int>(w[i]);
        wu.d = f16_to_float(load_u16(b));
    }
};

// w = d * kIq4Values[q].
template <> struct Q8Unit<GgmlType::IQ4_NL> : SingleScale {
    static constexpr int kMaxDot = 16 * 127 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = block_of_unit<BlockIQ4_NL>(row, u);
        const uint8_t* qs = b + offsetof(BlockIQ4_NL, qs) + 8 * (u & 1);
        uint32_t n[4];
        split_nibbles(load_u32_a2(qs), load_u32_a2(qs + 4), n);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = iq4_lookup(n[i]);
        wu.d = f16_to_float(load_u16(b));
    }
};

// w = 2^(e - 128) * kMxfp4Values[q]; byte loads, the blocks being 17 bytes.
template <> struct Q8Unit<GgmlType::MXFP4> : SingleScale {
    static constexpr int kMaxDot = 16 * 12 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = block_of_unit<BlockMXFP4>(row, u);
        const uint8_t* qs = b + offsetof(BlockMXFP4, qs) + 8 * (u & 1);
        uint32_t n[4];
        split_nibbles(load_u32_a1(qs), load_u32_a1(qs + 4), n);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = mxfp4_lookup(n[i]);
        wu.d = dequant::mxfp4_half_scale(b[offsetof(BlockMXFP4, e)]);
    }
};

// ---- 256-element super-blocks: sub-block j = (u / 2) % 8, bytes t = 8h .. 8h + 7 and 16 + 8h .. of its
// 32-byte fields --------------------------------------------------------------------------------------

// w = (d * sc) * q - dmin * m per 16 elements: the unit's two halves have their own scale and min. A
// 2-bit code times a 4-bit scale is at most 45, so one integer multiply scales four packed codes without
// carries between bytes: the codes enter the dot product already scaled (d is the f32 factor), and the
// mins go into min_bytes, with -dmin as the f32 factor of S.
template <> struct Q8Unit<GgmlType::Q2_K> {
    static constexpr bool kTwoScales = false, kOffset = true;
    static constexpr int kMaxDot = 16 * 3 * 15 * 128, kMaxSum = 16 * 15 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = super_block_of_unit<BlockQ2_K>(row, u);
        const int j = (u >> 1) & 7;
        uint32_t w[4];
        load_unit_bytes_a4(b + offsetof(BlockQ2_K, qs) + 32 * (j >> 2) + 8 * (u & 1), w);
        const uint32_t sc = load_u16(b + offsetof(BlockQ2_K, scales) + 2 * j);   // halves 2j, 2j + 1
        const uint32_t scale[2] = {sc & 15u, (sc >> 8) & 15u};
        const int shift = 2 * (j & 3);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = static_cast<int>(((w[i] >> shift) & 0x03030303u) * scale[i / 2]);
        wu.min_bytes = (sc >> 4) & 0x0F0Fu;   // the two high nibbles, one per byte
        const uint32_t dd = load_u32(b + offsetof(BlockQ2_K, d));
        wu.d = f16_to_float(dd);
        wu.m = -f16_to_float(dd >> 16);
    }
};

// w = (d * (u - 32)) * (q2 + 4 h - 4) per 16 elements.
template <> struct Q8Unit<GgmlType::Q3_K> : SingleScale {
    static constexpr bool kTwoScales = true;
    static constexpr int kMaxDot = 16 * 4 * 32 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = super_block_of_unit<BlockQ3_K>(row, u);
        const int j = (u >> 1) & 7, h = u & 1;
        uint32_t lo[4], hm[4];
        load_unit_bytes_a2(b + offsetof(BlockQ3_K, qs) + 32 * (j >> 2) + 8 * h, lo);
        load_unit_bytes_a2(b + offsetof(BlockQ3_K, hmask) + 8 * h, hm);
        const int shift = 2 * (j & 3);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i)
            wu.q[i] = bytes_minus(((lo[i] >> shift) & 0x03030303u) | (((hm[i] >> j) & 0x01010101u) << 2), 4);
        wu.sc[0] = q3_k_scale(b + offsetof(BlockQ3_K, scales), 2 * j) - 32;
        wu.sc[1] = q3_k_scale(b + offsetof(BlockQ3_K, scales), 2 * j + 1) - 32;
        wu.d = f16_to_float(load_u16(b + offsetof(BlockQ3_K, d)));
    }
};

// w = (d * sc) * q - dmin * m per 32 elements: the whole unit shares sc and m, so they go into the f32
// factors (d * sc and dmin * m are exact: 11-bit halves times 6-bit integers).
template <> struct Q8Unit<GgmlType::Q4_K> : ScaleAndOffset {
    static constexpr int kMaxDot = 16 * 15 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = super_block_of_unit<BlockQ4_K>(row, u);
        const int j = (u >> 1) & 7;
        uint32_t w[4];
        load_unit_bytes_a8(b + offsetof(BlockQ4_K, qs) + 32 * (j >> 1) + 8 * (u & 1), w);
        const int shift = 4 * (j & 1);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = static_cast<int>((w[i] >> shift) & kLowNibbles);
        uint32_t dd, sc, m;
        q4_k_head(b, j, dd, sc, m);
        wu.d = __fmul_rn(f16_to_float(dd), code_to_float(sc, 0.0f));
        wu.m = -__fmul_rn(f16_to_float(dd >> 16), code_to_float(m, 0.0f));
        wu.min_bytes = 0x0101u;
    }
};

// Q4_K plus bit j of qh[t] as the 16s bit.
template <> struct Q8Unit<GgmlType::Q5_K> : ScaleAndOffset {
    static constexpr int kMaxDot = 16 * 31 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = super_block_of_unit<BlockQ5_K>(row, u);
        const int j = (u >> 1) & 7, h = u & 1;
        uint32_t w[4], hb[4];
        load_unit_bytes_a8(b + offsetof(BlockQ5_K, qs) + 32 * (j >> 1) + 8 * h, w);
        load_unit_bytes_a8(b + offsetof(BlockQ5_K, qh) + 8 * h, hb);
        const int shift = 4 * (j & 1);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i)
            wu.q[i] = static_cast<int>(((w[i] >> shift) & kLowNibbles) | (((hb[i] >> j) & 0x01010101u) << 4));
        uint32_t dd, sc, m;
        q4_k_head(b, j, dd, sc, m);
        wu.d = __fmul_rn(f16_to_float(dd), code_to_float(sc, 0.0f));
        wu.m = -__fmul_rn(f16_to_float(dd >> 16), code_to_float(m, 0.0f));
        wu.min_bytes = 0x0101u;
    }
};

// w = (d * sc) * (q - 32) per 16 elements, sc signed. Sub-block j = 4c + r: q is nibble r / 2 of
// ql[64c + 32 (r % 2) + t] with bit pair r of qh[32c + t] above it. |D| can reach 2^23 (sc = -128 and
// q - 32 = -32 throughout): converted with I2F.
template <> struct Q8Unit<GgmlType::Q6_K> : SingleScale {
    static constexpr bool kTwoScales = true;
    static constexpr int kMaxDot = 16 * 32 * 128 * 128;   // 2^23
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = super_block_of_unit<BlockQ6_K>(row, u);
        const int j = (u >> 1) & 7, h = u & 1, c = j >> 2, r = j & 3;
        uint32_t lo[4], hi[4];
        load_unit_bytes_a2(b + offsetof(BlockQ6_K, ql) + 64 * c + 32 * (r & 1) + 8 * h, lo);
        load_unit_bytes_a2(b + offsetof(BlockQ6_K, qh) + 32 * c + 8 * h, hi);
        const int lo_shift = 4 * (r >> 1), hi_shift = 2 * r;
        TERN_UNROLL
        for (int i = 0; i < 4; ++i)
            wu.q[i] = bytes_minus(((lo[i] >> lo_shift) & kLowNibbles) | (((hi[i] >> hi_shift) & 0x03030303u) << 4), 32);
        const uint32_t sc = load_u16(b + offsetof(BlockQ6_K, scales) + 2 * j);   // halves 2j, 2j + 1
        wu.sc[0] = static_cast<int8_t>(sc & 0xFFu);
        wu.sc[1] = static_cast<int8_t>(sc >> 8);
        wu.d = f16_to_float(load_u16(b + offsetof(BlockQ6_K, d)));
    }
};

// w = (d * (ls - 32)) * kIq4Values[q] per 32 elements; the nibbles of sub-block j are IQ4_NL's, in
// qs[16 j ..], 8-byte aligned (136-byte blocks, qs at 8).
template <> struct Q8Unit<GgmlType::IQ4_XS> : SingleScale {
    static constexpr int kMaxDot = 16 * 127 * 128;
    __device__ static void load(const uint8_t* row, int u, WeightUnit& wu) {
        const uint8_t* b = super_block_of_unit<BlockIQ4_XS>(row, u);
        const int j = (u >> 1) & 7;
        const uint2 w = load_u32x2(b + offsetof(BlockIQ4_XS, qs) + 16 * j + 8 * (u & 1));
        uint32_t n[4];
        split_nibbles(w.x, w.y, n);
        TERN_UNROLL
        for (int i = 0; i < 4; ++i) wu.q[i] = iq4_lookup(n[i]);
        const uint32_t dh = load_u32(b);   // d, scales_h
        const uint32_t sl = load_u32(b + offsetof(BlockIQ4_XS, scales_l));
        const uint32_t ls = ((sl >> (4 * j)) & 15u) | (((dh >> (16 + 2 * j)) & 3u) << 4);
        wu.d = __fmul_rn(f16_to_float(dh), code_to_float(ls, 32.0f));
    }
};

// ---- per column -------------------------------------------------------------------------------------

// acc + dx * (d * D + m * S) for one column's unit: codes a (16 bytes) and meta = {dx bits, the two
// 8-element sums as int16}.
template <GgmlType T>
__device__ __forceinline__ float accumulate(const WeightUnit& w, const int4& a, const uint2& meta, float acc) {
    using U = Q8Unit<T>;
    int dot;
    if constexpr (U::kTwoScales) {
        const int first = __dp4a(w.q[1], a.y, __dp4a(w.q[0], a.x, 0));
        const int last = __dp4a(w.q[3], a.w, __dp4a(w.q[2], a.z, 0));
        dot = w.sc[0] * first + w.sc[1] * last;
    } else {
        dot = __dp4a(w.q[3], a.w, __dp4a(w.q[2], a.z, __dp4a(w.q[1], a.y, __dp4a(w.q[0], a.x, 0))));
    }
    float t = __fmul_rn(w.d, exact_int_to_float<U::kMaxDot>(dot));
    if constexpr (U::kOffset) {
        const int sum = __dp2a_lo(static_cast<int>(meta.y), static_cast<int>(w.min_bytes), 0);
        t = __fmaf_rn(w.m, exact_int_to_float<U::kMaxSum>(sum), t);
    }
    return __fmaf_rn(__uint_as_float(meta.x), t, acc);
}

// The formats with a Q8Unit: those matmul_q8 and gemm_q8 read.
using Formats = FormatList<GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0,
                           GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K,
                           GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4>;

} // namespace q8dot
} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
