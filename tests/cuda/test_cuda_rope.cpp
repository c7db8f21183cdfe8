// kernels/cuda/rope.h qk_norm_rope against the CPU forward's loop (engine/cpu/backend_cpu.cpp: per head
// rmsnorm_f32 by q_norm / k_norm, then LayerRope::apply at the token's position), for both pair layouts,
// partial rotation (n_rot < head_dim), frequency factors and scale, GQA head counts, positions from 0 to
// past 100k, and 1 to 100 tokens.
//
// Tolerance: per head, max |gpu - cpu| / max |cpu| <= 1e-6. The rotation and the norm's float steps are
// the CPU's IEEE operations; the cos/sin table is rope_theta's double angle on both sides, and the device's
// double pow/cos/sin (within 2 ulp in double) change a table float only when the double lies within a few
// 1e-16 of a float rounding boundary, by one ulp: that moves an output by about one ulp of the head's
// largest value (6e-8 of it). The norm's double sum of squares, added in another order, moves its float
// mean by at most one ulp in rare heads: about 2 ulp more. So ~4 ulp of the head's scale, under 5e-7. Dims
// past n_rot are untouched without a norm (checked bit for bit), and tokens past n are never written.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/cpu/layer_rope.h"
#include "engine/model_config.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/rope.h"
#include "tests/cuda_device_array.h"
#include "tests/kernel_test_data.h"

using tern::test::DeviceArray;
using tern::test::normalised_error;

namespace {

struct Case {
    const char* what;
    bool neox;
    int32_t head_dim, n_rot, n_heads, n_kv_heads;
    int64_t n;
    int32_t pos0;
    float base, freq_scale;
    bool factors, norm;
    bool yarn = false; // kYarn below
    float temp_scale = 0.0f; // q's attention temperature (mistral3)
    int32_t temp_floor = 0;
};

// YaRN as a factor-8 model with a 4096-token original context has it at n_rot 64 (corr range [10, 23]),
// mscale 0.1 ln 8 + 1.
const tern::RopeYarn kYarn{1.0f, 10.0f, 23.0f, 1.2079442f};

constexpr float kEps = 1e-6f;

// Heads of N(0, 1) scaled per head by 10^k, k in [-2, 2]: without a norm the tolerance is per head.
std::vector<float> heads_of(int64_t n, int32_t heads, int32_t head_dim, uint32_t seed) {
    std::vector<float> v = tern::test::random_normal(static_cast<size_t>(n * heads * head_dim), seed);
    for (size_t h = 0; h < v.size() / static_cast<size_t>(head_dim); ++h) {
        const float scale = std::pow(10.0f, static_cast<float>(static_cast<int>((h * 2654435761u) % 5) - 2));
        for (int32_t d = 0; d < head_dim; ++d) v[h * static_cast<size_t>(head_dim) + static_cast<size_t>(d)] *= scale;
    }
    return v;
}

// The CPU forward's per-token loop over q heads, then k heads.
void cpu_qk_norm_rope(std::vector<float>& q, std::vector<float>& k, const Case& c, const float* q_norm,
                      const float* k_norm, const float* factors) {
    tern::LayerRope rope;
    rope.neox = c.neox;
    rope.head_dim = c.head_dim;
    rope.n_rot = c.n_rot;
    rope.base = c.base;
    rope.freq_scale = c.freq_scale;
    rope.freq_factors = factors;
    if (c.yarn) rope.yarn = kYarn;
    tern::ModelConfig temperature;
    temperature.attn_temp_scale = c.temp_scale;
    temperature.attn_temp_floor = c.temp_floor;
    for (int64_t i = 0; i < c.n; ++i) {
        const int32_t pos = c.pos0 + static_cast<int32_t>(i);
        for (int32_t h = 0; h < c.n_heads; ++h) {
            float* qh = q.data() + (i * c.n_heads + h) * c.head_dim;
            if (q_norm) tern::rmsnorm_f32(qh, q_norm, qh, c.head_dim, kEps);
            rope.apply(qh, pos);
            const float t = temperature.attn_temperature(pos);
            for (int32_t d = 0; d < c.head_dim; ++d) qh[d] *= t;
        }
        for (int32_t h = 0; h < c.n_kv_heads; ++h) {
            float* kh = k.data() + (i * c.n_kv_heads + h) * c.head_dim;
            if (k_norm) tern::rmsnorm_f32(kh, k_norm, kh, c.head_dim, kEps);
            rope.apply(kh, pos);
        }
    }
}

void check_heads(const std::vector<float>& got, const std::vector<float>& want, const std::vector<float>& before,
                 const Case& c, int32_t heads) {
    const auto hd = static_cast<size_t>(c.head_dim);
    double worst = 0.0;
    bool passthrough_kept = true;
    for (size_t h = 0; h < static_cast<size_t>(c.n * heads); ++h) {
        worst = std::max(worst, normalised_error(got, want, h * hd, (h + 1) * hd));
        if (!c.norm)
            for (size_t d = static_cast<size_t>(c.n_rot); d < hd; ++d)
                passthrough_kept &= __builtin_bit_cast(uint32_t, got[h * hd + d]) ==
                                    __builtin_bit_cast(uint32_t, before[h * hd + d]);
    }
    CHECK(worst <= 1e-6);
    CHECK(passthrough_kept);
    // The token after the last one is a guard: never written.
    const size_t end = static_cast<size_t>(c.n * heads) * hd;
    CHECK(std::vector<float>(got.begin() + static_cast<ptrdiff_t>(end), got.end()) ==
          std::vector<float>(before.begin() + static_cast<ptrdiff_t>(end), before.end()));
}

} // namespace

TEST_CASE("qk_norm_rope matches the CPU forward's q/k norm and RoPE") {
    const Case cases[] = {
        // what                                neox  hd   rot  heads kv  n    pos0     base      scale  ff     norm
        {"qwen3: neox, q/k norm, GQA 2:1",     true,  128, 128, 16,   8,  7,   5,       1e6f,     1.0f,  false, true},
        {"llama 3.1: normal, rope_freqs",      false, 128, 128, 32,   8,  3,   30000,   500000.f, 1.0f,  true,  false},
        {"gemma3 decode: neox 256, norm",      true,  256, 256, 4,    1,  1,   1234,    10000.f,  0.125f, false, true},
        {"partial normal rotation, 100 tok",   false, 64,  32,  3,    1,  100, 0,       10000.f,  1.0f,  true,  true},
        {"partial neox, half 20, MHA",         true,  80,  40,  5,    5,  33,  17,      10000.f,  0.25f, true,  true},
        {"partial normal, long context",       false, 96,  64,  6,    2,  2,   131000,  1e6f,     1.0f,  false, false},
        {"partial neox, no norm, factors",     true,  64,  16,  2,    1,  9,   4000,    10000.f,  1.0f,  true,  false},
        {"norm only (n_rot 0)",                true,  64,  0,   2,    2,  4,   3,       10000.f,  1.0f,  false, true},
        {"one head pair, head_dim 2",          false, 2,   2,   1,    1,  5,   1,       10000.f,  1.0f,  false, true},
        {"YaRN: qwen3-like neox, norm",        true,  128, 128, 8,    4,  5,   40000,   1e6f,     0.125f, false, true, true},
        {"YaRN: normal pairs, partial",        false, 96,  64,  4,    2,  3,   100,     10000.f,  0.125f, false, false, true},
        {"YaRN with factors, 100 tok",         true,  64,  64,  2,    1,  100, 0,       150000.f, 0.03125f, true, false, true},
        // mistral3: YaRN and q's temperature across floor steps of 16 (positions 10..59: factors 1, then up)
        {"mistral3: temperature, partial rot", false, 128, 96,  4,    2,  50,  10,      1e9f,     0.0625f, false, true,  true,
         0.1f, 16},
    };
    for (const Case& c : cases) {
        CAPTURE(std::string(c.what));
        const std::vector<float> q0 = heads_of(c.n + 1, c.n_heads, c.head_dim, 1);
        const std::vector<float> k0 = heads_of(c.n + 1, c.n_kv_heads, c.head_dim, 2);
        std::vector<float> q_norm = tern::test::random_normal(static_cast<size_t>(c.head_dim), 3, 0.3f);
        std::vector<float> k_norm = tern::test::random_normal(static_cast<size_t>(c.head_dim), 4, 0.3f);
        for (float& w : q_norm) w += 1.0f;
        for (float& w : k_norm) w += 1.0f;
        // Like Llama 3.1's rope_freqs: near 1 for high frequencies, up to 8 for the low ones (none exactly 1).
        std::vector<float> factors(static_cast<size_t>(std::max(c.n_rot / 2, 1)));
        for (size_t i = 0; i < factors.size(); ++i)
            factors[i] = 1.0f + 7.0f * (static_cast<float>(i) + 0.5f) / static_cast<float>(factors.size());

        std::vector<float> q_want = q0, k_want = k0;
        cpu_qk_norm_rope(q_want, k_want, c, c.norm ? q_norm.data() : nullptr, c.norm ? k_norm.data() : nullptr,
                         c.factors ? factors.data() : nullptr);

        DeviceArray<float> dq(q0), dk(k0), dq_norm(q_norm), dk_norm(k_norm), dfactors(factors);
        tern::cuda::RopeParams rope;
        rope.neox = c.neox;
        rope.n_rot = c.n_rot;
        rope.base = c.base;
        rope.freq_scale = c.freq_scale;
        rope.freq_factors = c.factors ? dfactors.get() : nullptr;
        if (c.yarn) {
            rope.yarn_ext_factor = kYarn.ext_factor;
            rope.yarn_corr_low = kYarn.corr_low;
            rope.yarn_corr_high = kYarn.corr_high;
            rope.mscale = kYarn.mscale;
        }
        rope.q_temp_scale = c.temp_scale;
        rope.q_temp_floor = c.temp_floor;
        tern::cuda::qk_norm_rope(dq.get(), dk.get(), c.n, c.n_heads, c.n_kv_heads, c.head_dim,
                                 c.norm ? dq_norm.get() : nullptr, c.norm ? dk_norm.get() : nullptr, kEps, rope,
                                 c.pos0, nullptr);
        check_heads(dq.read(), q_want, q0, c, c.n_heads);
        check_heads(dk.read(), k_want, k0, c, c.n_kv_heads);
    }
}

TEST_CASE("qk_norm_rope refuses an odd n_rot or one past head_dim, and does nothing for no tokens") {
    tern::cuda::RopeParams rope;
    rope.n_rot = 63;
    CHECK_THROWS_AS(tern::cuda::qk_norm_rope(nullptr, nullptr, 1, 1, 1, 64, nullptr, nullptr, kEps, rope, 0, nullptr),
                    std::invalid_argument);
    rope.n_rot = 66;
    CHECK_THROWS_AS(tern::cuda::qk_norm_rope(nullptr, nullptr, 1, 1, 1, 64, nullptr, nullptr, kEps, rope, 0, nullptr),
                    std::invalid_argument);
    rope.n_rot = 64;
    CHECK_NOTHROW(tern::cuda::qk_norm_rope(nullptr, nullptr, 0, 1, 1, 64, nullptr, nullptr, kEps, rope, 0, nullptr));
}
