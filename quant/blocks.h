#pragma once
// Block layouts of the quantized tensor formats, byte for byte as in ../shared/FORMATS.md §3.
// Constants keep their GGUF names (QK4_0, QK_K, ...) so they can be checked against the format's
// documentation. f16 fields are raw uint16_t bits (quant/half.h converts them). Every struct has
// alignment <= 4 and no padding, so a tensor is a plain array of blocks; sizes are asserted below.
// Elements are numbered e = 0 .. block size - 1; the comments give where element e lives.
#include <cstddef>
#include <cstdint>

#include "quant/half.h"

namespace tern {

inline constexpr int QK4_0 = 32;
inline constexpr int QK4_1 = 32;
inline constexpr int QK5_0 = 32;
inline constexpr int QK5_1 = 32;
inline constexpr int QK8_0 = 32;
inline constexpr int QK8_1 = 32;
inline constexpr int QK4_NL = 32;
inline constexpr int QK_K = 256;          // k-quant and IQ4_XS super-block
inline constexpr int K_SCALE_SIZE = 12;   // packed 6-bit scales/mins of Q4_K/Q5_K
inline constexpr int QK_F8 = 32;          // tern's F8_E4M3
inline constexpr int QK_MXFP4 = 32;

// IQ4_NL / IQ4_XS non-linear code book (FORMATS.md §3.1).
inline constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// MXFP4's E2M1 code book, every value doubled so it is an integer (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
// negatives become 0..12); the block scale is halved to match (mxfp4_scale_half).
inline constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// qs[j] holds element j in its low nibble and element j + 16 in its high nibble; y = float(q - 8) * d.
struct BlockQ4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
// y = float(q) * d + m.
struct BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
};
// Bit e of qh (a little-endian u32, kept as bytes so the struct has no padding) is bit 4 of q_e.
struct BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
struct BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
struct BlockQ8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
// s = f16(float(sum of qs) * d): the activation-side type of Q4_1/Q5_1 dot products.
struct BlockQ8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK8_1];
};

// 16 sub-blocks of 16: scales[j] low nibble = scale, high nibble = min.
// qs[32c + l] holds elements 128c + l, +32, +64, +96 in bit pairs 0-1, 2-3, 4-5, 6-7.
struct BlockQ2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
// Low 2 bits as Q2_K; hmask[e % 32] bit e / 32 set means q = q2, clear means q = q2 - 4.
// 16 six-bit scales packed into 12 bytes (see q3_k_scale()).
struct BlockQ3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
// 8 sub-blocks of 32 with 6-bit scale and min (see q4_k_scale_min()). qs[32 * (e / 64) + e % 32]:
// low nibble when e % 64 < 32, else high nibble.
struct BlockQ4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
// Q4_K plus bit e / 32 of qh[e % 32] as the 16s bit.
struct BlockQ5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
// 16 sub-blocks of 16, signed 8-bit scales; d may be negative. See FORMATS.md §3.5 for ql/qh.
struct BlockQ6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
// Activation type: f32 scale, bsums[k] = sum of qs[16k .. 16k + 15].
struct BlockQ8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
// Like Q4_0 but y = d * float(kIq4Values[q]).
struct BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[QK4_NL / 2];
};
// 8 sub-blocks of 32, 6-bit scales ls (low 4 bits in scales_l, high 2 in scales_h), y = d * (ls - 32) * T[q].
// qs[16 * ib + t % 16] holds element t of sub-block ib: low nibble for t < 16, else high.
struct BlockIQ4_XS {
    uint16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};
// tern's F8_E4M3 (id 1000, models.md): y = F(d) * e4m3_to_f32(qs[e]).
struct BlockF8_E4M3 {
    uint16_t d;
    uint8_t qs[QK_F8];
};
// MXFP4 (GGUF id 39): an E8M0 exponent e (scale 2^(e - 127)) and 32 E2M1 codes packed like Q4_0's;
// y = mxfp4_scale_half(e) * float(kMxfp4Values[q]).
struct BlockMXFP4 {
    uint8_t e;
    uint8_t qs[QK_MXFP4 / 2];
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ8_K) == 292);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockF8_E4M3) == 34);
static_assert(sizeof(BlockMXFP4) == 17);

// Half the E8M0 scale, 2^(e - 128), exactly (it is what the doubled code book multiplies). e = 0 and 1 give
// the subnormals 2^-128 and 2^-127; e = 255 (E8M0's NaN) reads as 2^127, as in ggml.
TERN_HOST_DEVICE constexpr float mxfp4_scale_half(uint8_t e) {
    return f32_from_bits(e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23);
}

// Six-bit scale u_j (0..63) of Q3_K sub-block j (0..15); the effective scale is d * (u_j - 32).
TERN_HOST_DEVICE constexpr int q3_k_scale(const uint8_t* scales, int j) {
    const int low = j < 8 ? (scales[j] & 15) : (scales[j - 8] >> 4);
    return low | (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

// Six-bit scale and min of Q4_K/Q5_K sub-block j (0..7).
TERN_HOST_DEVICE constexpr void q4_k_scale_min(const uint8_t* scales, int j, uint8_t& sc, uint8_t& m) {
    if (j < 4) {
        sc = scales[j] & 63;
        m = scales[j + 4] & 63;
    } else {
        sc = static_cast<uint8_t>((scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4));
        m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
    }
}

// Six-bit scale (0..63) of IQ4_XS sub-block ib (0..7); the effective scale is d * (ls - 32).
TERN_HOST_DEVICE constexpr int iq4_xs_scale(const BlockIQ4_XS& b, int ib) {
    return ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 15) | (((b.scales_h >> (2 * ib)) & 3) << 4);
}

} // namespace tern
