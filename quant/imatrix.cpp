// Importance-weighted Q2_K / Q3_K (see imatrix.h). The block layouts are FORMATS.md §3.2/§3.3;
// the searches are weighted least-squares / least-absolute-deviation fits of the sub-block scale
// (and min), derived here: for codes l_i and weights w_i, the best scale a and offset b minimise
// sum w_i (a l_i + b - x_i)^2, which the normal equations give in closed form.
#include "quant/imatrix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "base/error.h"
#include "quant/blocks.h"
#include "quant/reference_math.h"

namespace tern {
namespace {

using detail::clamp_int;
using detail::nearest_int;

// Weighted asymmetric fit over codes 0..nmax: tries inverse scales (nmax + rmin + rdelta k) / range
// and keeps the (scale, min) with the smallest weighted error (absolute when `mad`).
void fit_scale_min(int n, int nmax, const float* x, const float* w, uint8_t* L, float rmin, float rdelta, int nstep,
                   bool mad, float& scale_out, float& min_out) {
    float mn = x[0], mx = x[0], sw = 0.0f, sx = 0.0f;
    for (int i = 0; i < n; ++i) {
        mn = std::min(mn, x[i]);
        mx = std::max(mx, x[i]);
        sw += w[i];
        sx += w[i] * x[i];
    }
    if (mn > 0.0f) mn = 0.0f;
    if (mx == mn) {
        std::memset(L, 0, static_cast<size_t>(n));
        scale_out = 0.0f;
        min_out = -mn;
        return;
    }
    auto err_of = [mad](float d) { return mad ? std::fabs(d) : d * d; };
    float scale = (mx - mn) / static_cast<float>(nmax), best = 0.0f;
    for (int i = 0; i < n; ++i) {
        L[i] = static_cast<uint8_t>(clamp_int(nearest_int((x[i] - mn) / scale), 0, nmax));
        best += w[i] * err_of(scale * L[i] + mn - x[i]);
    }
    uint8_t trial[32];
    for (int k = 0; k <= nstep; ++k) {
        const float is = (rmin + rdelta * static_cast<float>(k) + static_cast<float>(nmax)) / (mx - mn);
        float sl = 0.0f, sl2 = 0.0f, sxl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_int(nearest_int(is * (x[i] - mn)), 0, nmax);
            trial[i] = static_cast<uint8_t>(l);
            sl += w[i] * l;
            sl2 += w[i] * l * l;
            sxl += w[i] * l * x[i];
        }
        const float det = sw * sl2 - sl * sl;
        if (!(det > 0.0f)) continue;
        float a = (sw * sxl - sx * sl) / det, b = (sl2 * sx - sl * sxl) / det;
        if (b > 0.0f) {   // the min must be <= 0 (stored as a non-negative offset)
            b = 0.0f;
            a = sxl / sl2;
        }
        float err = 0.0f;
        for (int i = 0; i < n; ++i) err += w[i] * err_of(a * trial[i] + b - x[i]);
        if (err < best) {
            best = err;
            scale = a;
            mn = b;
            std::memcpy(L, trial, static_cast<size_t>(n));
        }
    }
    scale_out = scale;
    min_out = -mn;
}

// Weighted symmetric fit over codes -nmax..nmax-1: for fixed codes l the best scale is
// sum w x l / sum w l^2 and the error falls as (sum w x l)^2 / sum w l^2 grows, so the search keeps
// the codes that maximise that ratio over 2 * nsteps + 1 inverse scales around -nmax / max, then
// moves single codes while the ratio improves (coordinate descent). Returns the scale.
float fit_symmetric(int n, int nmax, const float* x, const float* w, int* l, int nsteps) {
    const float max = detail::signed_max(x, n);
    if (std::fabs(max) < 1e-15f) {
        for (int i = 0; i < n; ++i) l[i] = -nmax;   // Q3_K stores an all-zero sub-block as raw 0
        return 0.0f;
    }
    int trial[32];
    float sx = 0.0f, s2 = 0.0f;
    bool have = false;
    for (int k = -nsteps; k <= nsteps; ++k) {
        const float is = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(k)) / max;
        float tx = 0.0f, t2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            trial[i] = clamp_int(nearest_int(is * x[i]), -nmax, nmax - 1);
            tx += w[i] * x[i] * static_cast<float>(trial[i]);
            t2 += w[i] * static_cast<float>(trial[i] * trial[i]);
        }
        if (!(t2 > 0.0f) || tx == 0.0f) continue;
        if (!have || tx * tx * s2 > sx * sx * t2) {
            have = true;
            sx = tx;
            s2 = t2;
            std::memcpy(l, trial, sizeof(int) * static_cast<size_t>(n));
        }
    }
    if (!have) {   // every weight is zero: fall back to plain rounding
        const float is = -static_cast<float>(nmax) / max;
        for (int i = 0; i < n; ++i) l[i] = clamp_int(nearest_int(is * x[i]), -nmax, nmax - 1);
        return 1.0f / is;
    }
    for (int pass = 0; pass < 5; ++pass) {
        int changed = 0;
        for (int i = 0; i < n; ++i) {
            // The scale may have either sign (the reference aims the largest value at -nmax).
            float slx = sx - w[i] * x[i] * static_cast<float>(l[i]);
            if (slx == 0.0f) continue;
            float sl2 = s2 - w[i] * static_cast<float>(l[i] * l[i]);
            const int nl = clamp_int(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
            if (nl == l[i]) continue;
            slx += w[i] * x[i] * static_cast<float>(nl);
            sl2 += w[i] * static_cast<float>(nl * nl);
            if (sl2 > 0.0f && slx * slx * s2 > sx * sx * sl2) {
                l[i] = nl;
                sx = slx;
                s2 = sl2;
                ++changed;
            }
        }
        if (!changed) break;
    }
    return sx / s2;
}

void pack_2bit(const uint8_t* L, uint8_t* qs) {
    for (int c = 0; c < 2; ++c)
        for (int l = 0; l < 32; ++l) {
            const uint8_t* g = L + 128 * c + l;
            qs[32 * c + l] = static_cast<uint8_t>(g[0] | (g[32] << 2) | (g[64] << 4) | (g[96] << 6));
        }
}

void q2_k_block(const float* x, const float* imp, BlockQ2_K& b) {
    uint8_t L[QK_K];
    float sc[16], mins[16], w[16], max_scale = 0.0f, max_min = 0.0f;
    // Squared error weighted by importance times sqrt(sigma^2 + x^2): the importance is the
    // principled part; the second factor keeps the reference's preference for the large weights
    // without letting near-zero weights drop out of the fit.
    float sigma2 = 0.0f;
    for (int i = 0; i < QK_K; ++i) sigma2 += x[i] * x[i];
    sigma2 = 2.0f * sigma2 / QK_K;
    for (int j = 0; j < 16; ++j) {
        for (int i = 0; i < 16; ++i) w[i] = imp[16 * j + i] * std::sqrt(sigma2 + x[16 * j + i] * x[16 * j + i]);
        fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, -0.9f, 0.05f, 36, false, sc[j], mins[j]);
        max_scale = std::max(max_scale, sc[j]);
        max_min = std::max(max_min, mins[j]);
    }
    std::memset(&b, 0, sizeof b);
    if (max_scale > 0.0f) {
        for (int j = 0; j < 16; ++j) b.scales[j] = static_cast<uint8_t>(nearest_int(15.0f / max_scale * sc[j]));
        b.d = f32_to_f16(max_scale / 15.0f);
    }
    if (max_min > 0.0f) {
        for (int j = 0; j < 16; ++j) b.scales[j] |= static_cast<uint8_t>(nearest_int(15.0f / max_min * mins[j]) << 4);
        b.dmin = f32_to_f16(max_min / 15.0f);
    }
    const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
    for (int j = 0; j < 16; ++j) {
        const float dq = d * static_cast<float>(b.scales[j] & 15);
        if (dq == 0.0f) continue;
        const float dm = dmin * static_cast<float>(b.scales[j] >> 4);
        for (int i = 0; i < 16; ++i)
            L[16 * j + i] = static_cast<uint8_t>(clamp_int(nearest_int((x[16 * j + i] + dm) / dq), 0, 3));
    }
    pack_2bit(L, b.qs);
}

void q3_k_block(const float* x, const float* imp, BlockQ3_K& b) {
    int l[QK_K], q[16];
    uint8_t L[QK_K];
    float sc[16], w[16], weight[16];
    // The weight of an element's squared error is its column's importance alone: that is the
    // output error the fit should minimise (imatrix.h). Measured on synth-k256 q3_k_m, the Q2_K-style
    // extra factor sqrt(sigma^2 + x^2) (which favours the large weights) gave a larger KL divergence
    // to the F32 model (1.696 vs 1.685).
    for (int j = 0; j < 16; ++j) {
        for (int i = 0; i < 16; ++i) w[i] = imp[16 * j + i];
        sc[j] = fit_symmetric(16, 4, x + 16 * j, w, l + 16 * j, 9);
        // An error e in this sub-block's scale costs about e^2 * sum w l^2: weight the 6-bit fit of
        // the scales by that, instead of rounding them all against the largest one.
        weight[j] = 0.0f;
        for (int i = 0; i < 16; ++i) weight[j] += w[i] * static_cast<float>(l[16 * j + i] * l[16 * j + i]);
    }
    std::memset(&b, 0, sizeof b);
    const float d = fit_symmetric(16, 32, sc, weight, q, 9);
    if (d != 0.0f) {
        for (int j = 0; j < 16; ++j) {
            const int u = q[j] + 32;
            if (j < 8) b.scales[j] |= static_cast<uint8_t>(u & 15);
            else b.scales[j - 8] |= static_cast<uint8_t>((u & 15) << 4);
            b.scales[8 + j % 4] |= static_cast<uint8_t>((u >> 4) << (2 * (j / 4)));
        }
        b.d = f32_to_f16(d);
    }
    for (int e = 0; e < QK_K; ++e) L[e] = static_cast<uint8_t>(l[e] + 4);
    const float dd = f16_to_f32(b.d);
    for (int j = 0; j < 16; ++j) {
        const float dq = dd * static_cast<float>(q3_k_scale(b.scales, j) - 32);
        if (dq == 0.0f) continue;
        for (int i = 0; i < 16; ++i)
            L[16 * j + i] = static_cast<uint8_t>(clamp_int(nearest_int(x[16 * j + i] / dq), -4, 3) + 4);
    }
    for (int e = 0; e < QK_K; ++e)
        if (L[e] > 3) {
            b.hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
            L[e] = static_cast<uint8_t>(L[e] - 4);
        }
    pack_2bit(L, b.qs);
}

// Q4_0: one scale per 32 values, codes -8..7 (x = d * l). The same weighted symmetric fit as a Q3_K
// sub-block, with the f16 scale stored directly (no second quantization of the scales). Q4_0 is
// where q2_k / q3_k_* send the tensors whose width is not a multiple of 256 (Gemma 3's 640-wide
// inputs), so without it --calibrate would not reach most of such a model.
void q4_0_block(const float* x, const float* imp, BlockQ4_0& b) {
    int l[QK4_0];
    const float d = fit_symmetric(QK4_0, 8, x, imp, l, 9);
    b.d = f32_to_f16(d);
    if (d == 0.0f) {   // an all-zero block: d = -0 (0 / -8) and code 8 everywhere, as the reference stores it
        b.d = f32_to_f16(-0.0f);
        for (int& v : l) v = 0;
    }
    for (int j = 0; j < QK4_0 / 2; ++j)
        b.qs[j] = static_cast<uint8_t>((l[j] + 8) | ((l[j + QK4_0 / 2] + 8) << 4));
}

} // namespace

bool supports_importance(GgmlType t) { return t == GgmlType::Q2_K || t == GgmlType::Q3_K || t == GgmlType::Q4_0; }

void quantize_row_importance(GgmlType type, const float* src, void* dst, int64_t n, const float* imp) {
    if (!supports_importance(type))
        throw InputError(std::string(type_name(type)) + ": no importance-weighted quantizer (only q2_K, q3_K, q4_0)");
    const int64_t block = type == GgmlType::Q4_0 ? QK4_0 : QK_K;
    if (n % block != 0)
        throw InputError(std::string(type_name(type)) + ": row length is not a multiple of " + std::to_string(block));
    for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(src[i]) || !std::isfinite(imp[i]) || imp[i] < 0.0f)
            throw InputError(std::string(type_name(type)) + ": non-finite value or importance at element " +
                             std::to_string(i));
    auto* p = static_cast<uint8_t*>(dst);
    if (type == GgmlType::Q4_0) {
        for (int64_t k = 0; k < n / QK4_0; ++k) {
            BlockQ4_0 b;
            q4_0_block(src + k * QK4_0, imp + k * QK4_0, b);
            std::memcpy(p + k * sizeof b, &b, sizeof b);
        }
        return;
    }
    for (int64_t k = 0; k < n / QK_K; ++k) {
        if (type == GgmlType::Q2_K) {
            BlockQ2_K b;
            q2_k_block(src + k * QK_K, imp + k * QK_K, b);
            std::memcpy(p + k * sizeof b, &b, sizeof b);
        } else {
            BlockQ3_K b;
            q3_k_block(src + k * QK_K, imp + k * QK_K, b);
            std::memcpy(p + k * sizeof b, &b, sizeof b);
        }
    }
}

} // namespace tern
