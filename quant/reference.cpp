// Row-level dispatch of the scalar reference formats, plus the plain float formats and tern's
// F8_E4M3 (models.md). Per-family block code lives in reference_legacy.cpp, reference_kquants.cpp
// and reference_iq4.cpp.
#include "quant/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "base/error.h"
#include "quant/fp8.h"
#include "quant/reference_blocks.h"

namespace tern {

// ---- F8_E4M3 ------------------------------------------------------------------------------------

void dequantize_block(const BlockF8_E4M3& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < QK_F8; ++j) y[j] = d * e4m3_to_f32(b.qs[j]);
}

// e4m3 is a float format, so every block scale sees the same relative step; what the scale does
// choose is where the values fall between codes. The first element with the largest |x| mapping to
// 448 (d = amax / 448) is one choice; scales up to 2x larger (the next binade repeats the grid)
// shift every value's position, so the encoder tries kF8ScaleSteps of them, spaced evenly in log2,
// and keeps the one with the least squared error of the dequantized block (ties: the smallest d).
// Then one least-squares step: for the chosen codes q the best scale is sum x q / sum q^2, and
// re-encoding with it is kept when that lowers the error again. The error is jagged in d (every
// code flips at its own d), so a finer grid keeps paying: relative RMS error on gaussian blocks is
// 2.40% for amax / 448 alone, 1.95% with 16 steps, 1.80% with 64 and 1.786% with 64 plus the
// least-squares step, against 1.783% for 1024 steps (f16's resolution); 64 + 1 costs 65 encodes.
// Each candidate is encoded with the f16-rounded scale it will be decoded with.
constexpr int kF8ScaleSteps = 64;
// 2^(k/64), k = 0..63, as literals (no libm in the byte-defining path).
constexpr float kF8ScaleFactor[kF8ScaleSteps] = {
    1.0f,        1.01088929f, 1.0218972f,  1.03302491f, 1.04427373f, 1.05564523f, 1.06714046f, 1.07876074f,
    1.09050775f, 1.10238254f, 1.1143868f,  1.12652159f, 1.13878858f, 1.15118921f, 1.1637249f,  1.17639697f,
    1.18920708f, 1.20215678f, 1.21524739f, 1.22848058f, 1.24185777f, 1.25538075f, 1.26905096f, 1.28287005f,
    1.29683959f, 1.31096125f, 1.32523668f, 1.33966756f, 1.35425556f, 1.36900246f, 1.38390994f, 1.39897966f,
    1.41421354f, 1.42961335f, 1.44518077f, 1.46091783f, 1.47682619f, 1.49290776f, 1.50916445f, 1.52559817f,
    1.54221082f, 1.55900443f, 1.5759809f,  1.59314215f, 1.61049032f, 1.62802744f, 1.64575553f, 1.66367662f,
    1.68179286f, 1.70010638f, 1.71861935f, 1.73733389f, 1.75625217f, 1.77537644f, 1.79470909f, 1.81425214f,
    1.8340081f,  1.85397911f, 1.87416768f, 1.89457595f, 1.91520655f, 1.93606174f, 1.95714414f, 1.97845602f};

// Encodes x with the f16 scale dh into qs and returns the squared error of the dequantized block.
float f8_encode_block(const float* x, uint16_t dh, uint8_t* qs) {
    const float d = f16_to_f32(dh), id = 1.0f / d;
    float err = 0.0f;
    for (int j = 0; j < QK_F8; ++j) {
        qs[j] = f32_to_e4m3(x[j] * id);
        const float e = d * e4m3_to_f32(qs[j]) - x[j];
        err += e * e;
    }
    return err;
}

void quantize_block_f8_e4m3(const float* x, BlockF8_E4M3& b, F8Search search) {
    float amax = 0.0f;
    for (int j = 0; j < QK_F8; ++j) amax = std::max(amax, std::fabs(x[j]));
    b.d = f32_to_f16(amax / E4M3_MAX);
    const float d0 = f16_to_f32(b.d);
    if (d0 == 0.0f) {   // all zero, or too small for an f16 scale: zero codes
        for (int j = 0; j < QK_F8; ++j) b.qs[j] = f32_to_e4m3(x[j] * 0.0f);
        return;
    }
    // The fast search takes every 4th factor: 2^(k/16), k = 0..15, as before 6492836.
    const int stride = search == F8Search::fast ? 4 : 1;
    uint8_t trial[QK_F8];
    float best = -1.0f;
    for (int k = 0; k < kF8ScaleSteps; k += stride) {
        const uint16_t dh = f32_to_f16(amax / E4M3_MAX * kF8ScaleFactor[k]);
        const float err = f8_encode_block(x, dh, trial);
        if (best < 0.0f || err < best) {
            best = err;
            b.d = dh;
            std::memcpy(b.qs, trial, QK_F8);
        }
    }
    if (search == F8Search::fast) return;
    float sxq = 0.0f, sqq = 0.0f;
    for (int j = 0; j < QK_F8; ++j) {
        const float q = e4m3_to_f32(b.qs[j]);
        sxq += x[j] * q;
        sqq += q * q;
    }
    // sxq > 0 whenever a code is non-zero (each code has the sign of its x). A scale below the first
    // candidate's would saturate the largest element at 448, which the search never does either.
    if (!(sqq > 0.0f) || !(sxq > 0.0f)) return;
    const uint16_t dh = f32_to_f16(sxq / sqq);
    if (dh == b.d || dh >= 0x7C00u || f16_to_f32(dh) < d0) return;
    const float err = f8_encode_block(x, dh, trial);
    if (err < best) {
        b.d = dh;
        std::memcpy(b.qs, trial, QK_F8);
    }
}

void quantize_block(const float* x, BlockF8_E4M3& b) { quantize_block_f8_e4m3(x, b, F8Search::full); }

void quantize_row_f8_e4m3_fast(const float* src, void* dst, int64_t n) {
    auto* out = static_cast<BlockF8_E4M3*>(dst);
    for (int64_t i = 0; i < n / QK_F8; ++i) quantize_block_f8_e4m3(src + i * QK_F8, out[i], F8Search::fast);
}

// ---- dispatch -----------------------------------------------------------------------------------

namespace {

template <class Block>
constexpr int elems_of() {
    if constexpr (std::is_same_v<Block, BlockQ2_K> || std::is_same_v<Block, BlockQ3_K> ||
                  std::is_same_v<Block, BlockQ4_K> || std::is_same_v<Block, BlockQ5_K> ||
                  std::is_same_v<Block, BlockQ6_K> || std::is_same_v<Block, BlockQ8_K> ||
                  std::is_same_v<Block, BlockIQ4_XS>)
        return QK_K;
    else
        return 32;
}

// Blocks are copied out with memcpy so `src` / `dst` need no alignment (a view into a file may
// start at any even offset for 18-byte blocks).
template <class Block>
void dequantize_blocks(const void* src, float* dst, int64_t n) {
    constexpr int qk = elems_of<Block>();
    const auto* p = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < n / qk; ++i) {
        Block b;
        std::memcpy(&b, p + i * static_cast<int64_t>(sizeof(Block)), sizeof(Block));
        dequantize_block(b, dst + i * qk);
    }
}

template <class Block>
void quantize_blocks(const float* src, void* dst, int64_t n) {
    constexpr int qk = elems_of<Block>();
    auto* p = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < n / qk; ++i) {
        Block b;
        std::memset(&b, 0, sizeof(Block));
        quantize_block(src + i * qk, b);
        std::memcpy(p + i * static_cast<int64_t>(sizeof(Block)), &b, sizeof(Block));
    }
}

// Both directions go through one switch so the two lists cannot drift apart.
template <bool Quantize>
bool dispatch(GgmlType type, const float* qsrc, float* ddst, const void* dsrc, void* qdst, int64_t n) {
    switch (type) {
#define TERN_FORMAT(T, Block)                                                                                          \
    case GgmlType::T:                                                                                                  \
        if constexpr (Quantize) quantize_blocks<Block>(qsrc, qdst, n);                                                 \
        else dequantize_blocks<Block>(dsrc, ddst, n);                                                                  \
        return true;
        TERN_FORMAT(Q4_0, BlockQ4_0)
        TERN_FORMAT(Q4_1, BlockQ4_1)
        TERN_FORMAT(Q5_0, BlockQ5_0)
        TERN_FORMAT(Q5_1, BlockQ5_1)
        TERN_FORMAT(Q8_0, BlockQ8_0)
        TERN_FORMAT(Q8_1, BlockQ8_1)
        TERN_FORMAT(Q2_K, BlockQ2_K)
        TERN_FORMAT(Q3_K, BlockQ3_K)
        TERN_FORMAT(Q4_K, BlockQ4_K)
        TERN_FORMAT(Q5_K, BlockQ5_K)
        TERN_FORMAT(Q6_K, BlockQ6_K)
        TERN_FORMAT(Q8_K, BlockQ8_K)
        TERN_FORMAT(IQ4_NL, BlockIQ4_NL)
        TERN_FORMAT(IQ4_XS, BlockIQ4_XS)
        TERN_FORMAT(F8_E4M3, BlockF8_E4M3)
        TERN_FORMAT(MXFP4, BlockMXFP4)
#undef TERN_FORMAT
    default:
        return false;
    }
}

void check_row(GgmlType type, int64_t n, bool quantize) {
    const TypeInfo& ti = type_info(type);   // throws for an unknown id
    if (!(quantize ? ti.can_quantize : ti.can_dequantize))
        throw InputError(std::string("tensor format ") + std::string(ti.name) + " is not supported for " +
                         (quantize ? "quantization" : "dequantization") + " (tern has no reference code for it)");
    if (n < 0 || n % ti.block_elems != 0)
        throw InputError(std::string(ti.name) + ": row of " + std::to_string(n) +
                         " elements is not a multiple of the block size " + std::to_string(ti.block_elems));
}

} // namespace

void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n) {
    check_row(type, n, false);
    const auto* p = static_cast<const uint8_t*>(src);
    switch (type) {
    case GgmlType::F32:
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    case GgmlType::F16:
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            dst[i] = f16_to_f32(h);
        }
        return;
    case GgmlType::BF16:
        for (int64_t i = 0; i < n; ++i) {
            uint16_t h;
            std::memcpy(&h, p + 2 * i, 2);
            dst[i] = bf16_to_f32(h);
        }
        return;
    default:
        if (dispatch<false>(type, nullptr, dst, src, nullptr, n)) return;
    }
    throw InputError(std::string("tensor format ") + std::string(type_name(type)) + " has no dequantizer");
}

void quantize_row(GgmlType type, const float* src, void* dst, int64_t n) {
    check_row(type, n, true);
    auto* p = static_cast<uint8_t*>(dst);
    switch (type) {
    case GgmlType::F32:
        std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
        return;
    case GgmlType::F16:
        for (int64_t i = 0; i < n; ++i) {
            const uint16_t h = f32_to_f16(src[i]);
            std::memcpy(p + 2 * i, &h, 2);
        }
        return;
    case GgmlType::BF16:
        for (int64_t i = 0; i < n; ++i) {
            const uint16_t h = f32_to_bf16(src[i]);
            std::memcpy(p + 2 * i, &h, 2);
        }
        return;
    default:
        // The block searches assume finite input (a NaN would reach float -> int conversions, which
        // are undefined); llama-quantize refuses such tensors too.
        for (int64_t i = 0; i < n; ++i)
            if (!std::isfinite(src[i]))
                throw InputError(std::string(type_name(type)) + ": cannot quantize a non-finite value (" +
                                 std::to_string(src[i]) + " at element " + std::to_string(i) + " of the row)");
        if (dispatch<true>(type, src, nullptr, nullptr, dst, n)) return;
    }
    throw InputError(std::string("tensor format ") + std::string(type_name(type)) + " has no quantizer");
}

} // namespace tern
