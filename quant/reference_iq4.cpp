// IQ4_NL and IQ4_XS (FORMATS.md §3.1, §3.6, §4.4): 4-bit indices into the non-linear code book
// kIq4Values, with the scale search llama-quantize uses without an importance matrix (w = x^2, 7 tries).
#include <cmath>
#include <cstring>

#include "quant/reference_blocks.h"
#include "quant/reference_math.h"

namespace tern {

// ---- dequantize ---------------------------------------------------------------------------------

void dequantize_block(const BlockIQ4_NL& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < QK4_NL / 2; ++j) {
        y[j] = d * static_cast<float>(kIq4Values[b.qs[j] & 15]);
        y[j + QK4_NL / 2] = d * static_cast<float>(kIq4Values[b.qs[j] >> 4]);
    }
}

void dequantize_block(const BlockIQ4_XS& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        const float dl = d * static_cast<float>(iq4_xs_scale(b, ib) - 32);
        const uint8_t* qs = b.qs + 16 * ib;
        for (int t = 0; t < 16; ++t) {
            y[32 * ib + t] = dl * static_cast<float>(kIq4Values[qs[t] & 15]);
            y[32 * ib + t + 16] = dl * static_cast<float>(kIq4Values[qs[t] >> 4]);
        }
    }
}

// ---- quantize -----------------------------------------------------------------------------------

namespace {

// Index of the code-book entry nearest to v; an exact midpoint goes to the upper entry.
int nearest_iq4(float v) {
    if (v <= static_cast<float>(kIq4Values[0])) return 0;
    if (v >= static_cast<float>(kIq4Values[15])) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < static_cast<float>(kIq4Values[mid])) hi = mid;
        else lo = mid;
    }
    return v - static_cast<float>(kIq4Values[lo]) < static_cast<float>(kIq4Values[hi]) - v ? lo : hi;
}

// Best scale for 32 elements: the plain max-based scale, refined by least squares, then 15 trial
// inverse scales (t - 127) / M for t = -7..7, keeping the one with the largest (sum qx)^2 / sum q^2.
float iq4_block_scale(const float* x) {
    constexpr int n = 32, ntry = 7;
    const float max = detail::signed_max(x, n);
    if (std::fabs(max) < 1e-15f) return 0.0f;
    float w[n];
    for (int i = 0; i < n; ++i) w[i] = x[i] * x[i];
    float d = -max / static_cast<float>(kIq4Values[0]);
    float id = 1.0f / d;
    float sqx = 0.0f, sq2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float q = static_cast<float>(kIq4Values[nearest_iq4(id * x[i])]);
        sqx += w[i] * q * x[i];
        sq2 += w[i] * q * q;
    }
    d = sqx / sq2;
    float best = d * sqx;
    for (int t = -ntry; t <= ntry; ++t) {
        id = static_cast<float>(t + kIq4Values[0]) / max;
        sqx = 0.0f;
        sq2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const float q = static_cast<float>(kIq4Values[nearest_iq4(id * x[i])]);
            sqx += w[i] * q * x[i];
            sq2 += w[i] * q * q;
        }
        if (sq2 > 0.0f && sqx * sqx > best * sq2) {
            d = sqx / sq2;
            best = d * sqx;
        }
    }
    return d;
}

// 32 indices packed like Q4_0: element j low nibble, element j + 16 high nibble of qs[j].
void pack_iq4(const float* x, float id, uint8_t* qs) {
    for (int j = 0; j < 16; ++j)
        qs[j] = static_cast<uint8_t>(nearest_iq4(id * x[j]) | (nearest_iq4(id * x[j + 16]) << 4));
}

} // namespace

void quantize_block(const float* x, BlockIQ4_NL& b) {
    const float d = iq4_block_scale(x);
    b.d = f32_to_f16(d);
    pack_iq4(x, d != 0.0f ? 1.0f / d : 0.0f, b.qs);   // an all-zero block: d = 0, bytes 0x88
}

void quantize_block(const float* x, BlockIQ4_XS& b) {
    float sc[QK_K / 32];
    float max_scale = 0.0f, amax = 0.0f;
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        sc[ib] = iq4_block_scale(x + 32 * ib);
        if (std::fabs(sc[ib]) > amax) {
            amax = std::fabs(sc[ib]);
            max_scale = sc[ib];
        }
    }
    const float d = -max_scale / 32.0f;   // the largest sub-block scale gets ls - 32 = -32
    b.d = f32_to_f16(d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b.scales_h = 0;
    std::memset(b.scales_l, 0, sizeof b.scales_l);
    for (int ib = 0; ib < QK_K / 32; ++ib) {
        const int l = detail::clamp_int(detail::nearest_int(id * sc[ib]), -32, 31);
        const float dl = d * static_cast<float>(l);
        pack_iq4(x + 32 * ib, dl != 0.0f ? 1.0f / dl : 0.0f, b.qs + 16 * ib);
        const int ls = l + 32;
        b.scales_l[ib / 2] |= static_cast<uint8_t>((ls & 15) << (4 * (ib % 2)));
        b.scales_h = static_cast<uint16_t>(b.scales_h | ((ls >> 4) << (2 * ib)));
    }
}

} // namespace tern
