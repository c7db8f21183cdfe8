// The context shift: the row rotation kernel (kernels/cpu/rope_shift.h), KvCache::erase on random rows,
// CpuBackend::kv_erase against recomputation on real and synthetic models of every rope variant, for
// every --kv-type; Session::erase and the on_context_full hook; `tern run` past a full context.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend_factory.h"
#include "engine/generation/context_shift.h"
#include "engine/speculative/drafter.h"
#include "engine/cpu/kv_cache.h"
#include "engine/model.h"
#include "engine/generation/session.h"
#include "base/error.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/rope_shift.h"
#include "quant/reference.h"
#include "tests/synth_file.h"
#include "tests/quick_mode.h"
#include "tests/test_support.h"

using namespace tern;
using nlohmann::json;

namespace {

constexpr KvType kAllTypes[] = {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3};

std::vector<float> random_vec(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
}

float max_abs(const float* x, int64_t n) {
    float m = 0.0f;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(x[i]));
    return m;
}

// What one more encoding of a rotated key row may cost, relative to the row's largest element: the
// shift decodes a stored K row, turns it and encodes it again (the f32 cache only rounds the turn).
float k_tolerance(KvType t) {
    switch (t) {
    case KvType::f32: return 1e-5f;
    case KvType::f16: return 3e-3f;
    case KvType::bf16: return 2e-2f;
    case KvType::q8_0: return 2e-2f;
    case KvType::f8_e4m3: return 0.2f;
    }
    return 0.0f;
}

void rope(bool neox, float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float scale,
          const float* factors) {
    if (neox)
        rope_neox_f32(x, head_dim, n_rot, pos, base, scale, factors);
    else
        rope_normal_f32(x, head_dim, n_rot, pos, base, scale, factors);
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The kernel: a key roped at p, turned by delta, is the key roped at p + delta.

TEST_CASE("rope_rotate_rows turns roped rows to other positions as the forward's rope would place them") {
    struct Case {
        bool neox;
        int64_t head_dim, n_rot;
        float base, scale;
        bool factors;
    };
    const Case cases[] = {{false, 8, 8, 10000.0f, 1.0f, false},    {true, 64, 64, 1e6f, 1.0f, false},
                          {false, 64, 32, 10000.0f, 0.25f, false}, {true, 128, 128, 500000.0f, 1.0f, true},
                          {true, 256, 256, 10000.0f, 1.0f, false}, {false, 128, 96, 500000.0f, 0.5f, true}};
    uint32_t seed = 1;
    for (const Case& c : cases) {
        CAPTURE(c.neox);
        CAPTURE(c.head_dim);
        CAPTURE(c.n_rot);
        std::vector<float> factors = random_vec(size_t(c.n_rot / 2), seed++, 1.0f);
        for (float& f : factors) f = 1.0f + std::fabs(f) * 4.0f;   // Llama 3.1's factors are 1 .. 8
        const float* ff = c.factors ? factors.data() : nullptr;
        const int64_t n_rows = 37;
        const std::vector<float> pre = random_vec(size_t(n_rows * c.head_dim), seed++, 3.0f);
        for (const int32_t delta : {-1, -17, -300, -5000, 1, 250}) {
            CAPTURE(delta);
            std::vector<float> rows = pre, want = pre;
            for (int64_t r = 0; r < n_rows; ++r) {
                const int32_t pos = 6000 + int32_t(r) * 31;
                rope(c.neox, rows.data() + r * c.head_dim, c.head_dim, c.n_rot, pos, c.base, c.scale, ff);
                rope(c.neox, want.data() + r * c.head_dim, c.head_dim, c.n_rot, pos + delta, c.base, c.scale, ff);
            }
            rope_rotate_rows(rope_rotation(c.neox, c.n_rot, delta, c.base, c.scale, ff), rows.data(), n_rows,
                             c.head_dim);
            for (int64_t r = 0; r < n_rows; ++r) {
                const float* got = rows.data() + r * c.head_dim;
                const float* exp = want.data() + r * c.head_dim;
                const float tol = 2e-6f * max_abs(exp, c.head_dim) * std::max(1.0f, std::log2(float(std::abs(delta))));
                for (int64_t d = 0; d < c.head_dim; ++d) REQUIRE(std::fabs(got[d] - exp[d]) <= tol);
                // Dims past n_rot pass through untouched.
                for (int64_t d = c.n_rot; d < c.head_dim; ++d) CHECK(got[d] == pre[size_t(r * c.head_dim + d)]);
            }
        }
        // A rotation by delta equals the forward's rope at position delta, bit for bit (same angles, same
        // float cos/sin, same products).
        std::vector<float> a = random_vec(size_t(c.head_dim), seed++), b = a;
        rope(c.neox, a.data(), c.head_dim, c.n_rot, 1234, c.base, c.scale, ff);
        rope_rotate_rows(rope_rotation(c.neox, c.n_rot, 1234, c.base, c.scale, ff), b.data(), 1, c.head_dim);
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
}

TEST_CASE("rope_rotate_rows with YaRN: the shifted key is the key roped at the new position, its mscale kept once") {
    const RopeYarn yarn{1.0f, 10.0f, 23.0f, 1.0f + 0.1f * std::log(8.0f)};
    for (const bool neox : {false, true}) {
        CAPTURE(neox);
        const int64_t head_dim = 64, n_rows = 9;
        const std::vector<float> pre = random_vec(size_t(n_rows * head_dim), neox ? 5u : 6u, 3.0f);
        for (const int32_t delta : {-1, -300, -5000, 250}) {
            CAPTURE(delta);
            std::vector<float> rows = pre, want = pre;
            for (int64_t r = 0; r < n_rows; ++r) {
                const int32_t pos = 9000 + int32_t(r) * 77;
                float* a = rows.data() + r * head_dim;
                float* b = want.data() + r * head_dim;
                if (neox) {
                    rope_neox_f32(a, head_dim, head_dim, pos, 1e6f, 0.125f, nullptr, yarn);
                    rope_neox_f32(b, head_dim, head_dim, pos + delta, 1e6f, 0.125f, nullptr, yarn);
                } else {
                    rope_normal_f32(a, head_dim, head_dim, pos, 1e6f, 0.125f, nullptr, yarn);
                    rope_normal_f32(b, head_dim, head_dim, pos + delta, 1e6f, 0.125f, nullptr, yarn);
                }
            }
            rope_rotate_rows(rope_rotation(neox, head_dim, delta, 1e6f, 0.125f, nullptr, yarn), rows.data(), n_rows,
                             head_dim);
            for (int64_t r = 0; r < n_rows; ++r) {
                const float* got = rows.data() + r * head_dim;
                const float* exp = want.data() + r * head_dim;
                const float tol = 2e-6f * max_abs(exp, head_dim) * std::max(1.0f, std::log2(float(std::abs(delta))));
                for (int64_t d = 0; d < head_dim; ++d) REQUIRE(std::fabs(got[d] - exp[d]) <= tol);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// KvCache::erase on random rows.

namespace {

struct RandomCache {
    KvCache cache;
    std::vector<int32_t> heads = {2, 1, 2};
    int32_t head_dim = 64, head_dim_v = 96, n_ctx = 300, n = 290;   // three pages
    // The stored bytes of every row before the erase, per layer: (head, pos) rows.
    std::vector<std::vector<uint8_t>> k_bytes, v_bytes;

    explicit RandomCache(KvType type) {
        cache.init(type, heads, head_dim, head_dim_v, n_ctx);
        for (size_t l = 0; l < heads.size(); ++l) {
            const std::vector<float> k = random_vec(size_t(n * heads[l] * head_dim), 10 + uint32_t(l), 2.0f);
            const std::vector<float> v = random_vec(size_t(n * heads[l] * head_dim_v), 20 + uint32_t(l), 2.0f);
            for (int32_t p = 0; p < n; ++p)
                cache.write(int32_t(l), p, k.data() + size_t(p * heads[l] * head_dim),
                            v.data() + size_t(p * heads[l] * head_dim_v));
        }
        cache.set_n_past(n);
        const size_t kr = kv_row_bytes(cache.format(), head_dim), vr = kv_row_bytes(cache.format(), head_dim_v);
        for (size_t l = 0; l < heads.size(); ++l) {   // (head, pos) rows, gathered from the cache's pages
            k_bytes.emplace_back(size_t(heads[l]) * size_t(n_ctx) * kr);
            v_bytes.emplace_back(size_t(heads[l]) * size_t(n_ctx) * vr);
            for (int32_t h = 0; h < heads[l]; ++h)
                for (int32_t p = 0; p < n; ++p) {
                    std::memcpy(k_bytes[l].data() + (size_t(h) * size_t(n_ctx) + size_t(p)) * kr,
                                cache.k_row(int32_t(l), h, p), kr);
                    std::memcpy(v_bytes[l].data() + (size_t(h) * size_t(n_ctx) + size_t(p)) * vr,
                                cache.v_row(int32_t(l), h, p), vr);
                }
        }
    }
    const uint8_t* old_k(size_t l, int32_t h, int32_t p) const {
        return k_bytes[l].data() + (size_t(h) * size_t(n_ctx) + size_t(p)) * kv_row_bytes(cache.format(), head_dim);
    }
    const uint8_t* old_v(size_t l, int32_t h, int32_t p) const {
        return v_bytes[l].data() + (size_t(h) * size_t(n_ctx) + size_t(p)) * kv_row_bytes(cache.format(), head_dim_v);
    }
};

} // namespace

TEST_CASE("KvCache::erase moves the later rows down, turning K by the given rotation, for every KV type") {
    for (KvType type : kAllTypes) {
        CAPTURE(std::string(kv_type_name(type)));
        for (const auto& [begin, end] : {std::pair{13, 31}, std::pair{0, 9}, std::pair{40, 70}, std::pair{5, 69},
                                          std::pair{120, 135}, std::pair{100, 290}, std::pair{3, 260}}) {
            CAPTURE(begin);
            CAPTURE(end);
            for (const bool rotate : {false, true}) {
                CAPTURE(rotate);
                RandomCache rc(type);
                const KvType fmt = rc.cache.format();
                // Layer 1 is left unrotated (n_rot 0), as a layer without rope would be.
                std::vector<RopeRotation> rot;
                if (rotate) {
                    rot.push_back(rope_rotation(false, 64, begin - end, 10000.0f, 1.0f, nullptr));
                    rot.push_back(RopeRotation{});
                    rot.push_back(rope_rotation(true, 32, begin - end, 1e6f, 1.0f, nullptr));
                }
                rc.cache.erase(begin, end, rot, 2);
                REQUIRE(rc.cache.n_past() == rc.n - (end - begin));
                const size_t kr = kv_row_bytes(fmt, rc.head_dim), vr = kv_row_bytes(fmt, rc.head_dim_v);
                std::vector<float> row(size_t(rc.head_dim));
                std::vector<uint8_t> encoded(kr);
                for (size_t l = 0; l < rc.heads.size(); ++l) {
                    for (int32_t h = 0; h < rc.heads[l]; ++h) {
                        for (int32_t p = 0; p < rc.cache.n_past(); ++p) {
                            const int32_t old = p < begin ? p : p + (end - begin);
                            CHECK(std::memcmp(rc.cache.v_row(int32_t(l), h, p), rc.old_v(l, h, old), vr) == 0);
                            if (p < begin || !rotate || rot[l].n_rot == 0) {
                                CHECK(std::memcmp(rc.cache.k_row(int32_t(l), h, p), rc.old_k(l, h, old), kr) == 0);
                                continue;
                            }
                            // decode -> turn -> encode, exactly (the f32 cache turns its rows in place).
                            kv_load_row(fmt, rc.old_k(l, h, old), row.data(), rc.head_dim);
                            rope_rotate_rows(rot[l], row.data(), 1, rc.head_dim);
                            kv_store_row(fmt, row.data(), encoded.data(), rc.head_dim);
                            CHECK(std::memcmp(rc.cache.k_row(int32_t(l), h, p), encoded.data(), kr) == 0);
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("KvCache::erase: an empty range changes nothing, a range past n_past throws") {
    RandomCache rc(KvType::f16);
    rc.cache.erase(20, 20, {}, 1);
    CHECK(rc.cache.n_past() == rc.n);
    for (int32_t p = 0; p < rc.n; ++p)
        CHECK(std::memcmp(rc.cache.k_row(0, 1, p), rc.old_k(0, 1, p), kv_row_bytes(KvType::f16, 64)) == 0);
    CHECK_THROWS_AS(rc.cache.erase(10, rc.n + 1, {}, 1), UsageError);
    CHECK_THROWS_AS(rc.cache.erase(-1, 3, {}, 1), UsageError);
    CHECK_THROWS_AS(rc.cache.erase(9, 8, {}, 1), UsageError);
    CHECK(rc.cache.n_past() == rc.n);
}

// ---------------------------------------------------------------------------------------------
// CpuBackend::kv_erase against recomputation.
//
// After an erase, a moved token's K/V in layers above the first were computed while it still saw
// the erased tokens, so no cold prefill can reproduce them; only layer 0 (a function of the token
// and its position) can. So there are two oracles:
//  (a) layer 0 after erasing [b, e) of a prefill of T equals a cold prefill of T without [b, e);
//  (b) every layer: build a cache whose tokens after e never saw [b, e) (splice the rows of a cold
//      prefill of S + R, moved to positions e.. by the forward's own rope, behind a prefill of S + G),
//      erase [b, e), and it must equal the cold prefill of S + R (K/V and the next logits): the
//      shift's rotation undoes the splice's for every layer's base, style and K norm.

namespace {

struct Loaded {
    std::shared_ptr<Model> model;
    std::string name;
};

std::unique_ptr<Backend> backend_for(const Model& m, KvType type, int32_t n_ctx, bool exact_matmul = false) {
    RunOptions run;
    run.n_ctx = n_ctx;
    run.kv_type = type;
    std::unique_ptr<Backend> b = make_backend("cpu", CpuOptions{1, exact_matmul});
    b->load(m.config, m.weights, run);
    return b;
}

void prefill(Backend& b, const std::vector<int32_t>& tokens) {
    if (tokens.empty()) return;
    ForwardBatch batch;
    batch.tokens = tokens;
    batch.pos0 = b.n_past();
    b.forward(batch);
}

std::vector<float> next_logits(Backend& b, int32_t token) {
    ForwardBatch batch;
    const std::vector<int32_t> one = {token};
    batch.tokens = one;
    batch.pos0 = b.n_past();
    b.forward(batch);
    const std::span<const float> l = b.logits(0);
    return {l.begin(), l.end()};
}

// Where the rows of a kv_save snapshot are ("TKV2": 7 header ints, then per layer, per head: n K rows,
// n V rows, each in the cache's stored format).
struct SnapshotRows {
    const ModelConfig& c;
    KvType fmt;
    int32_t n;
    size_t kr() const { return kv_row_bytes(fmt, c.head_dim); }
    size_t vr() const { return kv_row_bytes(fmt, c.head_dim_v); }
    size_t head_start(int32_t l, int32_t h) const {
        size_t off = 7 * sizeof(int32_t);
        for (int32_t i = 0; i < l; ++i) off += size_t(c.layers[size_t(i)].n_kv_heads) * size_t(n) * (kr() + vr());
        return off + size_t(h) * size_t(n) * (kr() + vr());
    }
    size_t k(int32_t l, int32_t h, int32_t p) const { return head_start(l, h) + size_t(p) * kr(); }
    size_t v(int32_t l, int32_t h, int32_t p) const { return head_start(l, h) + size_t(n) * kr() + size_t(p) * vr(); }
};

KvType format_of(KvType t) {
    switch (t) {
    case KvType::f32: return KvType::f32;
    case KvType::f16: return KvType::f16;
    case KvType::bf16: return KvType::bf16;
    case KvType::q8_0: return KvType::q8_0;
    case KvType::f8_e4m3: return KvType::f8_e4m3;
    }
    return KvType::f16;
}

// Compares rows [0, n) of layers [0, n_layers) of two snapshots of n positions: K and V decoded, each
// element within tol * the row's largest.
void check_rows(const Model& m, KvType type, const KvSnapshot& got, const KvSnapshot& want, int32_t n,
                int32_t n_layers, float tol) {
    const ModelConfig& c = m.config;
    const SnapshotRows rows{c, format_of(type), n};
    REQUIRE(got.bytes.size() == want.bytes.size());
    std::vector<float> a(size_t(std::max(c.head_dim, c.head_dim_v))), b(a.size());
    float worst = 0.0f;
    for (int32_t l = 0; l < n_layers; ++l) {
        for (int32_t h = 0; h < c.layers[size_t(l)].n_kv_heads; ++h) {
            for (int32_t p = 0; p < n; ++p) {
                for (const bool is_k : {true, false}) {
                    const int64_t dim = is_k ? c.head_dim : c.head_dim_v;
                    const size_t off = is_k ? rows.k(l, h, p) : rows.v(l, h, p);
                    kv_load_row(rows.fmt, got.bytes.data() + off, a.data(), dim);
                    kv_load_row(rows.fmt, want.bytes.data() + off, b.data(), dim);
                    const float scale = std::max(max_abs(b.data(), dim), 1e-6f);
                    for (int64_t d = 0; d < dim; ++d) worst = std::max(worst, std::fabs(a[size_t(d)] - b[size_t(d)]) / scale);
                }
            }
        }
    }
    CAPTURE(worst);
    CHECK(worst <= tol);
}

// Relative to the largest logit: how far the logits after a shift are from the cold prefill's.
float logits_distance(const std::vector<float>& a, const std::vector<float>& b) {
    float worst = 0.0f, scale = 1e-6f;
    for (size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::fabs(a[i] - b[i]));
        scale = std::max(scale, std::fabs(b[i]));
    }
    return worst / scale;
}

// The logits' tolerance after a shift: the K rounding of the type, through every layer above.
float logits_tolerance(KvType t) {
    switch (t) {
    case KvType::f32: return 1e-4f;
    case KvType::f16: return 1e-2f;
    case KvType::bf16: return 5e-2f;
    case KvType::q8_0: return 5e-2f;
    case KvType::f8_e4m3: return 0.25f;
    }
    return 0.0f;
}

std::vector<int32_t> test_tokens(const Model& m, int32_t n) {
    std::vector<int32_t> t;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> dist(3, std::min(m.config.vocab, 500) - 1);
    for (int32_t i = 0; i < n; ++i) t.push_back(dist(rng));
    return t;
}

// One backend serves every step: kv_truncate(0) starts each prefill afresh.
void check_erase_against_recomputation(const Model& m, Backend& be, KvType type, int32_t begin, int32_t end,
                                       float logits_tol) {
    CAPTURE(std::string(kv_type_name(type)));
    CAPTURE(begin);
    CAPTURE(end);
    const ModelConfig& c = m.config;
    const int32_t n = 40, d = end - begin, kept = n - d;
    const std::vector<int32_t> T = test_tokens(m, n);
    const std::vector<int32_t> S(T.begin(), T.begin() + begin), G(T.begin() + begin, T.begin() + end),
        R(T.begin() + end, T.end());
    std::vector<int32_t> SR = S;
    SR.insert(SR.end(), R.begin(), R.end());
    const int32_t next = T[5];

    // The cold prefill of what remains.
    be.kv_truncate(0);
    prefill(be, SR);
    const KvSnapshot want = be.kv_save(kept);
    const std::vector<float> want_logits = next_logits(be, next);

    // (a) layer 0 after erasing from a prefill of T.
    {
        be.kv_truncate(0);
        prefill(be, T);
        be.kv_erase(begin, end);
        REQUIRE(be.n_past() == kept);
        check_rows(m, type, be.kv_save(kept), want, kept, 1, k_tolerance(type));
        if (end == n) {   // nothing moved: the cache is the cold prefill's, every layer
            check_rows(m, type, be.kv_save(kept), want, kept, c.n_layers, 0.0f);
            CHECK(logits_distance(next_logits(be, next), want_logits) == 0.0f);
        }
    }

    // (b) the splice, every layer and the next logits.
    be.kv_truncate(0);
    prefill(be, T);
    KvSnapshot spliced = be.kv_save(n);
    const SnapshotRows to{c, format_of(type), n}, from{c, format_of(type), kept};
    std::vector<float> factors;
    if (m.weights.rope_freqs.present()) {
        factors.resize(size_t(m.weights.rope_freqs.n_in()));
        dequantize_row(m.weights.rope_freqs.type, m.weights.rope_freqs.data, factors.data(), m.weights.rope_freqs.n_in());
    }
    std::vector<float> row(size_t(c.head_dim));
    for (int32_t l = 0; l < c.n_layers; ++l) {
        const LayerConfig& lc = c.layers[size_t(l)];
        for (int32_t h = 0; h < lc.n_kv_heads; ++h) {
            for (int32_t p = begin; p < kept; ++p) {
                kv_load_row(to.fmt, want.bytes.data() + from.k(l, h, p), row.data(), c.head_dim);
                // Turned forward by d: the forward's angles (YaRN's too), its mscale not applied twice.
                const RopeYarn yarn{lc.yarn_ext_factor, lc.yarn_corr_low, lc.yarn_corr_high, lc.rope_mscale};
                rope_rotate_rows(rope_rotation(c.rope_style == RopeStyle::neox, c.n_rot, d, lc.rope_base,
                                               lc.rope_freq_scale, factors.empty() ? nullptr : factors.data(), yarn),
                                 row.data(), 1, c.head_dim);
                kv_store_row(to.fmt, row.data(), spliced.bytes.data() + to.k(l, h, p + d), c.head_dim);
                std::memcpy(spliced.bytes.data() + to.v(l, h, p + d), want.bytes.data() + from.v(l, h, p), to.vr());
            }
        }
    }
    be.kv_load(spliced);
    be.kv_erase(begin, end);
    REQUIRE(be.n_past() == kept);
    check_rows(m, type, be.kv_save(kept), want, kept, c.n_layers, k_tolerance(type));
    const float dist = logits_distance(next_logits(be, next), want_logits);
    CAPTURE(dist);
    CHECK(dist <= logits_tol);
}

// logits_scale > 1 widens the logits' tolerance: with activation quantization (the default matmul
// path) a K difference of 1e-6 can flip a rounding of an activation that then moves a logit by ~1%.
// middle_only: the middle range alone, for a model whose rope (not the range's edge cases, which every other
// model here runs) is what is being checked.
void check_model(const Model& m, std::initializer_list<KvType> types, bool exact_matmul = false,
                 float logits_scale = 1.0f, bool middle_only = false) {
    for (KvType type : types) {
        auto be = backend_for(m, type, 64, exact_matmul);
        const float tol = logits_tolerance(type) * logits_scale;
        check_erase_against_recomputation(m, *be, type, 7, 19, tol);   // the middle
        if (middle_only) continue;
        check_erase_against_recomputation(m, *be, type, 0, 11, tol);   // from the start
        check_erase_against_recomputation(m, *be, type, 26, 40, tol);  // the end: nothing moves
        check_erase_against_recomputation(m, *be, type, 1, 39, tol);   // all but the first and the last
    }
}

void check_bad_ranges(const Model& m) {
    auto b = backend_for(m, KvType::f16, 64);
    prefill(*b, test_tokens(m, 20));
    const KvSnapshot before = b->kv_save(20);
    b->kv_erase(4, 4);   // empty: nothing changes
    CHECK(b->n_past() == 20);
    CHECK(b->kv_save(20).bytes == before.bytes);
    CHECK_THROWS_AS(b->kv_erase(4, 21), UsageError);
    CHECK_THROWS_AS(b->kv_erase(-1, 2), UsageError);
    CHECK_THROWS_AS(b->kv_erase(5, 4), UsageError);
    CHECK(b->kv_save(20).bytes == before.bytes);
}

Model shared_model(const std::string& relative) { return load_model(test::shared_path(relative).string()); }

} // namespace

TEST_CASE("kv_erase equals recomputation: llama (normal rope), stories260K and synth-k256") {
    if (!test::shared_available()) return;
    const Model stories = shared_model("models/gguf/stories260K-f32.gguf");   // head dim 8: float KV types only
    check_model(stories, {KvType::f32, KvType::f16, KvType::bf16});
    check_bad_ranges(stories);
    check_model(shared_model("models/synth/synth-k256-f32.gguf"),
                {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3});
}

TEST_CASE("kv_erase equals recomputation: qwen2 (neox rope, q/k/v biases)") {
    if (!test::shared_available()) return;
    check_model(shared_model("models/synth/synth-qwen2-k256-f32.gguf"),
                {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3});
}

TEST_CASE("kv_erase equals recomputation: a qwen3-like synth model (K norm before rope)") {
    test::TempDir dir;
    const Model m = load_model(synth_file(dir, "tiny-qwen3", "f32"));
    REQUIRE(m.config.qk_norm);
    REQUIRE(m.config.rope_style == RopeStyle::neox);
    check_model(m, {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3});
    check_bad_ranges(m);
}

TEST_CASE("kv_erase equals recomputation: qwen3 with YaRN rope scaling (ramped angles, mscale kept once)") {
    test::TempDir dir;
    const Model m = load_model(synth_file(dir, "tiny-qwen3-yarn", "f32"));
    REQUIRE(m.config.layers[0].yarn_ext_factor == 1.0f);
    REQUIRE(m.config.layers[0].rope_mscale > 1.1f);
    check_model(m, {KvType::f32, KvType::f16});
}

TEST_CASE("kv_erase equals recomputation: Gemma 3 270M (local and global rope bases)") {
    const std::filesystem::path path = std::filesystem::path(std::getenv("HOME") ? std::getenv("HOME") : "") /
                                       ".cache/tern/models/gemma-3-270m-q4_k_m.gguf";
    if (!std::filesystem::exists(path)) return;
    const Model m = load_model(path.string());
    bool two_bases = false;
    for (const LayerConfig& lc : m.config.layers) two_bases |= lc.rope_base != m.config.layers[0].rope_base;
    REQUIRE(two_bases);
    // TERN_TEST_QUICK=1 (tests/quick_mode.h): the middle range only, which moves and turns rows of both the
    // local and the global layers, on f32 KV; the range's edges (from the start, nothing moved, all but two) are
    // the same code for every rope and, like q8_0 KV on the default matmul path, run on each of the models above.
    const bool quick = test::quick_mode();
    // f32 KV with f32 matmuls: the logits within 1e-4 show both bases turn right.
    check_model(m, {KvType::f32}, true, 1.0f, quick);
    // The default path on q8_0 KV: the rows as tight, the logits within the activation rounding (measured:
    // up to 0.05 of the largest logit, f32 KV included).
    if (!quick) check_model(m, {KvType::q8_0}, false, 3.0f);
}

// ---------------------------------------------------------------------------------------------
// Session::erase, the on_context_full hook, and `tern run` past a full context (stories260K).

namespace {

std::string stories_path() { return test::shared_path("models/gguf/stories260K-f32.gguf").string(); }

std::unique_ptr<Session> stories_session(int32_t n_ctx) {
    auto model = std::make_shared<Model>(load_model(stories_path()));
    auto backend = backend_for(*model, KvType::f32, n_ctx);
    std::unique_ptr<Tokenizer> tok = Tokenizer::from_gguf(model->file);
    return std::make_unique<Session>(std::move(backend), std::move(tok), n_ctx, model);
}

GenerateOptions greedy(int32_t n) {
    GenerateOptions o;
    o.n_predict = n;
    o.sampling.temp = 0.0f;
    return o;
}

const std::vector<int32_t> kOnceUponATime = {1, 403, 407, 261, 378};   // BOS "Once upon a time"

} // namespace

TEST_CASE("Session::erase drops cached tokens, and the next generate reuses what remains") {
    if (!test::shared_available()) return;
    auto s = stories_session(64);
    REQUIRE(s->tokenizer().encode("Once upon a time", {true, true}) == kOnceUponATime);
    s->generate(kOnceUponATime, greedy(30));
    std::vector<int32_t> cached = s->kv_tokens();
    REQUIRE(cached.size() == 34);   // the last generated token is not forwarded
    CHECK_FALSE(s->kv_shifted());
    s->erase(3, 13);
    cached.erase(cached.begin() + 3, cached.begin() + 13);
    CHECK(s->kv_tokens() == cached);
    CHECK(s->backend().n_past() == 24);
    CHECK(s->kv_shifted());
    std::vector<int32_t> next = cached;
    next.push_back(cached.back());
    const GenerateResult r = s->generate(next, greedy(5));
    CHECK(r.n_reused == 24);
    CHECK(r.n_prefilled == 1);
    CHECK_THROWS_AS(s->erase(10, 100), std::invalid_argument);
    s->reset();
    CHECK_FALSE(s->kv_shifted());
}

TEST_CASE("on_context_full: a shift lets generation go past the context; without it, stop_reason context") {
    if (!test::shared_available()) return;
    const int32_t n_ctx = 32, n_keep = 5;
    const GenerateResult stopped = stories_session(n_ctx)->generate(kOnceUponATime, greedy(100));
    CHECK(stopped.stop_reason == StopReason::context);
    CHECK(stopped.n_gen() == n_ctx - 5 + 1);

    auto run_shifted = [&](Drafter* drafter, int& shifts) {
        auto s = stories_session(n_ctx);
        GenerateOptions o = greedy(100);
        o.drafter = drafter;
        o.on_context_full = [&](Session& session) {
            CHECK(static_cast<int32_t>(session.kv_tokens().size()) == n_ctx);
            CHECK(shift_context(session, n_keep) == (n_ctx - n_keep) / 2);
            ++shifts;
        };
        const GenerateResult r = s->generate(kOnceUponATime, o);
        // The kept start and the most recent tokens are what the cache holds.
        std::vector<int32_t> all = kOnceUponATime;
        all.insert(all.end(), r.tokens.begin(), r.tokens.end());
        const std::vector<int32_t>& kv = s->kv_tokens();
        CHECK(std::equal(kOnceUponATime.begin(), kOnceUponATime.begin() + n_keep, kv.begin()));
        CHECK(std::equal(kv.begin() + n_keep, kv.end(), all.end() - 1 - int(kv.size() - n_keep)));
        return r;
    };
    int shifts = 0;
    const GenerateResult r = run_shifted(nullptr, shifts);
    CHECK(r.stop_reason == StopReason::length);
    CHECK(r.n_gen() == 100);
    CHECK(shifts == 6);   // 5 + 100 - 1 positions forwarded: 32, then 13 more freed by each shift
    // The first n_ctx - 5 + 1 tokens are those of the unshifted run.
    CHECK(std::equal(stopped.tokens.begin(), stopped.tokens.end(), r.tokens.begin()));

    // Drafted tokens fit the room left after a shift, and drafting never changes the output.
    PromptLookupDrafter lookup(8, 3);
    int drafted_shifts = 0;
    const GenerateResult d = run_shifted(&lookup, drafted_shifts);
    CHECK(d.tokens == r.tokens);
    CHECK(drafted_shifts == shifts);
}

TEST_CASE("tern run: -n past the context shifts it, once noted on stderr; --no-context-shift stops") {
    if (!test::shared_available()) return;
    const std::vector<std::string> base = {"run", "-m", stories_path(), "--device", "cpu", "-p", "Once upon a time",
                                           "--temp", "0", "-c", "64", "--json"};
    auto with = [&](std::vector<std::string> extra) {
        std::vector<std::string> all = base;
        all.insert(all.end(), extra.begin(), extra.end());
        return test::run_tern(all);
    };
    const test::CommandResult shifted = with({"-n", "200"});
    REQUIRE_MESSAGE(shifted.exit_code == 0, shifted.err);
    const json j = json::parse(shifted.out);
    CHECK(j["n_gen"] == 200);
    CHECK(j["stop_reason"] == "length");
    const std::string note = "is full: keeping the first 5 and dropping the older half of the rest";
    const size_t at = shifted.err.find(note);
    CHECK(at != std::string::npos);
    CHECK(shifted.err.find(note, at + 1) == std::string::npos);

    const test::CommandResult stopped = with({"-n", "200", "--no-context-shift"});
    REQUIRE_MESSAGE(stopped.exit_code == 0, stopped.err);
    const json js = json::parse(stopped.out);
    CHECK(js["stop_reason"] == "context");
    CHECK(js["n_gen"] == 64 - 5 + 1);
    CHECK(stopped.err.find("is full") == std::string::npos);
    // The first tokens agree: the shift only changes what comes after the context filled.
    for (int i = 0; i < 60; ++i) CHECK(j["tokens"][i] == js["tokens"][i]);

    const test::CommandResult keep2 = with({"-n", "200", "--keep", "2"});
    REQUIRE_MESSAGE(keep2.exit_code == 0, keep2.err);
    CHECK(keep2.err.find("keeping the first 2 ") != std::string::npos);
    CHECK(json::parse(keep2.out)["n_gen"] > 64 - 5 + 1);   // past the context (this text ends with EOS)

    const test::CommandResult bad = with({"-n", "200", "--keep", "-2"});
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("--keep") != std::string::npos);
}

// TERN_BENCH=1 ./test_context_shift -tc='bench*': one shift of a full Gemma 3 270M-shaped cache (18 layers,
// 1 KV head, head dim 256, 8192 positions; keep 4, drop half the rest), one thread, thread CPU time (best of 3),
// against moving the same rows without turning K (memmove only).
TEST_CASE("bench: a context shift of a full cache, every KV type" * doctest::skip(std::getenv("TERN_BENCH") == nullptr)) {
    const int32_t layers = 18, n_ctx = 8192, head_dim = 256;
    auto cpu_ms = [] {
        timespec t{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
        return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
    };
    for (KvType type : kAllTypes) {
        KvCache c;
        c.init(type, std::vector<int32_t>(size_t(layers), 1), head_dim, head_dim, n_ctx);
        const std::vector<float> k = random_vec(size_t(head_dim), 1), v = random_vec(size_t(head_dim), 2);
        for (int32_t l = 0; l < layers; ++l)
            for (int32_t p = 0; p < n_ctx; ++p) c.write(l, p, k.data(), v.data());
        const int32_t begin = 4, end = 4 + (n_ctx - 4) / 2;
        const std::vector<RopeRotation> turn(size_t(layers), rope_rotation(true, head_dim, begin - end, 1e6f, 1.0f, nullptr));
        double shift = 1e30, move = 1e30;
        for (int rep = 0; rep < 3; ++rep) {
            c.set_n_past(n_ctx);
            double t0 = cpu_ms();
            c.erase(begin, end, turn, 1);
            shift = std::min(shift, cpu_ms() - t0);
            c.set_n_past(n_ctx);
            t0 = cpu_ms();
            c.erase(begin, end, {}, 1);
            move = std::min(move, cpu_ms() - t0);
        }
        MESSAGE(std::string(kv_type_name(type)) << ": KV " << c.total_bytes() / 1e6 << " MB, shift " << shift
                                                << " ms, memmove only " << move << " ms");
    }
}
