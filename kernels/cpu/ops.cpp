#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/parallel_for.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/silu.h"
#include "quant/half.h"
#include "quant/reference.h"

namespace tern {

void rmsnorm_f32(const float* x, const float* w, float* y, int64_t n, float eps) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i)
        sum += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    if (w) {
        for (int64_t i = 0; i < n; ++i)
            y[i] = (x[i] * scale) * w[i];
    } else {
        for (int64_t i = 0; i < n; ++i)
            y[i] = x[i] * scale;
    }
}

double rope_pair_scale(int64_t i, float freq_scale, const RopeYarn& yarn) {
    if (yarn.ext_factor == 0.0f) return static_cast<double>(freq_scale);
    const float y = (static_cast<float>(i) - yarn.corr_low) / std::max(0.001f, yarn.corr_high - yarn.corr_low);
    const float ramp = (1.0f - std::min(1.0f, std::max(0.0f, y))) * yarn.ext_factor;
    const double r = static_cast<double>(ramp);
    return static_cast<double>(freq_scale) * (1.0 - r) + r;
}

double rope_theta(int64_t i, int64_t n_rot, int32_t pos, float base, float freq_scale, const float* freq_factors,
                  const RopeYarn& yarn) {
    double theta = static_cast<double>(pos) * rope_pair_scale(i, freq_scale, yarn) *
                   std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    if (freq_factors) theta /= static_cast<double>(freq_factors[i]);
    return theta;
}

namespace {

inline void rotate(float& a, float& b, double theta, float mscale) {
    const float c = static_cast<float>(std::cos(theta)) * mscale;
    const float s = static_cast<float>(std::sin(theta)) * mscale;
    const float x0 = a, x1 = b;
    a = x0 * c - x1 * s;
    b = x0 * s + x1 * c;
}

} // namespace

void rope_normal_f32(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale,
                     const float* freq_factors, const RopeYarn& yarn) {
    (void)head_dim; // dims n_rot.. head_dim-1 pass through unchanged
    for (int64_t i = 0; i < n_rot / 2; ++i)
        rotate(x[2 * i], x[2 * i + 1], rope_theta(i, n_rot, pos, base, freq_scale, freq_factors, yarn), yarn.mscale);
}

void rope_neox_f32(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale,
                   const float* freq_factors, const RopeYarn& yarn) {
    (void)head_dim;
    const int64_t half = n_rot / 2;
    for (int64_t i = 0; i < half; ++i)
        rotate(x[i], x[i + half], rope_theta(i, n_rot, pos, base, freq_scale, freq_factors, yarn), yarn.mscale);
}

void rope_cos_sin(int64_t n_rot, int32_t pos, float base, float freq_scale, const float* freq_factors, float* cos,
                  float* sin, const RopeYarn& yarn) {
    for (int64_t i = 0; i < n_rot / 2; ++i) {
        const double theta = rope_theta(i, n_rot, pos, base, freq_scale, freq_factors, yarn);
        cos[i] = static_cast<float>(std::cos(theta)) * yarn.mscale; // the expressions of rotate()
        sin[i] = static_cast<float>(std::sin(theta)) * yarn.mscale;
    }
}

void rope_rotate_f32(float* x, bool neox, int64_t n_rot, const float* cos, const float* sin) {
    const int64_t half = n_rot / 2;
    const int64_t second = neox ? half : 1; // offset of a pair's second element
    const int64_t step = neox ? 1 : 2;      // distance between pairs
    for (int64_t i = 0; i < half; ++i) {
        float* a = x + i * step;
        const float x0 = a[0], x1 = a[second];
        a[0] = x0 * cos[i] - x1 * sin[i];
        a[second] = x0 * sin[i] + x1 * cos[i];
    }
}

void softmax_f32(float* x, int64_t n) {
    float max = -INFINITY;
    for (int64_t i = 0; i < n; ++i)
        max = std::max(max, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        x[i] = std::exp(x[i] - max);
        sum += x[i];
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i)
        x[i] *= inv;
}

float silu_f32(float x) {
    return x / (1.0f + exp_f32(-x));   // silu.h: the same bits as the SwiGLU kernels
}

float gelu_tanh_f32(float x) {
    constexpr float sqrt_2_over_pi = 0.79788456080286535588f;
    constexpr float coef_a = 0.044715f;
    return 0.5f * x * (1.0f + std::tanh(sqrt_2_over_pi * x * (1.0f + coef_a * x * x)));
}

void swiglu_f32(const float* gate, const float* up, float* y, int64_t n, int n_threads) {
    const SwigluFn kernel = cpu_kernels().swiglu;
    const int threads = threads_for_elems(n, n_threads);
    // Pieces of whole cache lines (16 floats); the kernel's lanes and its scalar tail give the same bits, so
    // where the pieces split changes nothing.
    const int64_t lines = (n + 15) / 16;
    parallel_for(lines, threads, 256, [&](int64_t l0, int64_t l1) {
        const int64_t begin = l0 * 16, end = std::min<int64_t>(n, l1 * 16);
        kernel(gate + begin, up + begin, y + begin, end - begin);
    });
}

void geglu_tanh_f32(const float* gate, const float* up, float* y, int64_t n, int n_threads) {
    parallel_for((n + 15) / 16, threads_for_elems(n, n_threads), 64, [&](int64_t l0, int64_t l1) {
        for (int64_t i = l0 * 16, end = std::min<int64_t>(n, l1 * 16); i < end; ++i)
            y[i] = gelu_tanh_f32(gate[i]) * up[i];
    });
}

void softcap_f32(float* x, int64_t n, float cap) {
    for (int64_t i = 0; i < n; ++i)
        x[i] = cap * std::tanh(x[i] / cap);
}

int64_t argmax_f32(const float* x, int64_t n) {
    const float first = x[0];
    if (first != first) return 0;   // NaN at 0: nothing compares larger
    constexpr int lanes = 16;
    float lane[lanes];
    for (float& l : lane) l = first;
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes)
        for (int j = 0; j < lanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    float best = first;
    for (float l : lane) best = l > best ? l : best;
    for (; i < n; ++i) best = x[i] > best ? x[i] : best;
    for (int64_t t = 0; t < n; ++t)
        if (x[t] == best) return t;
    return 0;   // unreachable: best is one of x
}

float dot_f32(const float* a, const float* b, int64_t n) {
    constexpr int lanes = 16;
    float acc[lanes] = {};
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes)
        for (int l = 0; l < lanes; ++l)
            acc[l] += a[i + l] * b[i + l];
    float tail = 0.0f;
    for (; i < n; ++i)
        tail += a[i] * b[i];
    for (int width = lanes / 2; width >= 1; width /= 2)
        for (int l = 0; l < width; ++l)
            acc[l] += acc[l + width];
    return acc[0] + tail;
}

namespace {

// Row dequantization for matmul_dequant. The reference decoders are written for clarity; the
// hottest formats of real files get straight loops here (the SIMD issue replaces them). Q8_0 (the tied lm_head of
// gemma/qwen files: 2/3 of the weights a Gemma 3 270M token reads) gets an inline loop the compiler vectorises, ~4x the
// generic per-block path; its values are bit-identical to quant/reference's (the same one f32 product).
void dequantize_row_for_matmul(GgmlType type, const uint8_t* src, float* dst, int64_t n) {
    if (type == GgmlType::Q8_0) {
        constexpr int64_t qk = 32, block_size = 34; // f16 scale + 32 int8 codes
        for (int64_t b = 0; b < n / qk; ++b) {
            const uint8_t* blk = src + b * block_size;
            const float d = f16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
            const auto* qs = reinterpret_cast<const int8_t*>(blk + 2);
            for (int64_t j = 0; j < qk; ++j)
                dst[b * qk + j] = static_cast<float>(qs[j]) * d;
        }
        return;
    }
    if (type == GgmlType::Q5_0) {
        // Gemma's attention and gate/up projections. The 5th bits are expanded per block into a small
        // array first so the inner loops have no variable shifts.
        constexpr int64_t qk = 32, block_size = 22; // f16 d, qh[4], qs[16]
        for (int64_t b = 0; b < n / qk; ++b) {
            const uint8_t* blk = src + b * block_size;
            const float d = f16_to_f32(static_cast<uint16_t>(blk[0] | (blk[1] << 8)));
            const uint32_t qh =
                uint32_t(blk[2]) | (uint32_t(blk[3]) << 8) | (uint32_t(blk[4]) << 16) | (uint32_t(blk[5]) << 24);
            const uint8_t* qs = blk + 6;
            int32_t high[32];
#pragma GCC unroll 32
            for (int j = 0; j < 32; ++j)
                high[j] = static_cast<int32_t>((qh >> j) & 1u) << 4;
            float* y = dst + b * qk;
            for (int j = 0; j < 16; ++j) {
                y[j] = static_cast<float>(((qs[j] & 15) | high[j]) - 16) * d;
                y[j + 16] = static_cast<float>(((qs[j] >> 4) | high[j + 16]) - 16) * d;
            }
        }
        return;
    }
    if (type == GgmlType::Q6_K) {
        // Q6_K's reference decodes element by element with index arithmetic (a third of Gemma 3 270M's
        // decode time); here each of the 4 interleaved 32-element groups of a 128-element half is a
        // straight loop. Same f32 operations, so the same bits: (d * scale) * q.
        constexpr int64_t qk = 256, block_size = 210; // ql[128], qh[64], scales[16] (int8), f16 d
        for (int64_t b = 0; b < n / qk; ++b) {
            const uint8_t* blk = src + b * block_size;
            const uint8_t* ql = blk;
            const uint8_t* qh = blk + 128;
            const auto* scales = reinterpret_cast<const int8_t*>(blk + 192);
            const float d = f16_to_f32(static_cast<uint16_t>(blk[208] | (blk[209] << 8)));
            float* y = dst + b * qk;
            for (int c = 0; c < 2; ++c) {
                const uint8_t* lo = ql + 64 * c;
                const uint8_t* hi = qh + 32 * c;
                float* yc = y + 128 * c;
                for (int g = 0; g < 4; ++g) {
                    const uint8_t* low = lo + 32 * (g & 1);
                    const int low_shift = g < 2 ? 0 : 4;
                    for (int half = 0; half < 2; ++half) { // 16 elements share one scale
                        const float ds = d * static_cast<float>(scales[(128 * c + 32 * g + 16 * half) / 16]);
                        for (int l = 16 * half; l < 16 * half + 16; ++l) {
                            const int q = (((low[l] >> low_shift) & 15) | (((hi[l] >> (2 * g)) & 3) << 4)) - 32;
                            yc[32 * g + l] = ds * static_cast<float>(q);
                        }
                    }
                }
            }
        }
        return;
    }
    dequantize_row(type, src, dst, n);
}

} // namespace

int threads_for_work(int64_t work, int n_threads) {
    return work < (int64_t{1} << 20) ? 1 : std::max(n_threads, 1);
}

int threads_for_elems(int64_t elems, int n_threads) {
    return elems < (int64_t{1} << 16) ? 1 : std::max(n_threads, 1);
}

void matmul_dequant(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols, float* y,
                    int n_threads) {
    const size_t row_size = row_bytes(type, n_in);
    const auto* base = static_cast<const uint8_t*>(w);
    const int threads = threads_for_work(n_out * n_in * n_cols, n_threads);
    parallel_for(n_out, threads, 64, [&](int64_t r0, int64_t r1) {
        thread_local std::vector<float> row_buf; // (n_in) f32, kept by each thread between calls
        if (type != GgmlType::F32) row_buf.resize(static_cast<size_t>(n_in));
        for (int64_t r = r0; r < r1; ++r) {
            const uint8_t* src = base + static_cast<size_t>(r) * row_size;
            const float* row;
            if (type == GgmlType::F32) {
                row = reinterpret_cast<const float*>(src);
            } else {
                dequantize_row_for_matmul(type, src, row_buf.data(), n_in);
                row = row_buf.data();
            }
            for (int64_t c = 0; c < n_cols; ++c)
                y[c * n_out + r] = dot_f32(row, x + c * n_in, n_in);
        }
    });
}

namespace {

template <KvElem E> inline float kv_load(const void* base, int64_t i) {
    if constexpr (E == KvElem::f32)
        return static_cast<const float*>(base)[i];
    else if constexpr (E == KvElem::f16)
        return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    else
        return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
}

template <KvElem E>
void attention_head_impl(const float* q, const void* k, const void* v, int64_t n_keys, int64_t head_dim,
                         int64_t head_dim_v, float scale, float softcap, float* scores, float* out) {
    for (int64_t j = 0; j < n_keys; ++j) {
        float s;
        if constexpr (E == KvElem::f32) {
            s = dot_f32(q, static_cast<const float*>(k) + j * head_dim, head_dim);
        } else {
            s = 0.0f;
            for (int64_t d = 0; d < head_dim; ++d)
                s += q[d] * kv_load<E>(k, j * head_dim + d);
        }
        s *= scale;
        if (softcap > 0.0f) s = softcap * std::tanh(s / softcap);
        scores[j] = s;
    }
    softmax_f32(scores, n_keys);
    for (int64_t d = 0; d < head_dim_v; ++d)
        out[d] = 0.0f;
    for (int64_t j = 0; j < n_keys; ++j) {
        const float p = scores[j];
        for (int64_t d = 0; d < head_dim_v; ++d)
            out[d] += p * kv_load<E>(v, j * head_dim_v + d);
    }
}

} // namespace

void attention_head(const float* q, const void* k, const void* v, KvElem elem, int64_t n_keys, int64_t head_dim,
                    int64_t head_dim_v, float scale, float softcap, float* scores, float* out) {
    switch (elem) {
    case KvElem::f32:
        return attention_head_impl<KvElem::f32>(q, k, v, n_keys, head_dim, head_dim_v, scale, softcap, scores, out);
    case KvElem::f16:
        return attention_head_impl<KvElem::f16>(q, k, v, n_keys, head_dim, head_dim_v, scale, softcap, scores, out);
    case KvElem::bf16:
        return attention_head_impl<KvElem::bf16>(q, k, v, n_keys, head_dim, head_dim_v, scale, softcap, scores, out);
    }
}

} // namespace tern
