// The GPU KV cache and attention (kernels/cuda/attention.h) on the CUDA emulator, against their CPU twins:
//   kv_write  bit for bit with kv_store_row (kernels/cpu/attention.h) for every format, ties and edge
//             values included, and nothing outside the written rows touched;
//   attention against a double-precision reference over the kv_load_row'd cache and against the CPU's
//             attend_tokens, by normalised error, for every format, GQA groups 1..8, head dims 32..256
//             (and, for the float formats, the small head dims 4..40 of small models, groups up to 64),
//             decode / drafts / prefill, sliding windows, softcap, ragged sizes and positions up to n_ctx;
//             The split-KV path (partial states merged by the last block) and the single pass both run,
//             and the launchers allocate no device memory; decode and drafts at 5000 positions over tens
//             of splits, paged and with pos0 read from device memory as a replayed graph (the same bits),
//             and the previous decode kernel (set_old_decode_attention) too; attention sinks (gpt-oss) on
//             both paths;
//   attention_tokens (sequences over a paged pool) against the double-precision reference, sinks, windows and
//             split tokens included;
//   both launched as programmatic dependents (as the backend's forward launches them): the same bits, every
//             launch programmatic, the emulator's check of the wait before the split merge's atomics passing;
//   kv_erase  bit for bit with the CPU's KvCache::erase (engine/cpu/kv_cache_erase.cpp), rope styles,
//             partial rotation and frequency factors included, rows moved in parallel waves or in order.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/cpu/kv_cache.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/rope_shift.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/dependent_launch.h"
#include "tests/kernel_test_data.h"
#include "tests/quick_mode.h"

namespace tern {
namespace {

constexpr KvType kFormats[] = {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3};
// The formats that take any head dim that is a multiple of 4 (the block formats need multiples of 32).
constexpr KvType kFloatFormats[] = {KvType::f32, KvType::f16, KvType::bf16};

bool is_float_format(KvType t) {
    return !kv_format_info(t).quantized;
}

// Device memory freed on scope exit.
struct DeviceBuffer {
    void* p = nullptr;
    explicit DeviceBuffer(size_t bytes) { REQUIRE(cudaMalloc(&p, bytes) == cudaSuccess); }
    DeviceBuffer(DeviceBuffer&& o) noexcept : p(o.p) { o.p = nullptr; }
    ~DeviceBuffer() {
        if (p) cudaFree(p);
    }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    template <typename T> T* as() const { return static_cast<T*>(p); }
};

template <typename T> DeviceBuffer upload(const std::vector<T>& v) {
    DeviceBuffer b(std::max<size_t>(1, v.size() * sizeof(T)));
    REQUIRE(cudaMemcpy(b.p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    return b;
}

template <typename T> std::vector<T> download(const void* p, size_t count) {
    std::vector<T> v(count);
    REQUIRE(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
    return v;
}

// One layer's cache on the device, every byte first set to `fill` so untouched rows can be recognised.
struct DeviceCache {
    cuda::KvLayer layer;
    size_t k_bytes, v_bytes;
    DeviceBuffer k, v;
    DeviceCache(KvType type, int32_t n_kv_heads, int32_t head_dim, int32_t head_dim_v, int32_t n_ctx, int fill = 0xA5)
        : k_bytes(kv_row_bytes(type, head_dim) * static_cast<size_t>(n_kv_heads) * static_cast<size_t>(n_ctx)),
          v_bytes(kv_row_bytes(type, head_dim_v) * static_cast<size_t>(n_kv_heads) * static_cast<size_t>(n_ctx)),
          k(k_bytes), v(v_bytes) {
        layer.type = type;
        layer.k = k.p;
        layer.v = v.p;
        layer.n_kv_heads = n_kv_heads;
        layer.head_dim = head_dim;
        layer.head_dim_v = head_dim_v;
        layer.n_ctx = n_ctx;
        REQUIRE(cudaMemset(k.p, fill, k_bytes) == cudaSuccess);
        REQUIRE(cudaMemset(v.p, fill, v_bytes) == cudaSuccess);
    }
    std::vector<uint8_t> k_host() const { return download<uint8_t>(k.p, k_bytes); }
    std::vector<uint8_t> v_host() const { return download<uint8_t>(v.p, v_bytes); }
};

// The cache image the CPU's kv_store_row gives for rows (n, n_kv_heads, dim) at positions pos0.., laid out
// (head, n_ctx, row_bytes) over `image`.
void store_rows_cpu(KvType type, const std::vector<float>& x, int64_t n, int32_t n_kv_heads, int32_t dim, int32_t n_ctx,
                    int32_t pos0, std::vector<uint8_t>& image) {
    const size_t rb = kv_row_bytes(type, dim);
    for (int64_t i = 0; i < n; ++i)
        for (int32_t h = 0; h < n_kv_heads; ++h)
            kv_store_row(type, x.data() + (i * n_kv_heads + h) * dim,
                         image.data() + (static_cast<size_t>(h) * n_ctx + pos0 + i) * rb, dim);
}

// Values that probe the encoders' rounding: ties, zero, tiny and huge blocks, specials. Segment s (32
// elements) of the data gets kind s % 8.
void add_edge_values(std::vector<float>& x, KvType type, uint32_t seed) {
    std::mt19937 rng(seed);
    const size_t segments = x.size() / 32;
    for (size_t s = 0; s < segments; ++s) {
        float* seg = x.data() + s * 32;
        switch (s % 8) {
        case 0:
            break; // plain gaussian
        case 1:
            std::fill(seg, seg + 32, 0.0f);
            break;
        case 2: // amax 127: q8_0's d is exactly 1, so j + 0.5 are ties (roundf: away from zero)
            for (int j = 0; j < 32; ++j)
                seg[j] = static_cast<float>(static_cast<int>(rng() % 254) - 127) + 0.5f;
            seg[5] = 127.0f;
            break;
        case 3: // exactly halfway between neighbouring f16 values (even j) or bf16 values (odd j): ties
            for (int j = 0; j < 32; ++j) {
                const float tie = j % 2 ? 1.0f + static_cast<float>(rng() % 128) / 128.0f + 1.0f / 256.0f
                                        : 1.0f + static_cast<float>(rng() % 1024) / 1024.0f + 1.0f / 2048.0f;
                seg[j] = (j % 4 < 2 ? -1.0f : 1.0f) * tie * std::ldexp(1.0f, static_cast<int>(rng() % 8) - 4);
            }
            seg[7] = 448.0f + 8.0f; // e4m3: between 448 and the next binade's first step
            break;
        case 4: // tiny: the f16 scale underflows to zero or to a subnormal
            for (int j = 0; j < 32; ++j)
                seg[j] = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-12f;
            break;
        case 5: // large: f8's amax / 448 past f16's range for some, q8_0's fine
            for (int j = 0; j < 32; ++j)
                seg[j] = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 4e4f;
            break;
        case 6: // f16 subnormals and values that overflow f16
            for (int j = 0; j < 32; ++j)
                seg[j] = (j % 3 == 0 ? 7e4f : 3e-6f) * (j % 2 ? -1.0f : 1.0f);
            break;
        case 7: // float specials where the CPU's conversions define them (not q8_0: its NaN cast is UB)
            if (type == KvType::q8_0) break;
            seg[0] = std::numeric_limits<float>::infinity();
            seg[1] = -std::numeric_limits<float>::infinity();
            seg[2] = std::numeric_limits<float>::quiet_NaN();
            seg[3] = -0.0f;
            seg[4] = 1e-45f;
            break;
        }
    }
}

TEST_CASE("kv_write stores rows bit for bit as kv_store_row, and only those rows") {
    struct Dims {
        int32_t head_dim, head_dim_v;
    };
    // Multiples of 32 for every format; for the float formats also the element-wise path's head dims:
    // small ones (8 and 16 as small models have), ones past 32, mixed with multiples of 32, and a K/V
    // token wider than one block of the launch (3 heads * (256 + 4) elements).
    const std::vector<Dims> block_dims = {{32, 32}, {96, 64}, {128, 128}, {256, 160}};
    const std::vector<Dims> float_dims = {{8, 8},   {16, 16}, {16, 8}, {8, 16}, {24, 24}, {40, 40},
                                          {40, 24}, {4, 12},  {12, 4}, {64, 8}, {8, 96},  {256, 4}};
    for (KvType type : kFormats) {
        std::vector<Dims> dims = block_dims;
        if (is_float_format(type)) dims.insert(dims.end(), float_dims.begin(), float_dims.end());
        for (Dims d : dims) {
            CAPTURE(kv_type_name(type));
            CAPTURE(d.head_dim);
            CAPTURE(d.head_dim_v);
            const int32_t n_kv_heads = 3, n_ctx = 11, pos0 = 4;
            const int64_t n = 6;
            std::vector<float> k = test::random_normal(static_cast<size_t>(n * n_kv_heads * d.head_dim), 11, 2.0f);
            std::vector<float> v = test::random_normal(static_cast<size_t>(n * n_kv_heads * d.head_dim_v), 12, 2.0f);
            add_edge_values(k, type, 13);
            add_edge_values(v, type, 14);
            DeviceCache cache(type, n_kv_heads, d.head_dim, d.head_dim_v, n_ctx);
            std::vector<uint8_t> want_k = cache.k_host(), want_v = cache.v_host();
            store_rows_cpu(type, k, n, n_kv_heads, d.head_dim, n_ctx, pos0, want_k);
            store_rows_cpu(type, v, n, n_kv_heads, d.head_dim_v, n_ctx, pos0, want_v);

            DeviceBuffer dk = upload(k), dv = upload(v);
            cuda::kv_write(cache.layer, dk.as<float>(), dv.as<float>(), n, pos0, nullptr);
            REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
            const std::vector<uint8_t> got_k = cache.k_host(), got_v = cache.v_host();
            size_t k_diff = 0, v_diff = 0;
            for (size_t i = 0; i < got_k.size(); ++i)
                k_diff += got_k[i] != want_k[i];
            for (size_t i = 0; i < got_v.size(); ++i)
                v_diff += got_v[i] != want_v[i];
            CHECK(k_diff == 0);
            CHECK(v_diff == 0);
        }
    }
}

TEST_CASE("kv_write f8_e4m3 and q8_0: many blocks of varied data encode as the CPU's") {
    // Gaussian blocks and blocks on coarse grids (small integers times a power of two, where candidate
    // scales often quantize some elements exactly), at magnitudes from 2^-20 to 2^19: 20480 blocks per
    // format. The f8 encoder's error sums use the CPU's operations in the CPU's order; a different order
    // or a contracted multiply-add would only matter where two candidates' errors lie within an ulp,
    // which 2 million such blocks never showed, so that part is exact by construction, not by this test.
    const int32_t n_kv_heads = 4, dim = 256, n_ctx = 160;
    const int64_t n = 160;
    for (KvType type : {KvType::f8_e4m3, KvType::q8_0}) {
        CAPTURE(kv_type_name(type));
        std::vector<float> k = test::random_normal(static_cast<size_t>(n * n_kv_heads * dim), 21, 1.0f);
        std::vector<float> v = test::random_normal(static_cast<size_t>(n * n_kv_heads * dim), 22, 1.0f);
        std::mt19937 rng(23);
        for (std::vector<float>* x : {&k, &v}) {
            for (size_t s = 0; s < x->size() / 32; ++s) {
                float* seg = x->data() + s * 32;
                const float m = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
                const int grid = static_cast<int>(rng() % 4); // 0: gaussian, else integers up to 2^(2 grid)
                for (int j = 0; j < 32; ++j) {
                    const float g =
                        grid == 0
                            ? seg[j]
                            : static_cast<float>(static_cast<int>(rng() % (2u << (2 * grid))) - (1 << (2 * grid)));
                    seg[j] = g * m;
                }
            }
        }
        DeviceCache cache(type, n_kv_heads, dim, dim, n_ctx);
        std::vector<uint8_t> want_k = cache.k_host(), want_v = cache.v_host();
        store_rows_cpu(type, k, n, n_kv_heads, dim, n_ctx, 0, want_k);
        store_rows_cpu(type, v, n, n_kv_heads, dim, n_ctx, 0, want_v);
        DeviceBuffer dk = upload(k), dv = upload(v);
        cuda::kv_write(cache.layer, dk.as<float>(), dv.as<float>(), n, 0, nullptr);
        CHECK(cache.k_host() == want_k);
        CHECK(cache.v_host() == want_v);
    }
}

// ---- attention ------------------------------------------------------------------------------------------

struct AttnCase {
    KvType type;
    int32_t head_dim, head_dim_v, n_kv_heads, group;
    int32_t n_ctx, pos0, n, window;
    float softcap;
    bool sinks = false;   // gpt-oss's attention sinks: a logit per query head in each softmax's denominator
};

std::string describe(const AttnCase& c) {
    return std::string(kv_type_name(c.type)) + " D=" + std::to_string(c.head_dim) + "/" + std::to_string(c.head_dim_v) +
           " kv_heads=" + std::to_string(c.n_kv_heads) + " group=" + std::to_string(c.group) +
           " n_ctx=" + std::to_string(c.n_ctx) + " pos0=" + std::to_string(c.pos0) + " n=" + std::to_string(c.n) +
           " window=" + std::to_string(c.window) + " softcap=" + std::to_string(c.softcap) + (c.sinks ? " sinks" : "");
}

// Sinks for n_heads query heads: around the peaked scores' maxima (a few units), some far above them (the output
// then near zero: the rescaling to the larger maximum matters) and some far below (no effect).
std::vector<float> sink_logits(int32_t n_heads, uint32_t seed) {
    std::vector<float> s = test::random_normal(static_cast<size_t>(n_heads), seed, 2.0f);
    for (size_t h = 0; h < s.size(); ++h) {
        s[h] += 4.0f;
        if (h % 5 == 3) s[h] = 60.0f;
        if (h % 7 == 6) s[h] = -60.0f;
    }
    return s;
}

// The double-precision softmax of scores w (in place: the weights) with an optional sink joining the sum.
void softmax_with_sink(std::vector<double>& w, const float* sink) {
    double mx = -INFINITY;
    for (double x : w) mx = std::max(mx, x);
    if (sink) mx = std::max(mx, static_cast<double>(*sink));
    double sum = sink ? std::exp(static_cast<double>(*sink) - mx) : 0.0;
    for (double& x : w) sum += (x = std::exp(x - mx));
    for (double& x : w) x /= sum;
}

// Tolerance of the normalised error max |gpu - ref| / max |ref|. Both sides sum up to 256-term f32 dot
// products, exponentials and weighted V rows in different orders: a score (here up to about +-20) is off
// by a few f32 ulps of the terms' magnitudes, ~1e-6, which moves each softmax weight by that relative
// amount; the device's exp2f / tanhf add a couple of ulps more. The emulator measures at most 2.2e-6 over
// all cases here; 2e-5 leaves room for the device's approximations, while one key masked wrongly, a
// window off by one or a dropped split moves outputs by a fraction of a weight (>= 1e-3 with these
// peaked softmaxes).
constexpr double kAttnTolerance = 2e-5;

struct AttnResult {
    double err_ref = 0.0, err_cpu = 0.0;
    cuda::AttentionPlan plan;
};

// Writes positions [0, pos0) and then [pos0, pos0 + n) with kv_write, runs attention for the n new tokens
// and compares it with a double-precision reference computed from the kv_load_row'd cache, and with the
// CPU's attend_tokens on the CPU-encoded cache (the kv_write bytes are checked equal to it first).
AttnResult run_attention_case(const AttnCase& c, uint32_t seed) {
    const int32_t n_heads = c.n_kv_heads * c.group, D = c.head_dim, Dv = c.head_dim_v;
    const int32_t total = c.pos0 + c.n;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    // Gaussian q and k with a spread that makes the softmax peaked (scores with a std of about 2.5), so
    // every key's weight matters; V gaussian.
    const std::vector<float> k = test::random_normal(static_cast<size_t>(total) * c.n_kv_heads * D, seed, 1.6f);
    const std::vector<float> v = test::random_normal(static_cast<size_t>(total) * c.n_kv_heads * Dv, seed + 1, 1.0f);
    const std::vector<float> q = test::random_normal(static_cast<size_t>(c.n) * n_heads * D, seed + 2, 1.6f);
    const std::vector<float> sinks = c.sinks ? sink_logits(n_heads, seed + 3) : std::vector<float>{};

    DeviceCache cache(c.type, c.n_kv_heads, D, Dv, c.n_ctx);
    DeviceBuffer dk = upload(k), dv = upload(v), dq = upload(q), dsinks = upload(sinks);
    DeviceBuffer datt(sizeof(float) * static_cast<size_t>(c.n) * n_heads * Dv);
    if (c.pos0 > 0) cuda::kv_write(cache.layer, dk.as<float>(), dv.as<float>(), c.pos0, 0, nullptr);
    cuda::kv_write(cache.layer, dk.as<float>() + static_cast<size_t>(c.pos0) * c.n_kv_heads * D,
                   dv.as<float>() + static_cast<size_t>(c.pos0) * c.n_kv_heads * Dv, c.n, c.pos0, nullptr);
    AttnResult res;
    res.plan = cuda::attention_plan(cache.layer, c.n, n_heads, c.pos0, c.window);
    cuda::attention(cache.layer, dq.as<float>(), c.n, n_heads, c.pos0, c.window, scale, c.softcap, datt.as<float>(),
                    nullptr, nullptr, c.sinks ? dsinks.as<float>() : nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<float> att = download<float>(datt.p, static_cast<size_t>(c.n) * n_heads * Dv);

    // The CPU's encoding of the same rows (equal to the device's, checked) and its decoded values.
    std::vector<uint8_t> k_img = cache.k_host(), v_img = cache.v_host();
    {
        std::vector<uint8_t> want_k(k_img.size(), 0xA5), want_v(v_img.size(), 0xA5);
        store_rows_cpu(c.type, k, total, c.n_kv_heads, D, c.n_ctx, 0, want_k);
        store_rows_cpu(c.type, v, total, c.n_kv_heads, Dv, c.n_ctx, 0, want_v);
        REQUIRE(k_img == want_k);
        REQUIRE(v_img == want_v);
    }
    const size_t k_rb = kv_row_bytes(c.type, D), v_rb = kv_row_bytes(c.type, Dv);
    std::vector<float> kd(static_cast<size_t>(c.n_kv_heads) * total * D),
        vd(static_cast<size_t>(c.n_kv_heads) * total * Dv);
    for (int32_t g = 0; g < c.n_kv_heads; ++g)
        for (int32_t p = 0; p < total; ++p) {
            kv_load_row(c.type, k_img.data() + (static_cast<size_t>(g) * c.n_ctx + p) * k_rb,
                        kd.data() + (static_cast<size_t>(g) * total + p) * D, D);
            kv_load_row(c.type, v_img.data() + (static_cast<size_t>(g) * c.n_ctx + p) * v_rb,
                        vd.data() + (static_cast<size_t>(g) * total + p) * Dv, Dv);
        }

    // Double-precision reference.
    std::vector<double> ref(att.size());
    std::vector<double> w;
    for (int32_t i = 0; i < c.n; ++i) {
        const int32_t pos = c.pos0 + i, lo = c.window > 0 ? std::max(0, pos - c.window + 1) : 0;
        for (int32_t h = 0; h < n_heads; ++h) {
            const int32_t g = h / c.group;
            const float* qh = q.data() + (static_cast<size_t>(i) * n_heads + h) * D;
            w.assign(static_cast<size_t>(pos - lo + 1), 0.0);
            for (int32_t p = lo; p <= pos; ++p) {
                const float* kr = kd.data() + (static_cast<size_t>(g) * total + p) * D;
                double s = 0.0;
                for (int32_t d = 0; d < D; ++d)
                    s += static_cast<double>(qh[d]) * kr[d];
                s *= scale;
                if (c.softcap > 0.0f) s = c.softcap * std::tanh(s / c.softcap);
                w[static_cast<size_t>(p - lo)] = s;
            }
            softmax_with_sink(w, c.sinks ? &sinks[static_cast<size_t>(h)] : nullptr);
            double* out = ref.data() + (static_cast<size_t>(i) * n_heads + h) * Dv;
            for (int32_t d = 0; d < Dv; ++d)
                out[d] = 0.0;
            for (int32_t p = lo; p <= pos; ++p) {
                const float* vr = vd.data() + (static_cast<size_t>(g) * total + p) * Dv;
                const double wp = w[static_cast<size_t>(p - lo)];
                for (int32_t d = 0; d < Dv; ++d)
                    out[d] += wp * vr[d];
            }
        }
    }

    // The CPU's flash attention over the same cache.
    AttnParams ap;
    ap.format = c.type;
    ap.head_dim = D;
    ap.head_dim_v = Dv;
    ap.group = c.group;
    ap.scale = scale;
    ap.softcap = c.softcap;
    ap.sinks = c.sinks ? sinks.data() : nullptr;
    std::vector<const void*> k_heads(static_cast<size_t>(c.n_kv_heads)), v_heads(static_cast<size_t>(c.n_kv_heads));
    for (int32_t g = 0; g < c.n_kv_heads; ++g) {
        k_heads[static_cast<size_t>(g)] = k_img.data() + static_cast<size_t>(g) * c.n_ctx * k_rb;
        v_heads[static_cast<size_t>(g)] = v_img.data() + static_cast<size_t>(g) * c.n_ctx * v_rb;
    }
    std::vector<float> cpu(att.size());
    attend_tokens(ap, attn_chunk_kernel(ap), c.n_kv_heads, k_heads.data(), v_heads.data(), c.pos0, c.n, c.window,
                  q.data(), static_cast<int64_t>(n_heads) * D, cpu.data(), static_cast<int64_t>(n_heads) * Dv, 1);

    double ref_max = 0.0, cpu_max = 0.0, d_ref = 0.0, d_cpu = 0.0;
    for (size_t i = 0; i < att.size(); ++i) {
        REQUIRE(std::isfinite(att[i]));
        ref_max = std::max(ref_max, std::fabs(ref[i]));
        cpu_max = std::max(cpu_max, static_cast<double>(std::fabs(cpu[i])));
        d_ref = std::max(d_ref, std::fabs(att[i] - ref[i]));
        d_cpu = std::max(d_cpu, static_cast<double>(std::fabs(att[i] - cpu[i])));
    }
    res.err_ref = d_ref / ref_max;
    res.err_cpu = d_cpu / cpu_max;
    return res;
}

// Runs every case against both references and checks which of the kernel's paths they reached.
struct Coverage {
    bool split = false, single = false, many_tokens = false;
    int32_t max_splits = 0;
};

Coverage check_attention_cases(const std::vector<AttnCase>& cases, uint32_t seed) {
    Coverage cov;
    for (const AttnCase& c : cases) {
        CAPTURE(describe(c));
        const AttnResult r = run_attention_case(c, seed += 7);
        CAPTURE(r.plan.splits);
        CAPTURE(r.plan.tokens_per_block);
        CHECK(r.err_ref < kAttnTolerance);
        CHECK(r.err_cpu < kAttnTolerance);
        cov.split |= r.plan.splits > 1;
        cov.single |= r.plan.splits == 1;
        cov.many_tokens |= r.plan.tokens_per_block > 1 && r.plan.query_tiles > 1;
        cov.max_splits = std::max(cov.max_splits, r.plan.splits);
    }
    return cov;
}

TEST_CASE("attention matches a double-precision reference and the CPU's attend_tokens") {
    std::vector<AttnCase> cases;
    for (KvType t : kFormats) {
        cases.push_back({t, 128, 128, 2, 4, 512, 300, 1, 0, 0.0f});  // decode, 301 keys (ragged)
        cases.push_back({t, 128, 128, 2, 4, 512, 200, 5, 0, 0.0f});  // draft verification
        cases.push_back({t, 128, 128, 2, 4, 512, 0, 77, 0, 0.0f});   // prefill from empty
        cases.push_back({t, 64, 64, 3, 2, 160, 123, 37, 100, 0.0f}); // chunked prefill, window < n_past
        cases.push_back({t, 256, 256, 1, 8, 96, 93, 3, 0, 30.0f});   // ends at n_ctx, softcap, group 8
    }
    // Head dims, groups, windows and formats mixed (one format each, rotating).
    const AttnCase more[] = {
        {KvType::f16, 32, 32, 4, 1, 100, 57, 1, 0, 0.0f},       {KvType::bf16, 96, 96, 2, 3, 300, 250, 1, 64, 0.0f},
        {KvType::q8_0, 96, 96, 1, 7, 300, 0, 41, 0, 0.0f},      {KvType::f8_e4m3, 192, 128, 2, 3, 200, 150, 9, 0, 0.0f},
        {KvType::f32, 64, 256, 2, 4, 128, 100, 28, 0, 0.0f},    // ends at n_ctx
        {KvType::f16, 128, 128, 1, 5, 400, 333, 1, 1, 0.0f},    // window 1: only itself
        {KvType::q8_0, 128, 128, 2, 2, 400, 350, 2, 16, 0.0f},  // window far below n_past
        {KvType::bf16, 64, 64, 2, 6, 200, 20, 100, 1000, 0.0f}, // window above every position
        {KvType::f8_e4m3, 32, 64, 8, 1, 64, 0, 64, 0, 50.0f},   // whole cache in one prefill
        {KvType::f32, 256, 256, 2, 8, 64, 0, 40, 7, 0.0f},      // group 8 at 256: 2 tokens a block
        {KvType::f16, 160, 96, 1, 8, 130, 31, 99, 33, 0.0f},
    };
    cases.insert(cases.end(), std::begin(more), std::end(more));

#if defined(TERN_CUDA_EMULATOR)
    const size_t device_bytes = cuda_emu::device_bytes_in_use();
#endif
    const Coverage cov = check_attention_cases(cases, 100);
#if defined(TERN_CUDA_EMULATOR)
    CHECK(cuda_emu::device_bytes_in_use() == device_bytes); // every case freed its buffers; attention took none
#endif
    // The cases cover both the split-KV merge and the single-pass path, and multi-token tiles.
    CHECK(cov.split);
    CHECK(cov.single);
    CHECK(cov.many_tokens);
}

// The emulated GPU's multiprocessors (the plan sizes its splits by them) for one scope: the emulator has as
// many as it has worker threads.
struct EmulatedMultiprocessors {
    explicit EmulatedMultiprocessors([[maybe_unused]] int n) {
#if defined(TERN_CUDA_EMULATOR)
        cuda_emu::set_worker_threads(n);
#endif
    }
    ~EmulatedMultiprocessors() {
#if defined(TERN_CUDA_EMULATOR)
        cuda_emu::set_worker_threads(0);
#endif
    }
    EmulatedMultiprocessors(const EmulatedMultiprocessors&) = delete;
    EmulatedMultiprocessors& operator=(const EmulatedMultiprocessors&) = delete;
};

TEST_CASE("attention: many KV splits merged by the last block, the arrival counters reset for the next launch") {
    // One KV head and one query tile: a single item, so the plan splits its 1032 keys as far as the
    // (emulated) multiprocessors ask, 8 blocks or more; blocks run on the emulator's OS threads at once,
    // so the merge's atomics and fences are exercised across threads.
    const EmulatedMultiprocessors sms(4);
    for (KvType t : {KvType::f16, KvType::q8_0}) {
        const AttnCase c{t, 128, 64, 1, 4, 1100, 1030, 2, 0, 0.0f};
        CAPTURE(describe(c));
        const AttnResult a = run_attention_case(c, 900);
        CHECK(a.plan.splits >= 8);
        CHECK(a.err_ref < kAttnTolerance);
        CHECK(a.err_cpu < kAttnTolerance);
        const AttnResult b = run_attention_case(c, 900); // same data: same result, counters were reset
        CHECK(b.err_ref == a.err_ref);
    }
}

// The output of attention for case c (the data of run_attention_case with the same seed) with the cache paged
// or not and, as a replayed graph runs it, pos0 read from device memory while the host's pos0 is plan_pos0,
// a position with the same attention_plan (checked).
struct AttnRun {
    bool paged = false;
    int32_t plan_pos0 = -1; // -1: pos0 passed on the host
    bool programmatic = false; // launched as programmatic dependents (kernels/cuda/dependent_launch.h)
};
std::vector<float> attention_output(const AttnCase& c, uint32_t seed, const AttnRun& run) {
    const int32_t n_heads = c.n_kv_heads * c.group, D = c.head_dim, Dv = c.head_dim_v;
    const int32_t total = c.pos0 + c.n;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::vector<float> k = test::random_normal(static_cast<size_t>(total) * c.n_kv_heads * D, seed, 1.6f);
    const std::vector<float> v = test::random_normal(static_cast<size_t>(total) * c.n_kv_heads * Dv, seed + 1, 1.0f);
    const std::vector<float> q = test::random_normal(static_cast<size_t>(c.n) * n_heads * D, seed + 2, 1.6f);

    // Paged: a pool of two more slots than the sequence needs, its pages in a shuffled order.
    const int32_t pages = (c.n_ctx + kKvPagePositions - 1) / kKvPagePositions;
    std::vector<int32_t> table(static_cast<size_t>(pages + 2));
    for (size_t i = 0; i < table.size(); ++i)
        table[i] = static_cast<int32_t>(i);
    std::shuffle(table.begin(), table.end(), std::mt19937(seed));
    table.resize(static_cast<size_t>(pages));
    DeviceBuffer dtable = upload(table);
    DeviceCache cache(c.type, c.n_kv_heads, D, Dv, run.paged ? (pages + 2) * kKvPagePositions : c.n_ctx);
    if (run.paged) {
        cache.layer.pages = dtable.as<int32_t>();
        cache.layer.n_ctx = c.n_ctx;
    }
    DeviceBuffer dk = upload(k), dv = upload(v), dq = upload(q), dpos = upload(std::vector<int32_t>{c.pos0});
    DeviceBuffer datt(sizeof(float) * static_cast<size_t>(c.n) * n_heads * Dv);
    if (c.pos0 > 0) cuda::kv_write(cache.layer, dk.as<float>(), dv.as<float>(), c.pos0, 0, nullptr);
    cuda::kv_write(cache.layer, dk.as<float>() + static_cast<size_t>(c.pos0) * c.n_kv_heads * D,
                   dv.as<float>() + static_cast<size_t>(c.pos0) * c.n_kv_heads * Dv, c.n, c.pos0, nullptr);
    int32_t host_pos0 = c.pos0;
    const int32_t* pos0_device = nullptr;
    if (run.plan_pos0 >= 0) {
        const cuda::AttentionPlan at = cuda::attention_plan(cache.layer, c.n, n_heads, c.pos0, c.window);
        const cuda::AttentionPlan planned = cuda::attention_plan(cache.layer, c.n, n_heads, run.plan_pos0, c.window);
        REQUIRE(planned.splits == at.splits);
        REQUIRE(planned.tokens_per_block == at.tokens_per_block);
        REQUIRE(planned.query_tiles == at.query_tiles);
        host_pos0 = run.plan_pos0;
        pos0_device = dpos.as<int32_t>();
    }
#if defined(TERN_CUDA_EMULATOR)   // the emulator counts launches, and which of them are programmatic
    const size_t launches = cuda_emu::kernel_launches(), dependents = cuda_emu::programmatic_launches();
#endif
    {
        const cuda::ProgrammaticLaunches scope(run.programmatic);
        cuda::attention(cache.layer, dq.as<float>(), c.n, n_heads, host_pos0, c.window, scale, c.softcap,
                        datt.as<float>(), nullptr, pos0_device);
    }
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
#if defined(TERN_CUDA_EMULATOR)
    CHECK(cuda_emu::kernel_launches() - launches == 1);
    CHECK(cuda_emu::programmatic_launches() - dependents == (run.programmatic ? 1u : 0u));
#endif
    return download<float>(datt.p, static_cast<size_t>(c.n) * n_heads * Dv);
}

TEST_CASE("attention: decode and drafts at long depths, many splits, paged and replayed as a graph") {
    // Decode (n = 1) and draft verification (n = 8) at 5000 positions and more, on a GPU of 16 emulated
    // multiprocessors: the plan splits each item's keys over many blocks (tens, the merge taking its states
    // in several batches with a ragged last one). Every format, GQA groups 1, 4 and 8, head dims 64, 128
    // and 256. Each case is checked against both references, then run again on a paged cache (a shuffled
    // page table) with pos0 read from device memory and an earlier position on the host with the same
    // plan, as a captured decode step replays it: the same bits.
    const EmulatedMultiprocessors sms(16);
    struct Shape {
        int32_t head_dim, n_kv_heads, group, n, pos0, window;
    };
    const Shape shapes[] = {
        {128, 2, 4, 1, 5000, 0}, // llama-8b's decode: 4 rows a block, the streaming kernel
        {64, 1, 1, 8, 4999, 0},  // drafts, group 1: 8 rows a block
        {256, 1, 8, 1, 5003, 0}, // group 8 at 256: 2048 row elements, the most the decode kernel takes
        {128, 1, 8, 8, 5001, 0}, // drafts, group 8: 4 tokens (32 rows) a block, the general kernel
        {128, 1, 4, 1, 5000, 4096}, // a sliding window: the split keys start at 905
    };
    // TERN_TEST_QUICK=1 (tests/quick_mode.h): each shape in one format, each format once (5 cases of the 25): the
    // kernels and split plans are the shapes'; each format's reads over many splits run in the sweeps below.
    static_assert(std::size(shapes) == std::size(kFormats));
    int32_t max_splits = 0;
    uint32_t seed = 20000;
    for (size_t f = 0; f < std::size(kFormats); ++f) {
        const KvType t = kFormats[f];
        for (size_t s = 0; s < std::size(shapes); ++s) {
            const Shape& sh = shapes[s];
            seed += 11;
            if (test::quick_mode() && s != f) continue;
            const AttnCase c{t, sh.head_dim, sh.head_dim, sh.n_kv_heads, sh.group, sh.pos0 + sh.n + 7, sh.pos0, sh.n,
                             sh.window, 0.0f};
            CAPTURE(describe(c));
            const AttnResult r = run_attention_case(c, seed);
            CAPTURE(r.plan.splits);
            CHECK(r.err_ref < kAttnTolerance);
            CHECK(r.err_cpu < kAttnTolerance);
            max_splits = std::max(max_splits, r.plan.splits);
            const std::vector<float> plain = attention_output(c, seed, {});
            const std::vector<float> replayed = attention_output(c, seed, {true, c.pos0 - 40});
            CHECK(std::memcmp(plain.data(), replayed.data(), plain.size() * sizeof(float)) == 0);
        }
    }
    CHECK(max_splits >= 24);
}

TEST_CASE("attention: launched as programmatic dependents, the same bits as plain launches") {
    // Every variant waits for the kernels before it first thing: pos0 from device memory, the cache, the split
    // states and arrival counters (the emulator faults a thread that takes an atomic or exits before its wait).
    // Decode split and merged and in one pass, head dims 64 and 128, groups 1, 4 and 8, paged and replayed; the
    // drafts' general kernel; prefill; the previous decode kernel.
    const EmulatedMultiprocessors sms(8);
    const AttnCase cases[] = {
        {KvType::f16, 128, 128, 2, 4, 1200, 1100, 1, 0, 0.0f},    // the streaming kernel, split
        {KvType::q8_0, 64, 64, 1, 8, 1200, 1000, 1, 0, 0.0f},     // split, group 8
        {KvType::f32, 64, 64, 2, 1, 40, 30, 1, 0, 0.0f},          // one pass
        {KvType::bf16, 128, 128, 1, 4, 100, 20, 1, 0, 30.0f},     // one pass, softcap
        {KvType::f16, 128, 128, 1, 8, 700, 600, 8, 0, 0.0f},      // drafts: the general kernel
        {KvType::f8_e4m3, 64, 64, 2, 4, 80, 0, 60, 0, 0.0f},      // prefill
    };
    struct Restore {
        ~Restore() { cuda::set_old_decode_attention(false); }
    } restore;
    bool split = false, single = false;
    uint32_t seed = 9100;
    for (bool old : {false, true}) {
        cuda::set_old_decode_attention(old);
        for (const AttnCase& c : cases) {
            CAPTURE(old);
            CAPTURE(describe(c));
            seed += 7;
            const DeviceCache cache(c.type, c.n_kv_heads, c.head_dim, c.head_dim_v, c.n_ctx);
            const int32_t splits =
                cuda::attention_plan(cache.layer, c.n, c.n_kv_heads * c.group, c.pos0, c.window).splits;
            (splits > 1 ? split : single) = true;
            const std::vector<float> plain = attention_output(c, seed, {});
            const std::vector<float> dependent = attention_output(c, seed, {false, -1, true});
            CHECK(std::memcmp(plain.data(), dependent.data(), plain.size() * sizeof(float)) == 0);
            if (c.n == 1) {
                const std::vector<float> replayed = attention_output(c, seed, {true, c.pos0 - 3, true});
                CHECK(std::memcmp(plain.data(), replayed.data(), plain.size() * sizeof(float)) == 0);
            }
        }
    }
    CHECK(split);
    CHECK(single);
}

TEST_CASE("attention: the previous decode kernel and split rule (set_old_decode_attention) still match") {
    // TERN_CUDA_ATTN=old keeps the previous decode path selectable for timing: decode and drafts, split and
    // not, paged and replayed, against both references.
    cuda::set_old_decode_attention(true);
    struct Restore {
        ~Restore() { cuda::set_old_decode_attention(false); }
    } restore;
    const EmulatedMultiprocessors sms(8);
    std::vector<AttnCase> cases;
    for (KvType t : kFormats) {
        cases.push_back({t, 128, 128, 2, 4, 1200, 1100, 1, 0, 0.0f});
        cases.push_back({t, 64, 64, 1, 1, 400, 300, 8, 0, 0.0f});
        cases.push_back({t, 256, 256, 1, 8, 100, 40, 1, 0, 30.0f});
    }
    const Coverage cov = check_attention_cases(cases, 400);
    CHECK(cov.split);
    CHECK(cov.max_splits >= 16);
    const AttnCase c = cases[1];
    CHECK(attention_output(c, 401, {}) == attention_output(c, 401, {true, c.pos0 - 10}));
}

TEST_CASE("attention: a sweep of shapes, groups, positions, windows and split counts") {
    // Deterministic random cases: every format, head dims 32..256 (K and V dims apart in a third), groups
    // 1..8 (capped where the block's row budget is smaller), 1..150 tokens at ragged positions, caches
    // that end right after the last token, windows from 1 to beyond every position, softcap in a quarter.
    const EmulatedMultiprocessors sms(4); // 12 resident blocks: the split count is bound by the keys
    std::mt19937 rng(77);
    const int32_t dims[] = {32, 64, 96, 128, 160, 256};
    const int32_t ns[] = {1, 1, 1, 2, 3, 4, 7, 8, 9, 16, 33, 70, 150};
    const int32_t windows[] = {0, 0, 0, 1, 2, 31, 32, 33, 64, 100, 1000};
    int splits_seen = 0;
    for (int i = 0; i < 80; ++i) {
        AttnCase c{};
        c.type = kFormats[i % 5];
        c.head_dim = dims[rng() % 6];
        c.head_dim_v = rng() % 3 == 0 ? dims[rng() % 6] : c.head_dim;
        c.n_kv_heads = 1 + static_cast<int32_t>(rng() % 3);
        c.group = std::min<int32_t>(1 + static_cast<int32_t>(rng() % 8), 4096 / std::max(c.head_dim, c.head_dim_v));
        c.n = ns[rng() % std::size(ns)];
        c.pos0 = static_cast<int32_t>(rng() % 400);
        c.n_ctx = c.pos0 + c.n + (rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % 50));
        c.window = windows[rng() % std::size(windows)];
        c.softcap = rng() % 4 == 0 ? 20.0f : 0.0f;
        CAPTURE(describe(c));
        const AttnResult r = run_attention_case(c, 5000 + static_cast<uint32_t>(i));
        CAPTURE(r.plan.splits);
        CAPTURE(r.plan.tokens_per_block);
        CHECK(r.err_ref < kAttnTolerance);
        CHECK(r.err_cpu < kAttnTolerance);
        splits_seen = std::max(splits_seen, r.plan.splits);
    }
    CHECK(splits_seen >= 3); // the most below 450 positions (4 key tiles a split); the long-depth case has more
}

TEST_CASE("attention with sinks: decode split and merged, drafts, prefill, windows and softcap") {
    // The sink joins the denominator where the final (m, l) is formed: after a single pass and after the merge
    // of split states, so both are covered (the coverage checks below), with sinks above every score, around the
    // largest ones and far below them, against the references with the same sinks. 16 emulated multiprocessors
    // and 66 key tiles give the last case 16 splits (4 tiles a split at least).
    const EmulatedMultiprocessors sms(16);
    std::vector<AttnCase> cases = {
        {KvType::f16, 128, 128, 2, 4, 512, 300, 1, 0, 0.0f, true},     // decode, split
        {KvType::q8_0, 64, 64, 2, 4, 512, 200, 5, 0, 0.0f, true},      // draft verification
        {KvType::f32, 64, 64, 2, 2, 128, 0, 77, 0, 0.0f, true},        // prefill from empty
        {KvType::bf16, 64, 64, 2, 2, 160, 123, 37, 16, 0.0f, true},    // chunked prefill in a window
        {KvType::f16, 64, 64, 2, 4, 300, 250, 1, 16, 0.0f, true},      // decode in a window
        {KvType::f8_e4m3, 64, 64, 1, 8, 96, 93, 3, 0, 30.0f, true},    // softcap
        {KvType::f16, 128, 64, 1, 4, 2200, 2100, 2, 0, 0.0f, true},    // one item over many splits
    };
    const Coverage cov = check_attention_cases(cases, 4400);
    CHECK(cov.split);
    CHECK(cov.single);
    CHECK(cov.max_splits >= 8);
}

// attention_tokens over a paged pool: two sequences whose pages are scattered over the pool's slots, a batch
// mixing their tokens at ragged positions, against a double-precision reference over the rows as the CPU encodes
// and decodes them. A token past kTokenKeysPerSplit keys takes several splits, merged by the last block.
void check_attention_tokens(KvType type, int32_t window, bool with_sinks, uint32_t seed) {
    CAPTURE(kv_type_name(type));
    CAPTURE(window);
    CAPTURE(with_sinks);
    const int32_t D = 64, Dv = 64, n_kv_heads = 2, group = 2, n_heads = n_kv_heads * group, P = kKvPagePositions;
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::vector<std::vector<int32_t>> tables = {{3, 0, 4}, {1, 2}};   // slots of each sequence's pages
    const std::vector<int32_t> lengths = {330, 200};                         // positions written per sequence
    const int32_t n_slots = 5;
    const size_t k_rb = kv_row_bytes(type, D), v_rb = kv_row_bytes(type, Dv);
    DeviceBuffer kpool(k_rb * n_kv_heads * P * n_slots), vpool(v_rb * n_kv_heads * P * n_slots);
    // Host rows as decoded after encoding, per sequence (head, pos, dim).
    std::vector<std::vector<float>> kd(2), vd(2);
    std::vector<DeviceBuffer> dtables;
    for (size_t sq = 0; sq < 2; ++sq) {
        const int32_t len = lengths[sq];
        const auto rows = static_cast<size_t>(len) * n_kv_heads;
        const auto seed_k = seed + 10 * static_cast<uint32_t>(sq);
        const std::vector<float> k = test::random_normal(rows * D, seed_k, 1.6f);
        const std::vector<float> v = test::random_normal(rows * Dv, seed_k + 1);
        dtables.push_back(upload(tables[sq]));
        cuda::KvLayer layer;
        layer.type = type;
        layer.k = kpool.p;
        layer.v = vpool.p;
        layer.n_kv_heads = n_kv_heads;
        layer.head_dim = D;
        layer.head_dim_v = Dv;
        layer.n_ctx = static_cast<int32_t>(tables[sq].size()) * P;
        layer.pages = dtables.back().as<int32_t>();
        DeviceBuffer dk = upload(k), dv = upload(v);
        cuda::kv_write(layer, dk.as<float>(), dv.as<float>(), len, 0, nullptr);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);   // before dk and dv are freed
        kd[sq].resize(static_cast<size_t>(n_kv_heads) * len * D);
        vd[sq].resize(static_cast<size_t>(n_kv_heads) * len * Dv);
        std::vector<uint8_t> row(std::max(k_rb, v_rb));
        for (int32_t p = 0; p < len; ++p)
            for (int32_t g = 0; g < n_kv_heads; ++g) {
                kv_store_row(type, k.data() + (static_cast<size_t>(p) * n_kv_heads + g) * D, row.data(), D);
                kv_load_row(type, row.data(), kd[sq].data() + (static_cast<size_t>(g) * len + p) * D, D);
                kv_store_row(type, v.data() + (static_cast<size_t>(p) * n_kv_heads + g) * Dv, row.data(), Dv);
                kv_load_row(type, row.data(), vd[sq].data() + (static_cast<size_t>(g) * len + p) * Dv, Dv);
            }
    }

    // The batch: sequence 0 at 329 (two splits without a window), 128 (a page's first row), 5; sequence 1 at 199, 0.
    const std::vector<int32_t> seq = {0, 1, 0, 0, 1}, pos = {329, 199, 128, 5, 0};
    const std::vector<int32_t> table_of = {0, 3};   // where each sequence's table starts in the concatenation
    std::vector<int32_t> all_tables, table;
    for (const auto& t : tables) all_tables.insert(all_tables.end(), t.begin(), t.end());
    for (int32_t sq : seq) table.push_back(table_of[static_cast<size_t>(sq)]);
    const auto n = static_cast<int64_t>(pos.size());
    const std::vector<float> q = test::random_normal(static_cast<size_t>(n) * n_heads * D, seed + 7, 1.6f);
    const std::vector<float> sinks = with_sinks ? sink_logits(n_heads, seed + 8) : std::vector<float>{};
    DeviceBuffer dq = upload(q), dpos = upload(pos), dtable = upload(table), dall = upload(all_tables),
                 dsinks = upload(sinks), datt(sizeof(float) * static_cast<size_t>(n) * n_heads * Dv);
    cuda::KvLayer layer;
    layer.type = type;
    layer.k = kpool.p;
    layer.v = vpool.p;
    layer.n_kv_heads = n_kv_heads;
    layer.head_dim = D;
    layer.head_dim_v = Dv;
    layer.n_ctx = 3 * P;
    layer.pages = dall.as<int32_t>();   // the paged layout (the map's tables name the pages), as the backend's layers
    const cuda::KvTokenMap map{dpos.as<int32_t>(), dtable.as<int32_t>(), dall.as<int32_t>()};
    cuda::attention_tokens(layer, dq.as<float>(), n, n_heads, window, scale, 0.0f, datt.as<float>(), map, 329, nullptr,
                           with_sinks ? dsinks.as<float>() : nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    const std::vector<float> att = download<float>(datt.p, static_cast<size_t>(n) * n_heads * Dv);

    double d_max = 0.0, ref_max = 0.0;
    std::vector<double> w;
    for (int64_t i = 0; i < n; ++i) {
        const auto sq = static_cast<size_t>(seq[static_cast<size_t>(i)]);
        const int32_t len = lengths[sq], p_i = pos[static_cast<size_t>(i)];
        const int32_t lo = window > 0 ? std::max(0, p_i - window + 1) : 0;
        for (int32_t h = 0; h < n_heads; ++h) {
            const int32_t g = h / group;
            const float* qh = q.data() + (static_cast<size_t>(i) * n_heads + h) * D;
            w.assign(static_cast<size_t>(p_i - lo + 1), 0.0);
            for (int32_t p = lo; p <= p_i; ++p) {
                const float* kr = kd[sq].data() + (static_cast<size_t>(g) * len + p) * D;
                double s = 0.0;
                for (int32_t d = 0; d < D; ++d) s += static_cast<double>(qh[d]) * kr[d];
                w[static_cast<size_t>(p - lo)] = s * scale;
            }
            softmax_with_sink(w, with_sinks ? &sinks[static_cast<size_t>(h)] : nullptr);
            for (int32_t d = 0; d < Dv; ++d) {
                double o = 0.0;
                for (int32_t p = lo; p <= p_i; ++p)
                    o += w[static_cast<size_t>(p - lo)] * vd[sq][(static_cast<size_t>(g) * len + p) * Dv + d];
                const float got = att[(static_cast<size_t>(i) * n_heads + h) * Dv + d];
                CAPTURE(i);
                CAPTURE(h);
                CAPTURE(d);
                REQUIRE(std::isfinite(got));
                d_max = std::max(d_max, std::fabs(got - o));
                ref_max = std::max(ref_max, std::fabs(o));
            }
        }
    }
    CHECK(d_max / ref_max < kAttnTolerance);
}

TEST_CASE("attention_tokens: sequences over a paged pool, with and without sinks, windows, split tokens merged") {
    check_attention_tokens(KvType::f16, 0, true, 7100);
    check_attention_tokens(KvType::q8_0, 33, true, 7200);
    check_attention_tokens(KvType::f32, 0, false, 7300);
    // Launched as a programmatic dependent (kv_write's launches stay plain): the token at 329 takes two splits.
    const cuda::ProgrammaticLaunches on(true);
#if defined(TERN_CUDA_EMULATOR)
    const size_t dependents = cuda_emu::programmatic_launches();
#endif
    check_attention_tokens(KvType::f16, 0, false, 7400);
#if defined(TERN_CUDA_EMULATOR)
    CHECK(cuda_emu::programmatic_launches() - dependents == 1);
#endif
}

TEST_CASE("attention at the small head dims of small models, float formats") {
    // Head dims 8 and 16 (stories260K and llama2xs; aidreams260K and babyllama), others that are not
    // multiples of 32 (24, 40; 4, 12 and 20, whose K/V tile rows are an even number of float4s), K and V
    // dims apart both ways, over decode, drafts, prefill from empty and chunked, windows, softcap, and GQA
    // groups up to the 64 rows a block holds at these head dims (64 / group tokens a block). Decode at
    // these sizes splits the key range; a block of one query row shares the head dim out over the 4
    // warps, one of 2 or 3 rows over 2, so uneven shares, shares of one float4 and empty ones occur.
    std::vector<AttnCase> cases;
    for (KvType t : kFloatFormats) {
        cases.push_back({t, 8, 8, 2, 1, 512, 300, 1, 0, 0.0f});     // decode, 301 keys, one row a block
        cases.push_back({t, 16, 16, 2, 4, 512, 200, 5, 0, 0.0f});   // draft verification
        cases.push_back({t, 16, 8, 2, 1, 256, 0, 150, 0, 0.0f});    // prefill from empty, 64-token tiles
        cases.push_back({t, 8, 16, 3, 2, 160, 123, 37, 100, 0.0f}); // chunked prefill, window < n_past
        cases.push_back({t, 24, 24, 1, 8, 96, 93, 3, 0, 30.0f});    // ends at n_ctx, softcap, group 8
        cases.push_back({t, 40, 40, 2, 3, 300, 250, 1, 64, 0.0f});  // decode in a window
        cases.push_back({t, 40, 24, 1, 7, 300, 0, 41, 0, 0.0f});
        cases.push_back({t, 8, 8, 1, 64, 128, 50, 3, 0, 0.0f});     // group 64: one token a block
        cases.push_back({t, 16, 16, 2, 16, 200, 20, 30, 33, 0.0f}); // group 16: 4 tokens a block
        cases.push_back({t, 4, 4, 2, 2, 64, 0, 64, 0, 50.0f});      // head dim 4, the whole cache at once
        cases.push_back({t, 12, 20, 1, 5, 400, 333, 1, 1, 0.0f});   // window 1: only itself
        cases.push_back({t, 8, 64, 1, 3, 100, 60, 2, 0, 0.0f});     // a small K dim with a V dim of 64
        cases.push_back({t, 20, 12, 2, 3, 200, 150, 1, 0, 0.0f});   // 3 rows: 5 float4s as 3 + 2
        cases.push_back({t, 4, 8, 1, 1, 100, 90, 1, 0, 0.0f});      // 1 row: 1 float4 as 1 + 0 + 0 + 0
    }
#if defined(TERN_CUDA_EMULATOR)
    const size_t device_bytes = cuda_emu::device_bytes_in_use();
#endif
    const Coverage cov = check_attention_cases(cases, 300);
#if defined(TERN_CUDA_EMULATOR)
    CHECK(cuda_emu::device_bytes_in_use() == device_bytes);
#endif
    CHECK(cov.split);
    CHECK(cov.single);
    CHECK(cov.many_tokens);
}

TEST_CASE("attention: a sweep of small and mixed head dims, float formats") {
    // Deterministic random cases as in the sweep above, with the float formats' head dims: multiples of 4
    // and 8 below and between multiples of 32, mixed with multiples of 32 (K and V dims apart in a
    // third), and groups up to the block's row budget, 64 at head dims up to 64.
    const EmulatedMultiprocessors sms(4);
    std::mt19937 rng(78);
    const int32_t dims[] = {4, 8, 8, 12, 16, 16, 20, 24, 40, 48, 72, 80, 112, 32, 64, 128};
    const int32_t groups[] = {1, 1, 2, 3, 4, 5, 8, 16, 64};
    const int32_t ns[] = {1, 1, 1, 2, 3, 4, 7, 8, 9, 16, 33, 70, 150};
    const int32_t windows[] = {0, 0, 0, 1, 2, 31, 32, 33, 64, 100, 1000};
    std::vector<AttnCase> cases;
    for (int i = 0; i < 60; ++i) {
        AttnCase c{};
        c.type = kFloatFormats[i % 3];
        c.head_dim = dims[rng() % std::size(dims)];
        c.head_dim_v = rng() % 3 == 0 ? dims[rng() % std::size(dims)] : c.head_dim;
        c.n_kv_heads = 1 + static_cast<int32_t>(rng() % 3);
        c.group = std::min<int32_t>(groups[rng() % std::size(groups)],
                                    std::min(64, 4096 / std::max(c.head_dim, c.head_dim_v)));
        c.n = ns[rng() % std::size(ns)];
        c.pos0 = static_cast<int32_t>(rng() % 400);
        c.n_ctx = c.pos0 + c.n + (rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % 50));
        c.window = windows[rng() % std::size(windows)];
        c.softcap = rng() % 4 == 0 ? 20.0f : 0.0f;
        cases.push_back(c);
    }
    const Coverage cov = check_attention_cases(cases, 7000);
    CHECK(cov.max_splits >= 3);
    CHECK(cov.many_tokens);
}

TEST_CASE("attention and kv_write refuse shapes they do not support") {
    DeviceCache cache(KvType::f16, 2, 128, 128, 16);
    DeviceBuffer buf(sizeof(float) * 16 * 8 * 128);
    float* x = buf.as<float>();
    CHECK_THROWS_AS(cuda::attention(cache.layer, x, 1, 3, 0, 0, 1.0f, 0.0f, x, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::attention(cache.layer, x, 4, 2, 13, 0, 1.0f, 0.0f, x, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::kv_write(cache.layer, x, x, 2, 15, nullptr), std::invalid_argument);
    // Float formats: multiples of 4 from 4 to 256 (80 and 8 are fine, 82, 6, 0 and 260 are not).
    for (int32_t bad : {82, 6, 0, 260}) {
        CAPTURE(bad);
        cuda::KvLayer odd = cache.layer;
        odd.head_dim = bad;
        CHECK_THROWS_AS(cuda::kv_write(odd, x, x, 1, 0, nullptr), std::invalid_argument);
        CHECK_THROWS_AS(cuda::attention(odd, x, 1, 2, 0, 0, 1.0f, 0.0f, x, nullptr), std::invalid_argument);
        odd = cache.layer;
        odd.head_dim_v = bad;
        CHECK_THROWS_AS(cuda::kv_write(odd, x, x, 1, 0, nullptr), std::invalid_argument);
        CHECK_THROWS_AS(cuda::kv_erase(odd, 0, 1, 2, cuda::RopeParams{}, nullptr), std::invalid_argument);
    }
    cuda::KvLayer f16_80 = cache.layer;
    f16_80.head_dim = 80;
    f16_80.head_dim_v = 8;
    CHECK_NOTHROW(cuda::kv_write(f16_80, x, x, 1, 0, nullptr));
    CHECK_NOTHROW(cuda::attention(f16_80, x, 1, 2, 0, 0, 1.0f, 0.0f, x + 8192, nullptr));
    // The block formats: multiples of 32 only.
    for (KvType type : {KvType::q8_0, KvType::f8_e4m3}) {
        CAPTURE(kv_type_name(type));
        DeviceCache blocks(type, 2, 128, 128, 16);
        for (auto [d, dv] : {std::pair{80, 128}, std::pair{128, 16}, std::pair{8, 8}}) {
            cuda::KvLayer l = blocks.layer;
            l.head_dim = d;
            l.head_dim_v = dv;
            CHECK_THROWS_WITH_AS(cuda::kv_write(l, x, x, 1, 0, nullptr), doctest::Contains("multiples of 32"),
                                 std::invalid_argument);
            CHECK_THROWS_AS(cuda::attention(l, x, 1, 2, 0, 0, 1.0f, 0.0f, x, nullptr), std::invalid_argument);
            CHECK_THROWS_AS(cuda::kv_erase(l, 0, 1, 2, cuda::RopeParams{}, nullptr), std::invalid_argument);
        }
    }
    // The group limit, min(64, 4096 / widest head dim): 64 at head dim 8, one more is refused.
    cuda::KvLayer small = cache.layer;
    small.head_dim = small.head_dim_v = 8;
    small.n_kv_heads = 1;
    CHECK_NOTHROW(cuda::attention(small, x, 1, 64, 0, 0, 1.0f, 0.0f, x + 8192, nullptr));
    CHECK_THROWS_AS(cuda::attention(small, x, 1, 65, 0, 0, 1.0f, 0.0f, x, nullptr), std::invalid_argument);
    cuda::KvLayer wide = cache.layer;
    wide.head_dim = wide.head_dim_v = 256;
    wide.n_kv_heads = 1;
    CHECK_THROWS_AS(cuda::attention(wide, x, 1, 32, 0, 0, 1.0f, 0.0f, x, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::kv_erase(cache.layer, 3, 2, 10, cuda::RopeParams{}, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cuda::kv_erase(cache.layer, 0, 11, 10, cuda::RopeParams{}, nullptr), std::invalid_argument);
}

// ---- kv_erase -------------------------------------------------------------------------------------------

struct EraseCase {
    KvType type;
    int32_t head_dim, head_dim_v, n_kv_heads, n_ctx, n_past, begin, end;
    bool neox;
    int32_t n_rot;
    bool factors;
};

TEST_CASE("kv_erase moves and turns the cache bit for bit as the CPU's KvCache::erase") {
    std::vector<EraseCase> cases;
    for (KvType t : kFormats) {
        cases.push_back({t, 128, 128, 2, 200, 150, 10, 40, true, 128, false}); // 110 rows move, overlapping
        cases.push_back({t, 64, 96, 3, 100, 97, 0, 1, false, 64, true});       // one position, 96 rows move
        cases.push_back({t, 96, 64, 1, 90, 90, 50, 89, true, 64, false});      // partial rope, one row moves
        cases.push_back({t, 32, 32, 2, 64, 64, 3, 40, false, 0, false});       // no rope: K bytes move too
    }
    // Waves of `removed` rows run in parallel when there are at most 16 of them, else one block per head
    // walks the rows in order: 13 waves, 19 (walked in order), and 248 (walked in order).
    cases.push_back({KvType::f8_e4m3, 128, 64, 2, 120, 100, 20, 26, true, 128, true});
    cases.push_back({KvType::q8_0, 64, 64, 2, 120, 110, 10, 15, false, 64, false});
    cases.push_back({KvType::f16, 256, 256, 1, 300, 280, 30, 31, false, 256, true});
    cases.push_back({KvType::q8_0, 128, 128, 2, 64, 50, 20, 50, true, 128, false}); // nothing after the gap
    cases.push_back({KvType::bf16, 128, 128, 2, 64, 50, 20, 20, true, 128, false}); // nothing removed
    // The float formats at head dims that are not multiples of 32: rows of 8..160 bytes moved in 16- or
    // 4-byte units, K rows rotated element by element; full and partial rope, both styles, factors.
    for (KvType t : kFloatFormats) {
        cases.push_back({t, 8, 8, 2, 64, 50, 10, 20, true, 8, false});    // 30 rows move, 3 waves
        cases.push_back({t, 16, 8, 3, 40, 40, 0, 1, false, 16, true});    // one position, 39 rows move
        cases.push_back({t, 40, 24, 1, 90, 90, 50, 89, true, 32, false}); // partial rope, one row moves
        cases.push_back({t, 24, 40, 2, 64, 64, 3, 40, false, 0, false});  // no rope: K bytes move too
        cases.push_back({t, 12, 4, 2, 64, 60, 5, 9, true, 12, true});     // head dims 12 and 4
        cases.push_back({t, 8, 16, 2, 300, 280, 30, 31, false, 6, true}); // 249 rows walked in order
    }

    for (const EraseCase& c : cases)
    for (const bool yarn : {false, true}) {   // YaRN's angles turn the keys too (corr range [1, 3], mscale 1.3)
        CAPTURE(yarn);
        const RopeYarn yarn_params = yarn ? RopeYarn{1.0f, 1.0f, 3.0f, 1.3f} : RopeYarn{};
        CAPTURE(kv_type_name(c.type));
        CAPTURE(c.head_dim);
        CAPTURE(c.head_dim_v);
        CAPTURE(c.begin);
        CAPTURE(c.end);
        CAPTURE(c.n_past);
        CAPTURE(c.neox);
        CAPTURE(c.n_rot);
        const int32_t D = c.head_dim, Dv = c.head_dim_v;
        const float base = 10000.0f, freq_scale = 0.75f;
        std::vector<float> factors;
        for (int32_t i = 0; i < c.n_rot / 2; ++i)
            factors.push_back(1.0f + 0.37f * static_cast<float>(i % 5));
        const std::vector<float> k = test::random_normal(static_cast<size_t>(c.n_past) * c.n_kv_heads * D, 70, 2.0f);
        const std::vector<float> v = test::random_normal(static_cast<size_t>(c.n_past) * c.n_kv_heads * Dv, 71, 2.0f);

        KvCache cpu;
        cpu.init(c.type, {c.n_kv_heads}, D, Dv, c.n_ctx);
        for (int32_t p = 0; p < c.n_past; ++p)
            cpu.write(0, p, k.data() + static_cast<size_t>(p) * c.n_kv_heads * D,
                      v.data() + static_cast<size_t>(p) * c.n_kv_heads * Dv);
        cpu.set_n_past(c.n_past);
        std::vector<RopeRotation> rotation;
        if (c.n_rot > 0 && c.end > c.begin && c.end < c.n_past) // as CpuBackend::kv_erase builds them
            rotation.push_back(rope_rotation(c.neox, c.n_rot, c.begin - c.end, base, freq_scale,
                                             c.factors ? factors.data() : nullptr, yarn_params));
        cpu.erase(c.begin, c.end, rotation, 1);

        DeviceCache dev(c.type, c.n_kv_heads, D, Dv, c.n_ctx);
        DeviceBuffer dk = upload(k), dv = upload(v), dfactors = upload(factors);
        cuda::kv_write(dev.layer, dk.as<float>(), dv.as<float>(), c.n_past, 0, nullptr);
        cuda::RopeParams rope;
        rope.neox = c.neox;
        rope.n_rot = c.n_rot;
        rope.base = base;
        rope.freq_scale = freq_scale;
        rope.freq_factors = c.factors ? dfactors.as<float>() : nullptr;
        rope.yarn_ext_factor = yarn_params.ext_factor;
        rope.yarn_corr_low = yarn_params.corr_low;
        rope.yarn_corr_high = yarn_params.corr_high;
        rope.mscale = yarn_params.mscale;   // the shift must leave it out
        cuda::kv_erase(dev.layer, c.begin, c.end, c.n_past, rope, nullptr);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);

        const std::vector<uint8_t> gk = dev.k_host(), gv = dev.v_host();
        const size_t k_rb = kv_row_bytes(c.type, D), v_rb = kv_row_bytes(c.type, Dv);
        const int32_t kept = c.n_past - (c.end - c.begin);
        REQUIRE(cpu.n_past() == kept);
        int64_t k_rows_differ = 0, v_rows_differ = 0, rows_rotated_changed = 0;
        for (int32_t h = 0; h < c.n_kv_heads; ++h) {
            for (int32_t p = 0; p < kept; ++p) {
                const uint8_t* g = gk.data() + (static_cast<size_t>(h) * c.n_ctx + p) * k_rb;
                k_rows_differ += std::memcmp(g, cpu.k_row(0, h, p), k_rb) != 0;
                v_rows_differ += std::memcmp(gv.data() + (static_cast<size_t>(h) * c.n_ctx + p) * v_rb,
                                             cpu.v_row(0, h, p), v_rb) != 0;
            }
            // Rows past the kept ones are left as they were (the CPU's memmove leaves them too); rows
            // never written keep the fill.
            for (int32_t p = c.n_past; p < c.n_ctx; ++p)
                for (size_t b = 0; b < k_rb; ++b)
                    REQUIRE(gk[(static_cast<size_t>(h) * c.n_ctx + p) * k_rb + b] == 0xA5);
        }
        // The rotation did something where it should (a test that passes with no rotation at all is no test).
        if (!rotation.empty()) {
            std::vector<uint8_t> plain(k_rb);
            for (int32_t p = c.begin; p < kept; ++p) {
                kv_store_row(c.type, k.data() + (static_cast<size_t>(p + c.end - c.begin) * c.n_kv_heads) * D,
                             plain.data(), D);
                rows_rotated_changed += std::memcmp(plain.data(), cpu.k_row(0, 0, p), k_rb) != 0;
            }
            CHECK(rows_rotated_changed == kept - c.begin);
        }
        CHECK(k_rows_differ == 0);
        CHECK(v_rows_differ == 0);
    }
}

} // namespace
} // namespace tern
