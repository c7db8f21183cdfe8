// Flash-style attention (kernels/cpu/attention.h): the AVX2 chunk kernel and its scalar twin against the
// two-pass attention_head (kernels/cpu/ops.h) on the dequantized cache, for every KV format, on random
// data at several sizes; and batch invariance: a token's output is the same bits alone and inside a batch,
// for any thread count.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

const char* format_name(KvType f) {
    switch (f) {
    case KvType::f32: return "f32";
    case KvType::f16: return "f16";
    case KvType::bf16: return "bf16";
    case KvType::q8_0: return "q8_0";
    case KvType::f8_e4m3: return "f8_e4m3";
    }
    return "?";
}

constexpr KvType kFormats[] = {KvType::f32, KvType::f16, KvType::bf16, KvType::q8_0, KvType::f8_e4m3};

// n_rows rows of n random elements stored in format f, plus the f32 values the stored rows decode to.
struct StoredRows {
    std::vector<uint8_t> bytes;
    std::vector<float> values;
};

StoredRows store_rows(KvType f, int64_t n_rows, int64_t n, uint32_t seed, float scale) {
    const auto src = test::random_normal(static_cast<size_t>(n_rows * n), seed, scale);
    const size_t rb = kv_row_bytes(f, n);
    StoredRows s;
    s.bytes.resize(rb * static_cast<size_t>(n_rows));
    s.values.resize(src.size());
    for (int64_t r = 0; r < n_rows; ++r) {
        kv_store_row(f, src.data() + r * n, s.bytes.data() + static_cast<size_t>(r) * rb, n);
        kv_load_row(f, s.bytes.data() + static_cast<size_t>(r) * rb, s.values.data() + r * n, n);
    }
    return s;
}

} // namespace

TEST_CASE("kv rows: the block formats round-trip within their quantization step") {
    for (KvType f : kFormats) {
        for (int64_t n : {32, 64, 256}) {
            CAPTURE(format_name(f));
            CAPTURE(n);
            const auto src = test::random_normal(static_cast<size_t>(n), 5, 3.0f);
            std::vector<uint8_t> row(kv_row_bytes(f, n));
            std::vector<float> back(static_cast<size_t>(n));
            kv_store_row(f, src.data(), row.data(), n);
            kv_load_row(f, row.data(), back.data(), n);
            for (int64_t b = 0; b < n; b += 32) {
                float amax = 0.0f;
                for (int64_t i = b; i < b + 32; ++i)
                    amax = std::max(amax, std::fabs(src[size_t(i)]));
                for (int64_t i = b; i < b + 32; ++i) {
                    const float x = src[size_t(i)], err = std::fabs(back[size_t(i)] - x);
                    switch (f) {
                    case KvType::f32: CHECK(err == 0.0f); break;
                    case KvType::f16: CHECK(err <= std::fabs(x) * 0x1p-11f); break;
                    case KvType::bf16: CHECK(err <= std::fabs(x) * 0x1p-8f); break;
                    // half a step of amax / 127, plus the f16 rounding of the scale (2^-11 of |x|)
                    case KvType::q8_0: CHECK(err <= amax / 127.0f * 0.5f + std::fabs(x) * 0x1p-10f); break;
                    // 3 mantissa bits: half an ulp is 2^-4 relative; subnormals are steps of amax / 448 * 2^-9
                    case KvType::f8_e4m3:
                        CHECK(err <= std::fabs(x) * 0x1p-4f * 1.01f + amax / 448.0f * 0x1p-9f + std::fabs(x) * 0x1p-10f);
                        break;
                    }
                }
            }
        }
    }
    CHECK(kv_row_bytes(KvType::q8_0, 256) == 8 * 34);
    CHECK(kv_row_bytes(KvType::f8_e4m3, 64) == 2 * 34);
}

TEST_CASE("flash attention (AVX2 and scalar chunk kernels) matches two-pass attention on the dequantized cache") {
    const CpuKernels* avx2_set = cpu_kernels_for(CpuIsa::avx2);
    const AttnChunkFn avx2 = avx2_set ? avx2_set->attn_chunk : nullptr;
    if (avx2 == nullptr) MESSAGE("no AVX2 attention kernel in this build or CPU: checking the scalar twin only");
    for (KvType f : kFormats) {
        for (int64_t head_dim : {64, 128, 256}) {
            for (int64_t n_keys : {1, 7, 33, 64, 257, 1000}) {
                for (int64_t group : {1, 4, 8}) {
                    for (int window_case = 0; window_case < 2; ++window_case) {
                        const float softcap = window_case == 1 ? 30.0f : 0.0f;
                        // The window case also starts the visible range off a chunk boundary.
                        const int32_t hi = static_cast<int32_t>(n_keys - 1);
                        const int32_t lo = window_case == 1 ? static_cast<int32_t>(n_keys / 3) : 0;
                        CAPTURE(format_name(f));
                        CAPTURE(head_dim);
                        CAPTURE(n_keys);
                        CAPTURE(group);
                        CAPTURE(lo);
                        const int64_t head_dim_v = head_dim;
                        const auto q = test::random_normal(size_t(group * head_dim), 21 + uint32_t(group), 2.0f);
                        const StoredRows k = store_rows(f, n_keys, head_dim, 22, 1.0f);
                        const StoredRows v = store_rows(f, n_keys, head_dim_v, 23, 1.0f);
                        AttnParams p;
                        p.format = f;
                        p.head_dim = head_dim;
                        p.head_dim_v = head_dim_v;
                        p.group = group;
                        p.scale = 1.0f / std::sqrt(float(head_dim));
                        p.softcap = softcap;
                        // Oracle: two-pass attention over the decoded f32 rows lo .. hi.
                        const int64_t visible = hi - lo + 1;
                        std::vector<float> ref(static_cast<size_t>(group * head_dim_v)), scores(static_cast<size_t>(visible));
                        for (int64_t h = 0; h < group; ++h)
                            attention_head(q.data() + h * head_dim, k.values.data() + lo * head_dim,
                                           v.values.data() + lo * head_dim_v, KvElem::f32, visible, head_dim, head_dim_v,
                                           p.scale, p.softcap, scores.data(), ref.data() + h * head_dim_v);
                        std::vector<float> scratch(attn_scratch_floats(p));
                        for (AttnChunkFn kernel : {AttnChunkFn(attn_chunk_scalar), avx2}) {
                            if (kernel == nullptr) continue;
                            CAPTURE(kernel == avx2);
                            std::vector<float> out(ref.size(), -7.0f);
                            attend_group(p, kernel, q.data(), head_dim, k.bytes.data(), v.bytes.data(), lo, hi,
                                         scratch.data(), out.data(), head_dim_v);
                            double worst = 0.0;
                            for (size_t i = 0; i < out.size(); ++i)
                                worst = std::max(worst, std::fabs(double(out[i]) - ref[i]));
                            CHECK(worst < 1e-5); // the f32 oracle itself is off by up to ~4e-6 at 1000 keys
                        }
                    }
                }
            }
        }
    }
}

TEST_CASE("flash attention: a token's output is the same bits alone, in any batch and for any thread count") {
    for (KvType f : {KvType::f16, KvType::q8_0, KvType::f8_e4m3}) {
        for (int64_t n_kv_heads : {1, 2}) {
            for (int32_t window : {0, 300}) {
                CAPTURE(format_name(f));
                CAPTURE(n_kv_heads);
                CAPTURE(window);
                const int64_t head_dim = 256, group = 8, n_ctx = 700; // big enough for 2 threads in decode
                AttnParams p;
                p.format = f;
                p.head_dim = p.head_dim_v = head_dim;
                p.group = group;
                p.scale = 0.088f;
                const StoredRows k = store_rows(f, n_kv_heads * n_ctx, head_dim, 31, 1.0f);
                const StoredRows v = store_rows(f, n_kv_heads * n_ctx, head_dim, 32, 1.0f);
                const size_t head_bytes = kv_row_bytes(f, head_dim) * size_t(n_ctx);
                std::vector<const void*> kh, vh;
                for (int64_t g = 0; g < n_kv_heads; ++g) {
                    kh.push_back(k.bytes.data() + size_t(g) * head_bytes);
                    vh.push_back(v.bytes.data() + size_t(g) * head_bytes);
                }
                const int64_t q_stride = n_kv_heads * group * head_dim; // per token
                const auto q = test::random_normal(size_t(n_ctx * q_stride), 33, 3.0f);
                const AttnChunkFn kernel = attn_chunk_kernel(p);
                auto run = [&](int32_t pos0, int64_t n, int threads) {
                    std::vector<float> out(size_t(n * q_stride));
                    attend_tokens(p, kernel, n_kv_heads, kh.data(), vh.data(), pos0, n, window,
                                  q.data() + pos0 * q_stride, q_stride, out.data(), q_stride, threads);
                    return out;
                };
                const auto all = run(0, n_ctx, 2); // a prefill of every position
                const auto tail = run(450, 120, 1); // a verification batch in the middle, one thread
                for (int32_t pos : {0, 5, 127, 128, 129, 300, 455, 569, 699}) {
                    CAPTURE(pos);
                    const float* batched = all.data() + pos * q_stride;
                    for (int threads : {1, 2}) {
                        const auto alone = run(pos, 1, threads); // decode: chunks may go to different threads
                        CHECK(std::memcmp(alone.data(), batched, sizeof(float) * size_t(q_stride)) == 0);
                    }
                    if (pos >= 450 && pos < 570)
                        CHECK(std::memcmp(tail.data() + (pos - 450) * q_stride, batched,
                                          sizeof(float) * size_t(q_stride)) == 0);
                }
            }
        }
    }
}

TEST_CASE("attention sinks (gpt-oss): flash (AVX2 and scalar kernels, batch and decode) and two-pass match a "
          "double-precision softmax with the sink in its denominator") {
    const CpuKernels* avx2_set = cpu_kernels_for(CpuIsa::avx2);
    const AttnChunkFn avx2 = avx2_set ? avx2_set->attn_chunk : nullptr;
    const int64_t head_dim = 64, group = 4;
    for (KvType f : {KvType::f32, KvType::f16}) {
        for (int64_t n_kv_heads : {1, 2}) {
            for (int64_t n_ctx : {1, 7, 64, 65, 300}) {
                for (int32_t window : {0, 16}) {
                    CAPTURE(format_name(f));
                    CAPTURE(n_kv_heads);
                    CAPTURE(n_ctx);
                    CAPTURE(window);
                    const int64_t n_heads = n_kv_heads * group, q_stride = n_heads * head_dim;
                    // Sinks around the scores' scale, one far above them and one far below.
                    std::vector<float> sinks = test::random_normal(size_t(n_heads), 41, 2.0f);
                    sinks[0] = 40.0f;
                    sinks[size_t(n_heads - 1)] = -40.0f;
                    AttnParams p;
                    p.format = f;
                    p.head_dim = p.head_dim_v = head_dim;
                    p.group = group;
                    p.scale = 0.125f;
                    p.sinks = sinks.data();
                    const StoredRows k = store_rows(f, n_kv_heads * n_ctx, head_dim, 42, 1.0f);
                    const StoredRows v = store_rows(f, n_kv_heads * n_ctx, head_dim, 43, 1.0f);
                    const size_t head_bytes = kv_row_bytes(f, head_dim) * size_t(n_ctx);
                    std::vector<const void*> kh, vh;
                    for (int64_t g = 0; g < n_kv_heads; ++g) {
                        kh.push_back(k.bytes.data() + size_t(g) * head_bytes);
                        vh.push_back(v.bytes.data() + size_t(g) * head_bytes);
                    }
                    const auto q = test::random_normal(size_t(n_ctx * q_stride), 44, 3.0f);
                    // Oracle in double over the decoded rows: exp(s_j - M) / (sum_j exp(s_j - M) + exp(sink - M)).
                    std::vector<double> ref(static_cast<size_t>(n_ctx * q_stride));
                    double moved = 0.0;   // how far the sinks move the outputs: the test must see them
                    for (int64_t i = 0; i < n_ctx; ++i)
                        for (int64_t h = 0; h < n_heads; ++h) {
                            const int64_t g = h / group, lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
                            std::vector<double> sc;
                            double mx = sinks[size_t(h)];
                            for (int64_t j = lo; j <= i; ++j) {
                                double d = 0.0;
                                for (int64_t e = 0; e < head_dim; ++e)
                                    d += double(q[size_t(i * q_stride + h * head_dim + e)]) *
                                         k.values[size_t((g * n_ctx + j) * head_dim + e)];
                                sc.push_back(d * p.scale);
                                mx = std::max(mx, sc.back());
                            }
                            double sum = std::exp(double(sinks[size_t(h)]) - mx), plain = 0.0;
                            for (double& x : sc) {
                                x = std::exp(x - mx);
                                sum += x;
                                plain += x;
                            }
                            for (int64_t e = 0; e < head_dim; ++e) {
                                double acc = 0.0;
                                for (int64_t j = lo; j <= i; ++j)
                                    acc += sc[size_t(j - lo)] * v.values[size_t((g * n_ctx + j) * head_dim + e)];
                                ref[size_t(i * q_stride + h * head_dim + e)] = acc / sum;
                                moved = std::max(moved, std::fabs(acc / sum - acc / plain));
                            }
                        }
                    CHECK(moved > 0.1);
                    const auto worst = [&](const std::vector<float>& out, int64_t first, int64_t n) {
                        double w = 0.0;
                        for (int64_t x = 0; x < n * q_stride; ++x)
                            w = std::max(w, std::fabs(out[size_t(x)] - ref[size_t(first * q_stride + x)]));
                        return w;
                    };
                    for (AttnChunkFn kernel : {AttnChunkFn(attn_chunk_scalar), avx2}) {
                        if (kernel == nullptr) continue;
                        CAPTURE(kernel == avx2);
                        std::vector<float> all(static_cast<size_t>(n_ctx * q_stride));
                        attend_tokens(p, kernel, n_kv_heads, kh.data(), vh.data(), 0, n_ctx, window, q.data(), q_stride,
                                      all.data(), q_stride, 2);
                        CHECK(worst(all, 0, n_ctx) < 1e-5);
                        // Decode of the last position, on one and two threads (its chunks split among them).
                        for (int threads : {1, 2}) {
                            std::vector<float> last(static_cast<size_t>(q_stride));
                            attend_tokens(p, kernel, n_kv_heads, kh.data(), vh.data(), int32_t(n_ctx - 1), 1, window,
                                          q.data() + (n_ctx - 1) * q_stride, q_stride, last.data(), q_stride, threads);
                            CHECK(std::memcmp(last.data(), all.data() + (n_ctx - 1) * q_stride,
                                              sizeof(float) * size_t(q_stride)) == 0);
                        }
                    }
                    // The two-pass reference path (exact_matmul over an f32 cache) with its sink.
                    if (f == KvType::f32) {
                        std::vector<float> out(static_cast<size_t>(n_ctx * q_stride)), scores(static_cast<size_t>(n_ctx));
                        for (int64_t i = 0; i < n_ctx; ++i)
                            for (int64_t h = 0; h < n_heads; ++h) {
                                const int64_t g = h / group, lo = window > 0 ? std::max<int64_t>(0, i - window + 1) : 0;
                                attention_head(q.data() + i * q_stride + h * head_dim,
                                               k.values.data() + (g * n_ctx + lo) * head_dim,
                                               v.values.data() + (g * n_ctx + lo) * head_dim, KvElem::f32, i - lo + 1,
                                               head_dim, head_dim, p.scale, 0.0f, scores.data(),
                                               out.data() + i * q_stride + h * head_dim, &sinks[size_t(h)]);
                            }
                        CHECK(worst(out, 0, n_ctx) < 1e-5);
                    }
                }
            }
        }
    }
}

TEST_CASE("flash attention over pages in any order is bit for bit the contiguous attention") {
    for (KvType f : {KvType::f32, KvType::f16, KvType::q8_0}) {
        for (int64_t n_kv_heads : {1, 3}) {
            CAPTURE(format_name(f));
            CAPTURE(n_kv_heads);
            const int64_t head_dim = 64, head_dim_v = 32, group = 2, n_ctx = 5 * kAttnChunk - 17;
            const int64_t n_pages = (n_ctx + kAttnChunk - 1) / kAttnChunk;
            AttnParams p;
            p.format = f;
            p.head_dim = head_dim;
            p.head_dim_v = head_dim_v;
            p.group = group;
            p.scale = 0.125f;
            const StoredRows k = store_rows(f, n_kv_heads * n_ctx, head_dim, 41, 1.0f);
            const StoredRows v = store_rows(f, n_kv_heads * n_ctx, head_dim_v, 42, 1.0f);
            const size_t kr = kv_row_bytes(f, head_dim), vr = kv_row_bytes(f, head_dim_v);
            std::vector<const void*> kh, vh;
            for (int64_t g = 0; g < n_kv_heads; ++g) {
                kh.push_back(k.bytes.data() + size_t(g * n_ctx) * kr);
                vh.push_back(v.bytes.data() + size_t(g * n_ctx) * vr);
            }
            // The same rows in pages: chunk c in slot pages[c] (reversed, one spare slot first), every head
            // of a slot together, as engine/cpu/kv_cache.h lays them out.
            std::vector<int32_t> pages;
            for (int64_t c = 0; c < n_pages; ++c) pages.push_back(int32_t(n_pages - c));
            const size_t k_page = size_t(n_kv_heads * kAttnChunk) * kr, v_page = size_t(n_kv_heads * kAttnChunk) * vr;
            std::vector<uint8_t> kp(size_t(n_pages + 1) * k_page, 0xEE), vp(size_t(n_pages + 1) * v_page, 0xEE);
            for (int64_t g = 0; g < n_kv_heads; ++g)
                for (int64_t pos = 0; pos < n_ctx; ++pos) {
                    const size_t slot = size_t(pages[size_t(pos / kAttnChunk)]), row = size_t(g * kAttnChunk + pos % kAttnChunk);
                    std::memcpy(kp.data() + slot * k_page + row * kr, k.bytes.data() + size_t(g * n_ctx + pos) * kr, kr);
                    std::memcpy(vp.data() + slot * v_page + row * vr, v.bytes.data() + size_t(g * n_ctx + pos) * vr, vr);
                }
            KvPagesView view;
            view.k = kp.data();
            view.v = vp.data();
            view.pages = pages.data();
            view.k_page_stride = k_page;
            view.v_page_stride = v_page;
            view.k_head_stride = size_t(kAttnChunk) * kr;
            view.v_head_stride = size_t(kAttnChunk) * vr;
            const int64_t q_stride = n_kv_heads * group * head_dim, out_stride = n_kv_heads * group * head_dim_v;
            const auto q = test::random_normal(size_t(n_ctx * q_stride), 43, 3.0f);
            const AttnChunkFn kernel = attn_chunk_kernel(p);
            for (int32_t window : {0, 200}) {
                for (const auto& [pos0, n] : {std::pair<int32_t, int64_t>{0, n_ctx}, {n_ctx - 1, 1}, {300, 9}}) {
                    CAPTURE(window);
                    CAPTURE(pos0);
                    for (int threads : {1, 2}) {
                        std::vector<float> a(size_t(n * out_stride)), b(a.size());
                        attend_tokens(p, kernel, n_kv_heads, kh.data(), vh.data(), pos0, n, window,
                                      q.data() + pos0 * q_stride, q_stride, a.data(), out_stride, threads);
                        attend_tokens(p, kernel, n_kv_heads, view, pos0, n, window, q.data() + pos0 * q_stride,
                                      q_stride, b.data(), out_stride, threads);
                        CHECK(std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
                    }
                }
            }
        }
    }
}

namespace {
double thread_cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}
} // namespace

// TERN_BENCH=1 ./test_kernels_attention -tc='bench*': one thread, Gemma 3 270M's attention shape (head dim 256,
// 4 query heads on 1 KV head). Thread CPU time, best of several runs, so a busy machine disturbs it less.
TEST_CASE("bench: flash vs two-pass attention at Gemma 3 270M's shape" * doctest::skip(std::getenv("TERN_BENCH") == nullptr)) {
    const int64_t head_dim = 256, group = 4;
    const float scale = 0.0625f;
    auto best_of = [](int reps, auto&& fn) {
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
            const double t0 = thread_cpu_seconds();
            fn();
            best = std::min(best, thread_cpu_seconds() - t0);
        }
        return best;
    };
    for (int64_t depth : {512, 4096}) {
        const auto q = test::random_normal(size_t(depth * group * head_dim), 41);
        std::vector<float> out(size_t(depth * group * head_dim));
        // Before: the two-pass attention_head per (token, head), f16 cache.
        {
            const StoredRows k = store_rows(KvType::f16, depth, head_dim, 42, 1.0f);
            const StoredRows v = store_rows(KvType::f16, depth, head_dim, 43, 1.0f);
            std::vector<float> scores(static_cast<size_t>(depth));
            const int32_t pos = int32_t(depth - 1);
            const double dec = best_of(20, [&] {
                for (int64_t h = 0; h < group; ++h)
                    attention_head(q.data() + h * head_dim, k.bytes.data(), v.bytes.data(), KvElem::f16, pos + 1,
                                   head_dim, head_dim, scale, 0.0f, scores.data(), out.data() + h * head_dim);
            });
            const double pre = best_of(2, [&] {
                for (int64_t i = 0; i < depth; ++i)
                    for (int64_t h = 0; h < group; ++h)
                        attention_head(q.data() + (i * group + h) * head_dim, k.bytes.data(), v.bytes.data(),
                                       KvElem::f16, i + 1, head_dim, head_dim, scale, 0.0f, scores.data(),
                                       out.data() + (i * group + h) * head_dim);
            });
            std::printf("bench: depth %5lld two-pass f16      : decode %.3f ms/token, prefill %lld tokens %.1f ms\n",
                        (long long)depth, dec * 1e3, (long long)depth, pre * 1e3);
        }
        for (KvType f : kFormats) {
            AttnParams p;
            p.format = f;
            p.head_dim = p.head_dim_v = head_dim;
            p.group = group;
            p.scale = scale;
            const StoredRows k = store_rows(f, depth, head_dim, 42, 1.0f);
            const StoredRows v = store_rows(f, depth, head_dim, 43, 1.0f);
            const void* kh = k.bytes.data();
            const void* vh = v.bytes.data();
            const AttnChunkFn kernel = attn_chunk_kernel(p);
            const double dec = best_of(20, [&] {
                attend_tokens(p, kernel, 1, &kh, &vh, int32_t(depth - 1), 1, 0, q.data(), group * head_dim, out.data(),
                              group * head_dim, 1);
            });
            const double pre = best_of(2, [&] {
                attend_tokens(p, kernel, 1, &kh, &vh, 0, depth, 0, q.data(), group * head_dim, out.data(),
                              group * head_dim, 1);
            });
            std::printf("bench: depth %5lld flash %-8s %s: decode %.3f ms/token, prefill %lld tokens %.1f ms\n",
                        (long long)depth, format_name(f), kernel == attn_chunk_scalar ? "scalar" : "avx2  ", dec * 1e3,
                        (long long)depth, pre * 1e3);
        }
    }
}

// Decode attention of a whole Gemma 3 270M token at depth 4096: 18 layers, every 6th global, the others a
// 512-position sliding window, each layer its own cache (so the KV comes from memory, not a hot L2, as in a
// real decode step). Thread CPU time of one thread, best of several tokens.
TEST_CASE("bench: one Gemma 3 270M decode step's attention at depth 4096" * doctest::skip(std::getenv("TERN_BENCH") == nullptr)) {
    const int64_t head_dim = 256, group = 4, depth = 4096, n_layers = 18;
    const auto q = test::random_normal(size_t(group * head_dim), 51);
    std::vector<float> out(size_t(group * head_dim));
    for (KvType f : kFormats) {
        AttnParams p;
        p.format = f;
        p.head_dim = p.head_dim_v = head_dim;
        p.group = group;
        p.scale = 0.0625f;
        std::vector<StoredRows> k, v;
        for (int64_t l = 0; l < n_layers; ++l) {
            k.push_back(store_rows(f, depth, head_dim, 60 + uint32_t(l), 1.0f));
            v.push_back(store_rows(f, depth, head_dim, 80 + uint32_t(l), 1.0f));
        }
        const AttnChunkFn kernel = attn_chunk_kernel(p);
        double best = 1e30;
        for (int rep = 0; rep < 8; ++rep) {
            const double t0 = thread_cpu_seconds();
            for (int64_t l = 0; l < n_layers; ++l) {
                const void* kh = k[size_t(l)].bytes.data();
                const void* vh = v[size_t(l)].bytes.data();
                const int32_t window = (l + 1) % 6 == 0 ? 0 : 512;
                attend_tokens(p, kernel, 1, &kh, &vh, int32_t(depth - 1), 1, window, q.data(), group * head_dim,
                              out.data(), group * head_dim, 1);
            }
            best = std::min(best, thread_cpu_seconds() - t0);
        }
        const double kv_mb = double(3 * depth + 15 * 512) * 2.0 * double(kv_row_bytes(f, head_dim)) / 1e6;
        std::printf("bench: Gemma 3 270M decode attention, depth %lld, %-8s: %.3f ms/token (%.1f MB of KV read)\n",
                    (long long)depth, format_name(f), best * 1e3, kv_mb);
    }
}

} // namespace tern
