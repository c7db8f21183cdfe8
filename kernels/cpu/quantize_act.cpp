// Scalar activation quantizers (rounding rules in quantize_act.h) and the activation-format table.
#include "kernels/cpu/quantize_act.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/ops.h"
#include "base/parallel_for.h"
#include "quant/half.h"

namespace tern {

ActFormat act_format_for(GgmlType w) {
    switch (w) {
    case GgmlType::Q4_0:
    case GgmlType::Q5_0:
    case GgmlType::Q8_0:
    case GgmlType::IQ4_NL:
    case GgmlType::MXFP4:
    case GgmlType::F8_E4M3: return ActFormat::q8_0;
    case GgmlType::Q4_1:
    case GgmlType::Q5_1: return ActFormat::q8_1;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
    case GgmlType::Q4_K:
    case GgmlType::Q5_K:
    case GgmlType::Q6_K:
    case GgmlType::IQ4_XS: return ActFormat::q8_k;
    case GgmlType::F16: return ActFormat::f16;
    case GgmlType::BF16: return ActFormat::bf16;
    case GgmlType::F32: return ActFormat::f32;
    default: break;
    }
    throw std::invalid_argument("act_format_for: no CPU dot kernel for weight format " + std::string(type_name(w)) +
                                " (supported: q4_0 q4_1 q5_0 q5_1 q8_0 q2_K..q6_K iq4_nl iq4_xs mxfp4 f8_e4m3 f16 "
                                "bf16 f32)");
}

int64_t act_block_elems(ActFormat f) {
    switch (f) {
    case ActFormat::q8_0:
    case ActFormat::q8_1: return 32;
    case ActFormat::q8_k: return QK_K;
    default: return 1;
    }
}

size_t act_row_bytes(ActFormat f, int64_t n) {
    const auto un = static_cast<size_t>(n);
    switch (f) {
    case ActFormat::f32: return un * 4;
    case ActFormat::f16:
    case ActFormat::bf16: return un * 2;
    case ActFormat::q8_0: return un / QK8_0 * sizeof(BlockQ8_0);
    case ActFormat::q8_1: return un / QK8_1 * sizeof(BlockQ8_1);
    case ActFormat::q8_k: return un / QK_K * sizeof(BlockQ8_K);
    }
    return 0;
}

const char* act_format_name(ActFormat f) {
    switch (f) {
    case ActFormat::f32: return "f32";
    case ActFormat::f16: return "f16";
    case ActFormat::bf16: return "bf16";
    case ActFormat::q8_0: return "q8_0";
    case ActFormat::q8_1: return "q8_1";
    case ActFormat::q8_k: return "q8_K";
    }
    return "?";
}

namespace {

// One 32-element block the way ggml's AVX quantize_row_q8_0/q8_1 does it; returns sum(q) for Q8_1.
// std::nearbyint rounds in the current mode, which is round-to-nearest-even unless someone changed it
// (tern never does), exactly like _mm256_round_ps(_MM_ROUND_NEAREST). The product x * id is one f32
// multiply (the build has -ffp-contract=off), as in ggml.
int quantize_q8_block(const float* x, int8_t* qs, float& d) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
        float v = std::nearbyint(x[j] * id);
        v = v > 127.0f ? 127.0f : (v < -128.0f ? -128.0f : v);   // the packs' saturation; never reached
        qs[j] = static_cast<int8_t>(v);
        sum += qs[j];
    }
    return sum;
}

} // namespace

void quantize_act_q8_0_scalar(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_0*>(dst);
    for (int64_t b = 0; b < n / QK8_0; ++b) {
        float d;
        quantize_q8_block(x + b * QK8_0, y[b].qs, d);
        y[b].d = f32_to_f16(d);
    }
}

void quantize_act_q8_1_scalar(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_1*>(dst);
    for (int64_t b = 0; b < n / QK8_1; ++b) {
        float d;
        const int sum = quantize_q8_block(x + b * QK8_1, y[b].qs, d);
        y[b].d = f32_to_f16(d);
        y[b].s = f32_to_f16(d * static_cast<float>(sum));
    }
}

void quantize_act_q8_k_scalar(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<BlockQ8_K*>(dst);
    for (int64_t b = 0; b < n / QK_K; ++b, x += QK_K) {
        BlockQ8_K& blk = y[b];
        float amax = 0.0f, max = 0.0f;   // the first element with the largest |x| (signed max)
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            std::memset(&blk, 0, sizeof blk);
            continue;
        }
        const float iscale = -127.0f / max;
        for (int j = 0; j < QK_K; ++j) {
            const float v = std::nearbyint(iscale * x[j]);   // ggml's nearest_int: ties to even
            blk.qs[j] = static_cast<int8_t>(v > 127.0f ? 127.0f : v);
        }
        for (int k = 0; k < QK_K / 16; ++k) {
            int s = 0;
            for (int l = 0; l < 16; ++l) s += blk.qs[16 * k + l];
            blk.bsums[k] = static_cast<int16_t>(s);
        }
        blk.d = 1.0f / iscale;
    }
}

void quantize_act_f16_scalar(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) y[i] = f32_to_f16(x[i]);
}

void quantize_act_bf16_scalar(const float* x, void* dst, int64_t n) {
    auto* y = static_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) y[i] = f32_to_bf16(x[i]);
}

void quantize_act_f32(const float* x, void* dst, int64_t n) {
    std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
}

void quantize_acts(ActFormat f, const float* x, int64_t n_in, int64_t n_cols, void* dst, int n_threads) {
    const int64_t be = act_block_elems(f);
    if (n_in % be != 0)
        throw std::invalid_argument("quantize_acts: " + std::to_string(n_in) + " elements is not a multiple of the " +
                                    act_format_name(f) + " block size " + std::to_string(be));
    const QuantizeActFn q = cpu_kernels().quantize[static_cast<int>(f)];
    const size_t rb = act_row_bytes(f, n_in);
    const int threads = n_cols > 1 ? threads_for_elems(n_cols * n_in, n_threads) : 1;
    parallel_for(n_cols, threads, 16, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) q(x + c * n_in, static_cast<char*>(dst) + static_cast<size_t>(c) * rb, n_in);
    });
}

} // namespace tern
