// Scalar twins of every dot kernel: the oracle the SIMD files are tested against. Each block is
// decoded to plain integers, multiplied and summed in int32 (exact), then scaled with the same float
// expression ggml's generic code uses, accumulating blocks in order. The float formats accumulate in
// double: products of two f16 (11 + 11 significant bits) or two bf16 are exact in f32, so the only
// rounding left is the sum's, and double makes that negligible for an oracle.
#include <array>
#include <cstring>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/dot.h"
#include "kernels/cpu/dot_unaligned.h"
#include "quant/blocks.h"
#include "quant/fp8.h"
#include "quant/half.h"

namespace tern {

namespace {

inline float f16(uint16_t h) { return f16_to_f32(h); }

// 32 four-bit codes of a Q4_0-style block: element j in the low nibble of qs[j], j + 16 in the high one.
inline void nibbles32(const uint8_t* qs, int* q) {
    for (int j = 0; j < 16; ++j) {
        q[j] = qs[j] & 15;
        q[j + 16] = qs[j] >> 4;
    }
}

inline uint32_t load_u32_le(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

int dot32(const int* q, const int8_t* a) {
    int s = 0;
    for (int j = 0; j < 32; ++j) s += q[j] * a[j];
    return s;
}

// e4m3 code -> value * 2^9 as an exact integer: every finite e4m3 value is a multiple of 2^-9 (the
// smallest subnormal) and at most 448 * 512 = 229376, so 32 products with |a| <= 127 stay below
// 2^30. The NaN codes (0x7F, 0xFF; never written by tern's quantizer) count as 0.
constexpr std::array<int32_t, 256> kE4m3Times512 = [] {
    std::array<int32_t, 256> t{};
    for (int q = 0; q < 256; ++q)
        t[q] = (q & 0x7F) == 0x7F ? 0 : static_cast<int32_t>(e4m3_to_f32(static_cast<uint8_t>(q)) * 512.0f);
    return t;
}();

} // namespace

float vec_dot_q4_0_q8_0_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK4_0; ++b) {
        int q[32];
        nibbles32(wb[b].qs, q);
        for (int& v : q) v -= 8;
        sum += static_cast<float>(dot32(q, xb[b].qs)) * (f16(wb[b].d) * f16(xb[b].d));
    }
    return sum;
}

float vec_dot_q4_1_q8_1_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_1*>(w);
    const auto* xb = static_cast<const BlockQ8_1*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK4_1; ++b) {
        int q[32];
        nibbles32(wb[b].qs, q);
        // y = q * d + m, so sum(y * a * da) = d * da * sum(q * a) + m * (da * sum(a)) and Q8_1 stores the last factor.
        sum += static_cast<float>(dot32(q, xb[b].qs)) * (f16(wb[b].d) * f16(xb[b].d)) + f16(wb[b].m) * f16(xb[b].s);
    }
    return sum;
}

float vec_dot_q5_0_q8_0_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK5_0; ++b) {
        int q[32];
        nibbles32(wb[b].qs, q);
        const uint32_t qh = load_u32_le(wb[b].qh);
        for (int j = 0; j < 32; ++j) q[j] = (q[j] | static_cast<int>(((qh >> j) & 1) << 4)) - 16;
        sum += static_cast<float>(dot32(q, xb[b].qs)) * (f16(wb[b].d) * f16(xb[b].d));
    }
    return sum;
}

float vec_dot_q5_1_q8_1_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_1*>(w);
    const auto* xb = static_cast<const BlockQ8_1*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK5_1; ++b) {
        int q[32];
        nibbles32(wb[b].qs, q);
        const uint32_t qh = load_u32_le(wb[b].qh);
        for (int j = 0; j < 32; ++j) q[j] |= static_cast<int>(((qh >> j) & 1) << 4);
        sum += static_cast<float>(dot32(q, xb[b].qs)) * (f16(wb[b].d) * f16(xb[b].d)) + f16(wb[b].m) * f16(xb[b].s);
    }
    return sum;
}

float vec_dot_q8_0_q8_0_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ8_0*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        int s = 0;
        for (int j = 0; j < 32; ++j) s += wb[b].qs[j] * xb[b].qs[j];
        sum += static_cast<float>(s) * (f16(wb[b].d) * f16(xb[b].d));
    }
    return sum;
}

float vec_dot_iq4_nl_q8_0_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockIQ4_NL*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK4_NL; ++b) {
        int q[32];
        nibbles32(wb[b].qs, q);
        for (int& v : q) v = kIq4Values[v];
        sum += static_cast<float>(dot32(q, xb[b].qs)) * (f16(wb[b].d) * f16(xb[b].d));
    }
    return sum;
}

// ggml's order: the two block scales multiplied first (the activation's f16 scale times the power of two, exact
// unless it leaves f32's range), then times the integer sum.
float vec_dot_mxfp4_q8_0_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockMXFP4*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_MXFP4; ++b) {
        int q[32];
        nibbles32(wb[b].qs, q);
        for (int& v : q) v = kMxfp4Values[v];
        sum += (f16(xb[b].d) * mxfp4_scale_half(wb[b].e)) * static_cast<float>(dot32(q, xb[b].qs));
    }
    return sum;
}

float vec_dot_f8_e4m3_q8_0_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockF8_E4M3*>(w);
    const auto* xb = static_cast<const BlockQ8_0*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_F8; ++b) {
        int s = 0;
        for (int j = 0; j < 32; ++j) s += kE4m3Times512[wb[b].qs[j]] * xb[b].qs[j];
        sum += static_cast<float>(s) * (f16(wb[b].d) * f16(xb[b].d)) * (1.0f / 512.0f);
    }
    return sum;
}

float vec_dot_q2_k_q8_k_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ2_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ2_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        int isum = 0, summs = 0;
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int t = 0; t < 16; ++t) {
                const int e = 16 * j + t;
                const int q = (B.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
                s += q * A.qs[e];
            }
            isum += (B.scales[j] & 15) * s;
            summs += (B.scales[j] >> 4) * A.bsums[j];   // the min term: dmin * m_j * sum(a) over the sub-block
        }
        sum += (A.d * f16(B.d)) * static_cast<float>(isum) - (A.d * f16(B.dmin)) * static_cast<float>(summs);
    }
    return sum;
}

float vec_dot_q3_k_q8_k_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ3_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ3_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        int isum = 0;
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int t = 0; t < 16; ++t) {
                const int e = 16 * j + t;
                const int q2 = (B.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
                const int q = q2 - (((B.hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
                s += q * A.qs[e];
            }
            isum += (q3_k_scale(B.scales, j) - 32) * s;
        }
        sum += (A.d * f16(B.d)) * static_cast<float>(isum);
    }
    return sum;
}

namespace {
// Q4_K and Q5_K differ only in the 16s bit; `qh` is nullptr for Q4_K.
float dot_q45_k(const BlockQ8_K& A, uint16_t d, uint16_t dmin, const uint8_t* scales, const uint8_t* qs,
                const uint8_t* qh) {
    int isum = 0, mins = 0;
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        q4_k_scale_min(scales, j, sc, m);
        int s = 0;
        for (int t = 0; t < 32; ++t) {
            const int e = 32 * j + t;
            const uint8_t byte = qs[32 * (e / 64) + e % 32];
            int q = (e % 64) < 32 ? (byte & 15) : (byte >> 4);
            if (qh) q += 16 * ((qh[e % 32] >> (e / 32)) & 1);
            s += q * A.qs[e];
        }
        isum += sc * s;
        mins += m * (A.bsums[2 * j] + A.bsums[2 * j + 1]);
    }
    return (A.d * f16(d)) * static_cast<float>(isum) - (A.d * f16(dmin)) * static_cast<float>(mins);
}
} // namespace

float vec_dot_q4_k_q8_k_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ4_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) sum += dot_q45_k(xb[b], wb[b].d, wb[b].dmin, wb[b].scales, wb[b].qs, nullptr);
    return sum;
}

float vec_dot_q5_k_q8_k_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ5_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) sum += dot_q45_k(xb[b], wb[b].d, wb[b].dmin, wb[b].scales, wb[b].qs, wb[b].qh);
    return sum;
}

float vec_dot_q6_k_q8_k_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockQ6_K*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockQ6_K& B = wb[b];
        const BlockQ8_K& A = xb[b];
        int isum = 0;
        for (int j = 0; j < 16; ++j) {
            int s = 0;
            for (int t = 0; t < 16; ++t) {
                const int e = 16 * j + t;
                const int c = e / 128, r = e % 128, l = r % 32, g = r / 32;
                const uint8_t lb = B.ql[64 * c + l + 32 * (g & 1)];
                const int low = g < 2 ? (lb & 15) : (lb >> 4);
                const int high = (B.qh[32 * c + l] >> (2 * g)) & 3;
                s += ((low | (high << 4)) - 32) * A.qs[e];
            }
            isum += B.scales[j] * s;
        }
        sum += (A.d * f16(B.d)) * static_cast<float>(isum);
    }
    return sum;
}

float vec_dot_iq4_xs_q8_k_scalar(int64_t n, const void* w, const void* x) {
    const auto* wb = static_cast<const BlockIQ4_XS*>(w);
    const auto* xb = static_cast<const BlockQ8_K*>(x);
    float sum = 0.0f;
    for (int64_t b = 0; b < n / QK_K; ++b) {
        const BlockIQ4_XS& B = wb[b];
        const BlockQ8_K& A = xb[b];
        int isum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            int q[32];
            nibbles32(B.qs + 16 * ib, q);
            for (int& v : q) v = kIq4Values[v];
            isum += (iq4_xs_scale(B, ib) - 32) * dot32(q, A.qs + 32 * ib);
        }
        sum += (A.d * f16(B.d)) * static_cast<float>(isum);
    }
    return sum;
}

float vec_dot_f16_f16_scalar(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(f16_to_f32(load_u16_at(a, i)) * f16_to_f32(load_u16_at(b, i)));
    return static_cast<float>(s);
}

float vec_dot_bf16_bf16_scalar(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const uint16_t*>(w);
    const auto* b = static_cast<const uint16_t*>(x);
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(bf16_to_f32(load_u16_at(a, i)) * bf16_to_f32(load_u16_at(b, i)));
    return static_cast<float>(s);
}

float vec_dot_f32_f32_scalar(int64_t n, const void* w, const void* x) {
    const auto* a = static_cast<const float*>(w);
    const auto* b = static_cast<const float*>(x);
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(load_f32_at(a, i)) * load_f32_at(b, i);
    return static_cast<float>(s);
}

void fill_cpu_kernels_scalar(CpuKernels& k) {
    k.q4_0 = vec_dot_q4_0_q8_0_scalar;
    k.q4_1 = vec_dot_q4_1_q8_1_scalar;
    k.q5_0 = vec_dot_q5_0_q8_0_scalar;
    k.q5_1 = vec_dot_q5_1_q8_1_scalar;
    k.q8_0 = vec_dot_q8_0_q8_0_scalar;
    k.q2_k = vec_dot_q2_k_q8_k_scalar;
    k.q3_k = vec_dot_q3_k_q8_k_scalar;
    k.q4_k = vec_dot_q4_k_q8_k_scalar;
    k.q5_k = vec_dot_q5_k_q8_k_scalar;
    k.q6_k = vec_dot_q6_k_q8_k_scalar;
    k.iq4_nl = vec_dot_iq4_nl_q8_0_scalar;
    k.iq4_xs = vec_dot_iq4_xs_q8_k_scalar;
    k.f8_e4m3 = vec_dot_f8_e4m3_q8_0_scalar;
    k.mxfp4 = vec_dot_mxfp4_q8_0_scalar;
    k.f16 = vec_dot_f16_f16_scalar;
    k.bf16 = vec_dot_bf16_bf16_scalar;
    k.f32 = vec_dot_f32_f32_scalar;
    k.quantize[static_cast<int>(ActFormat::f32)] = quantize_act_f32;
    k.quantize[static_cast<int>(ActFormat::f16)] = quantize_act_f16_scalar;
    k.quantize[static_cast<int>(ActFormat::bf16)] = quantize_act_bf16_scalar;
    k.quantize[static_cast<int>(ActFormat::q8_0)] = quantize_act_q8_0_scalar;
    k.quantize[static_cast<int>(ActFormat::q8_1)] = quantize_act_q8_1_scalar;
    k.quantize[static_cast<int>(ActFormat::q8_k)] = quantize_act_q8_k_scalar;
}

} // namespace tern
