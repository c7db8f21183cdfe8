// K-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K (FORMATS.md §3.2-3.6, §4.2-4.3). Each works on a
// 256-element super-block; the searches pick per-sub-block scales, the super-block scale is stored
// as f16, and the codes are then recomputed with the f16-decoded scales.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/reference_blocks.h"
#include "quant/reference_math.h"

namespace tern {

using detail::clamp_int;
using detail::nearest_int;

// ---- dequantize ---------------------------------------------------------------------------------

void dequantize_block(const BlockQ2_K& b, float* y) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int e = 0; e < QK_K; ++e) {
        const int q = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const uint8_t sc = b.scales[e / 16];
        y[e] = d * static_cast<float>(sc & 15) * static_cast<float>(q) - dmin * static_cast<float>(sc >> 4);
    }
}

void dequantize_block(const BlockQ3_K& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < QK_K; ++e) {
        const int q2 = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        const int h = (b.hmask[e % 32] >> (e / 32)) & 1;
        const int q = q2 - (h ? 0 : 4);
        y[e] = d * static_cast<float>(q3_k_scale(b.scales, e / 16) - 32) * static_cast<float>(q);
    }
}

void dequantize_block(const BlockQ4_K& b, float* y) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        q4_k_scale_min(b.scales, j, sc, m);
        const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
        const uint8_t* qs = b.qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; ++l) y[32 * j + l] = dl * static_cast<float>((qs[l] >> shift) & 15) - ml;
    }
}

void dequantize_block(const BlockQ5_K& b, float* y) {
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        q4_k_scale_min(b.scales, j, sc, m);
        const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(m);
        const uint8_t* qs = b.qs + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int l = 0; l < 32; ++l) {
            const int q = ((qs[l] >> shift) & 15) + 16 * ((b.qh[l] >> j) & 1);
            y[32 * j + l] = dl * static_cast<float>(q) - ml;
        }
    }
}

void dequantize_block(const BlockQ6_K& b, float* y) {
    const float d = f16_to_f32(b.d);
    for (int e = 0; e < QK_K; ++e) {
        const int c = e / 128, r = e % 128, l = r % 32, g = r / 32;
        const uint8_t low_byte = b.ql[64 * c + l + 32 * (g & 1)];
        const int low = g < 2 ? (low_byte & 15) : (low_byte >> 4);
        const int high = (b.qh[32 * c + l] >> (2 * g)) & 3;
        const int q = (low | (high << 4)) - 32;
        y[e] = d * static_cast<float>(b.scales[e / 16]) * static_cast<float>(q);
    }
}

void dequantize_block(const BlockQ8_K& b, float* y) {
    for (int e = 0; e < QK_K; ++e) y[e] = b.d * static_cast<float>(b.qs[e]);
}

// ---- search helpers (FORMATS.md §4.2) -----------------------------------------------------------

namespace {

// Symmetric search over codes -nmax .. nmax-1 with weights w; L gets code + nmax. Returns the scale.
float make_qx_quants(int n, int nmax, const float* x, const float* w, uint8_t* L) {
    const float max = detail::signed_max(x, n);
    if (std::fabs(max) < 1e-15f) {
        std::memset(L, 0, static_cast<size_t>(n));
        return 0.0f;
    }
    float is = static_cast<float>(-nmax) / max;
    float sx = 0.0f, s2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_int(nearest_int(is * x[i]), -nmax, nmax - 1);
        L[i] = static_cast<uint8_t>(l + nmax);
        sx += w[i] * x[i] * static_cast<float>(l);
        s2 += w[i] * static_cast<float>(l) * static_cast<float>(l);
    }
    float scale = s2 != 0.0f ? sx / s2 : 0.0f;
    float best = scale * sx;
    // 18 nearby inverse scales, nmax +- 0.9 in steps of 0.1.
    for (int k = -9; k <= 9; ++k) {
        if (k == 0) continue;
        is = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / max;
        sx = 0.0f;
        s2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const float l = static_cast<float>(clamp_int(nearest_int(is * x[i]), -nmax, nmax - 1));
            sx += w[i] * x[i] * l;
            s2 += w[i] * l * l;
        }
        if (s2 > 0.0f && sx * sx > best * s2) {
            for (int i = 0; i < n; ++i)
                L[i] = static_cast<uint8_t>(clamp_int(nearest_int(is * x[i]), -nmax, nmax - 1) + nmax);
            scale = sx / s2;
            best = scale * sx;
        }
    }
    return scale;
}

// Q3_K's symmetric search (n = 16, codes -4..3, w = x^2) with coordinate-descent refinement.
// L gets code + 4, except that an (almost) all-zero sub-block leaves raw zeros.
float make_q3_quants(const float* x, uint8_t* L) {
    constexpr int n = 16, nmax = 4;
    const float max = detail::signed_max(x, n);
    if (std::fabs(max) < 1e-15f) {
        std::memset(L, 0, n);
        return 0.0f;
    }
    const float is = static_cast<float>(-nmax) / max;
    int l[n];
    float sx = 0.0f, s2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        l[i] = clamp_int(nearest_int(is * x[i]), -nmax, nmax - 1);
        const float w = x[i] * x[i];
        sx += w * x[i] * static_cast<float>(l[i]);
        s2 += w * static_cast<float>(l[i]) * static_cast<float>(l[i]);
    }
    for (int pass = 0; pass < 5; ++pass) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sx - w * x[i] * static_cast<float>(l[i]);
            if (!(slx > 0.0f)) continue;
            float sl2 = s2 - w * static_cast<float>(l[i]) * static_cast<float>(l[i]);
            const int nl = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == l[i]) continue;
            slx += w * x[i] * static_cast<float>(nl);
            sl2 += w * static_cast<float>(nl) * static_cast<float>(nl);
            if (sl2 > 0.0f && slx * slx * s2 > sx * sx * sl2) {
                l[i] = nl;
                sx = slx;
                s2 = sl2;
                ++changed;
            }
        }
        if (changed == 0) break;
    }
    for (int i = 0; i < n; ++i) L[i] = static_cast<uint8_t>(l[i] + nmax);
    return sx / s2;
}

struct ScaleMin {
    float scale;
    float min;   // >= 0; x ~= scale * L - min
};

// Asymmetric search over codes 0..nmax: a least-squares (mad = false) or least-absolute (mad = true)
// fit of scale and offset for nstep + 1 trial inverse scales (nmax + rmin + rdelta * k) / range.
ScaleMin make_qkx2_quants(int n, int nmax, const float* x, const float* w, uint8_t* L, float rmin, float rdelta,
                          int nstep, bool mad) {
    float mn = x[0], mx = x[0];
    float sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0.0f) mn = 0.0f;
    if (mx == mn) {
        std::memset(L, 0, static_cast<size_t>(n));
        return {0.0f, -mn};
    }
    auto err_of = [mad](float diff) { return mad ? std::fabs(diff) : diff * diff; };
    float is = static_cast<float>(nmax) / (mx - mn);
    float scale = 1.0f / is;
    float best = 0.0f;
    for (int i = 0; i < n; ++i) {
        L[i] = static_cast<uint8_t>(clamp_int(nearest_int(is * (x[i] - mn)), 0, nmax));
        const float diff = scale * static_cast<float>(L[i]) + mn - x[i];
        best += w[i] * err_of(diff);
    }
    uint8_t trial[QK_K];
    for (int k = 0; k <= nstep; ++k) {
        is = (rmin + rdelta * static_cast<float>(k) + static_cast<float>(nmax)) / (mx - mn);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(is * (x[i] - mn)), 0, nmax);
            trial[i] = static_cast<uint8_t>(l);
            const float fl = static_cast<float>(l);
            sum_l += w[i] * fl;
            sum_l2 += w[i] * fl * fl;
            sum_xl += w[i] * fl * x[i];
        }
        const float det = sum_w * sum_l2 - sum_l * sum_l;
        if (!(det > 0.0f)) continue;
        float a = (sum_w * sum_xl - sum_x * sum_l) / det;
        float b = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if (b > 0.0f) {
            b = 0.0f;
            a = sum_xl / sum_l2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; ++i) {
            const float diff = a * static_cast<float>(trial[i]) + b - x[i];
            err += w[i] * err_of(diff);
        }
        if (err < best) {
            std::memcpy(L, trial, static_cast<size_t>(n));
            best = err;
            scale = a;
            mn = b;
        }
    }
    return {scale, -mn};
}

// Packs 256 2-bit codes: qs[32c + l] = L[128c + l] | L[128c + l + 32] << 2 | ... << 4 | ... << 6.
void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int c = 0; c < 2; ++c)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* g = L + 128 * c + l;
            qs[32 * c + l] = static_cast<uint8_t>(g[0] | (g[32] << 2) | (g[64] << 4) | (g[96] << 6));
        }
}

// Q4_K / Q5_K share everything but nmax and the search parameters.
struct Qkx2Params {
    int nmax;
    float rmin;
    int nstep;
};

// Fills d, dmin, scales and L (codes 0..nmax) for a Q4_K / Q5_K super-block.
void quantize_q4_q5_k(const float* x, const Qkx2Params& p, uint16_t& d_out, uint16_t& dmin_out, uint8_t* scales,
                      uint8_t* L) {
    float sc[QK_K / 32], mins[QK_K / 32], w[32];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < QK_K / 32; ++j) {
        const float* xs = x + 32 * j;
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
        const float av = std::sqrt(sum_x2 / 32.0f);
        for (int l = 0; l < 32; ++l) w[l] = av + std::fabs(xs[l]);
        const ScaleMin r = make_qkx2_quants(32, p.nmax, xs, w, L + 32 * j, p.rmin, 0.1f, p.nstep, false);
        sc[j] = r.scale;
        mins[j] = r.min;
        if (sc[j] > max_scale) max_scale = sc[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < QK_K / 32; ++j) {
        // uint8_t keeps the value mod 256, as the stored byte does, before the cap at 63.
        const uint8_t ls = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_scale * sc[j])));
        const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(nearest_int(inv_min * mins[j])));
        if (j < 4) {
            scales[j] = ls;
            scales[j + 4] = lm;
        } else {
            scales[j + 4] = static_cast<uint8_t>((ls & 15) | ((lm & 15) << 4));
            scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
            scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
        }
    }
    d_out = f32_to_f16(max_scale / 63.0f);
    dmin_out = f32_to_f16(max_min / 63.0f);
    const float d = f16_to_f32(d_out), dmin = f16_to_f32(dmin_out);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t s, m;
        q4_k_scale_min(scales, j, s, m);
        const float dq = d * static_cast<float>(s);
        if (dq == 0.0f) continue;   // keep the search's codes
        const float dm = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l)
            L[32 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + l] + dm) / dq), 0, p.nmax));
    }
}

} // namespace

// ---- quantize (FORMATS.md §4.3) -----------------------------------------------------------------

void quantize_block(const float* x, BlockQ2_K& b) {
    uint8_t L[QK_K];
    float sc[QK_K / 16], mins[QK_K / 16], w[16];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < QK_K / 16; ++j) {
        for (int l = 0; l < 16; ++l) w[l] = std::fabs(x[16 * j + l]);
        const ScaleMin r = make_qkx2_quants(16, 3, x + 16 * j, w, L + 16 * j, -0.5f, 0.1f, 15, true);
        sc[j] = r.scale;
        mins[j] = r.min;
        if (sc[j] > max_scale) max_scale = sc[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    if (max_scale > 0.0f) {
        const float iscale = 15.0f / max_scale;
        for (int j = 0; j < QK_K / 16; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(iscale * sc[j]));
        b.d = f32_to_f16(max_scale / 15.0f);
    } else {
        std::memset(b.scales, 0, sizeof b.scales);
        b.d = f32_to_f16(0.0f);
    }
    if (max_min > 0.0f) {
        const float iscale = 15.0f / max_min;
        for (int j = 0; j < QK_K / 16; ++j) b.scales[j] |= static_cast<uint8_t>(nearest_int(iscale * mins[j]) << 4);
        b.dmin = f32_to_f16(max_min / 15.0f);
    } else {
        b.dmin = f32_to_f16(0.0f);
    }
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float dq = d * static_cast<float>(b.scales[j] & 15);
        if (dq == 0.0f) continue;
        const float dm = dmin * static_cast<float>(b.scales[j] >> 4);
        for (int l = 0; l < 16; ++l)
            L[16 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + l] + dm) / dq), 0, 3));
    }
    pack_2bit(L, b.qs);
}

void quantize_block(const float* x, BlockQ3_K& b) {
    uint8_t L[QK_K];
    float sc[QK_K / 16];
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < QK_K / 16; ++j) {
        sc[j] = make_q3_quants(x + 16 * j, L + 16 * j);
        if (std::fabs(sc[j]) > amax) {
            amax = std::fabs(sc[j]);
            max_scale = sc[j];
        }
    }
    std::memset(b.scales, 0, sizeof b.scales);
    if (max_scale != 0.0f) {
        const float iscale = -32.0f / max_scale;
        for (int j = 0; j < QK_K / 16; ++j) {
            const int u = clamp_int(nearest_int(iscale * sc[j]), -32, 31) + 32;
            if (j < 8) b.scales[j] |= static_cast<uint8_t>(u & 15);
            else b.scales[j - 8] |= static_cast<uint8_t>((u & 15) << 4);
            b.scales[8 + j % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (j / 4)));
        }
        b.d = f32_to_f16(1.0f / iscale);
    } else {
        b.d = f32_to_f16(0.0f);
    }
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float dq = d * static_cast<float>(q3_k_scale(b.scales, j) - 32);
        if (dq == 0.0f) continue;
        for (int l = 0; l < 16; ++l)
            L[16 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int(x[16 * j + l] / dq), -4, 3) + 4);
    }
    std::memset(b.hmask, 0, sizeof b.hmask);
    for (int e = 0; e < QK_K; ++e) {
        if (L[e] > 3) {
            b.hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
            L[e] = static_cast<uint8_t>(L[e] - 4);
        }
    }
    pack_2bit(L, b.qs);
}

void quantize_block(const float* x, BlockQ4_K& b) {
    uint8_t L[QK_K];
    quantize_q4_q5_k(x, {15, -1.0f, 20}, b.d, b.dmin, b.scales, L);
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l)
            b.qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
}

void quantize_block(const float* x, BlockQ5_K& b) {
    uint8_t L[QK_K];
    quantize_q4_q5_k(x, {31, -0.5f, 15}, b.d, b.dmin, b.scales, L);
    std::memset(b.qh, 0, sizeof b.qh);
    for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) {
            const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
            b.qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
            b.qs[32 * c + l] = static_cast<uint8_t>((lo & 15) | ((hi & 15) << 4));
        }
}

void quantize_block(const float* x, BlockQ6_K& b) {
    uint8_t L[QK_K];
    float sc[QK_K / 16], w[16];
    float max_scale = 0.0f, amax = 0.0f;
    for (int j = 0; j < QK_K / 16; ++j) {
        for (int l = 0; l < 16; ++l) w[l] = x[16 * j + l] * x[16 * j + l];
        sc[j] = make_qx_quants(16, 32, x + 16 * j, w, L + 16 * j);
        if (std::fabs(sc[j]) > amax) {
            amax = std::fabs(sc[j]);
            max_scale = sc[j];
        }
    }
    if (std::fabs(max_scale) < 1e-15f) {
        std::memset(&b, 0, sizeof b);
        return;
    }
    const float iscale = -128.0f / max_scale;
    b.d = f32_to_f16(1.0f / iscale);
    for (int j = 0; j < QK_K / 16; ++j) b.scales[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * sc[j])));
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < QK_K / 16; ++j) {
        const float dq = d * static_cast<float>(b.scales[j]);
        if (dq == 0.0f) continue;
        for (int l = 0; l < 16; ++l)
            L[16 * j + l] = static_cast<uint8_t>(clamp_int(nearest_int(x[16 * j + l] / dq), -32, 31) + 32);
    }
    for (int c = 0; c < 2; ++c)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* g = L + 128 * c + l;   // g[32 * k] = L_k of FORMATS.md §4.3
            b.ql[64 * c + l] = static_cast<uint8_t>((g[0] & 15) | ((g[64] & 15) << 4));
            b.ql[64 * c + 32 + l] = static_cast<uint8_t>((g[32] & 15) | ((g[96] & 15) << 4));
            b.qh[32 * c + l] = static_cast<uint8_t>((g[0] >> 4) | ((g[32] >> 4) << 2) | ((g[64] >> 4) << 4) |
                                                    ((g[96] >> 4) << 6));
        }
}

void quantize_block(const float* x, BlockQ8_K& b) {
    const float max = detail::signed_max(x, QK_K);
    if (max == 0.0f) {
        std::memset(&b, 0, sizeof b);
        return;
    }
    const float is = -127.0f / max;
    for (int e = 0; e < QK_K; ++e) b.qs[e] = static_cast<int8_t>(std::min(127, nearest_int(is * x[e])));
    for (int k = 0; k < QK_K / 16; ++k) {
        int sum = 0;
        for (int l = 0; l < 16; ++l) sum += b.qs[16 * k + l];
        b.bsums[k] = static_cast<int16_t>(sum);
    }
    b.d = 1.0f / is;
}

} // namespace tern
