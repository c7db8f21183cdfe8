// MXFP4 (GGUF id 39, the OCP microscaling FP4 format gpt-oss ships its experts in): 32 E2M1 codes share one
// power-of-two scale. The quantizer is the plain one llama-quantize uses (it takes no importance matrix): the
// scale puts the block's largest magnitude in [4, 8) times 2^(e - 127) / 2, i.e. in the code book's top
// octave, and every element takes the nearest code.
#include <cmath>

#include "quant/reference_blocks.h"

namespace tern {

void dequantize_block(const BlockMXFP4& b, float* y) {
    const float d = mxfp4_scale_half(b.e);
    for (int j = 0; j < QK_MXFP4 / 2; ++j) {
        y[j] = static_cast<float>(kMxfp4Values[b.qs[j] & 15]) * d;
        y[j + QK_MXFP4 / 2] = static_cast<float>(kMxfp4Values[b.qs[j] >> 4]) * d;
    }
}

namespace {

// The code whose value times d is nearest to v; on a tie the lower index wins (so +0 beats -0, and a value
// halfway between two codes takes the one listed first).
uint8_t nearest_mxfp4(float v, float d) {
    int best = 0;
    float best_err = std::fabs(static_cast<float>(kMxfp4Values[0]) * d - v);
    for (int i = 1; i < 16; ++i) {
        const float err = std::fabs(static_cast<float>(kMxfp4Values[i]) * d - v);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return static_cast<uint8_t>(best);
}

} // namespace

void quantize_block(const float* x, BlockMXFP4& b) {
    float amax = 0.0f;
    for (int j = 0; j < QK_MXFP4; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    // The exponent is computed in float from libm's log2f, as the GGUF quantizer does, so values just below a
    // power of two round the same way. Blocks too small for an exponent >= 0 keep the low byte of the int,
    // which is what the x86 conversion the reference compiles to yields.
    b.e = amax > 0.0f ? static_cast<uint8_t>(static_cast<int>(std::floor(std::log2(amax)) - 2.0f + 127.0f)) : 0;
    const float d = mxfp4_scale_half(b.e);
    for (int j = 0; j < QK_MXFP4 / 2; ++j)
        b.qs[j] = static_cast<uint8_t>(nearest_mxfp4(x[j], d) | (nearest_mxfp4(x[j + QK_MXFP4 / 2], d) << 4));
}

} // namespace tern
