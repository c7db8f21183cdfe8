#include "kernels/cpu/membw.h"

#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <new>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "kernels/cpu/stream_prefetch.h"
#include "kernels/cpu_features.h"

namespace tern {

namespace {

constexpr uint64_t kMiB = uint64_t(1) << 20;
constexpr uint64_t kPage = 4096;

uint64_t last_level_cache_bytes() {
    long llc = 0;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc <= 0) llc = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
    return llc > 0 ? static_cast<uint64_t>(llc) : 64 * kMiB;   // unknown: assume a large server cache
}

// MemAvailable counts reclaimable page cache, which is what a new allocation can really get.
uint64_t available_memory_bytes() {
    std::ifstream f("/proc/meminfo");
    std::string key, unit;
    uint64_t kib = 0;
    while (f >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024;
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
    return uint64_t(8) << 30;
}

#if defined(__x86_64__)
// Four independent accumulators so the adds never wait on each other; the loop is bound by the
// loads, which is the point. kPrefetch also requests every line ahead, into L2 and into L1, as the
// weight-streaming tiles do (stream_prefetch.h). The plain loop leaves the read
// to the hardware prefetchers and the L1's few fill buffers: on the 2-core Xeon it reads 23-24 GB/s at 2 threads
// where the prefetching one reads 28-29, and decode itself prefetches, so the plain loop alone would give a
// "peak" that decode beats.
template <bool kPrefetch>
__attribute__((target("avx2"))) uint64_t read_sum_avx2(const uint64_t* words, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {   // 128 bytes: two lines
        if constexpr (kPrefetch) {
            const char* line = reinterpret_cast<const char*>(words + i);
            _mm_prefetch(line + kFarPrefetchBytes, _MM_HINT_T1);
            _mm_prefetch(line + kFarPrefetchBytes + 64, _MM_HINT_T1);
            _mm_prefetch(line + kNearPrefetchBytes, _MM_HINT_T0);
            _mm_prefetch(line + kNearPrefetchBytes + 64, _MM_HINT_T0);
        }
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + i + 12)));
    }
    const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
    uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    for (; i < n; ++i) sum += words[i];
    return sum;
}
#endif

bool have_simd() {
#if defined(__x86_64__)
    return cpu_features().avx2;
#else
    return false;
#endif
}

struct FreeDeleter {
    void operator()(uint64_t* p) const { std::free(p); }
};

} // namespace

uint64_t read_sum_scalar(const uint64_t* words, size_t n) {
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += words[i];
        s1 += words[i + 1];
        s2 += words[i + 2];
        s3 += words[i + 3];
    }
    for (; i < n; ++i) s0 += words[i];
    return s0 + s1 + s2 + s3;
}

uint64_t read_sum_simd(const uint64_t* words, size_t n) {
#if defined(__x86_64__)
    if (have_simd()) return read_sum_avx2<false>(words, n);
#endif
    return read_sum_scalar(words, n);
}

uint64_t read_sum_simd_prefetch(const uint64_t* words, size_t n) {
#if defined(__x86_64__)
    if (have_simd()) return read_sum_avx2<true>(words, n);
#endif
    return read_sum_scalar(words, n);
}

uint64_t default_read_probe_bytes() {
    const uint64_t want = std::max<uint64_t>(1024 * kMiB, 4 * last_level_cache_bytes());
    const uint64_t cap = available_memory_bytes() / 4;
    return std::max<uint64_t>(std::min(want, cap), 64 * kMiB) / kPage * kPage;
}

ReadBandwidth measure_read_bandwidth(int n_threads, uint64_t buffer_bytes, int passes, bool scalar) {
    if (passes < 1) throw std::invalid_argument("measure_read_bandwidth: passes must be >= 1");
    if (buffer_bytes == 0) buffer_bytes = default_read_probe_bytes();
    buffer_bytes = buffer_bytes / kPage * kPage;
    if (buffer_bytes < kPage) throw std::invalid_argument("measure_read_bandwidth: buffer must be >= 4 KiB");
    const int nt = n_threads > 0 ? n_threads : cpu_features().physical_cores;

    // 2 MiB alignment lets the kernel back the buffer with huge pages, so the probe measures DRAM
    // and not TLB misses (the weights of a large mapped model get the same treatment from THP).
    const size_t align = 2 * kMiB;
    const size_t alloc_bytes = (buffer_bytes + align - 1) / align * align;
    std::unique_ptr<uint64_t, FreeDeleter> buffer(static_cast<uint64_t*>(std::aligned_alloc(align, alloc_bytes)));
    if (!buffer) throw std::bad_alloc();
#if defined(MADV_HUGEPAGE)
    madvise(buffer.get(), alloc_bytes, MADV_HUGEPAGE);
#endif
    uint64_t* words = buffer.get();
    const size_t n_words = buffer_bytes / sizeof(uint64_t);
    const bool simd = !scalar && have_simd();

    // Slice t of nt: the same static split for the first touch and every pass, so each thread reads
    // pages it wrote (on a NUMA machine they live on its node).
    auto slice = [&](int t, size_t* begin, size_t* end) {
        *begin = n_words * static_cast<size_t>(t) / static_cast<size_t>(nt);
        *end = n_words * static_cast<size_t>(t + 1) / static_cast<size_t>(nt);
    };
#pragma omp parallel num_threads(nt)
    {
        size_t b = 0, e = 0;
        slice(omp_get_thread_num(), &b, &e);
        for (size_t i = b; i < e; ++i) words[i] = i * 0x9E3779B97F4A7C15ull;   // non-zero, distinct pages
    }

    // One series of passes per loop: the plain one (what STREAM measures) and, with SIMD, the prefetching
    // one. The peak is the faster series' best pass.
    enum class Loop { scalar, plain, prefetch };
    auto run_passes = [&](Loop loop) {
        std::vector<double> gbps;
        volatile uint64_t sink = 0;   // keeps the sums (and so the reads) alive
        for (int p = 0; p <= passes; ++p) {   // pass 0 warms the threads and the TLB, untimed
            uint64_t total = 0;
            const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nt) reduction(+ : total)
            {
                size_t b = 0, e = 0;
                slice(omp_get_thread_num(), &b, &e);
                total += loop == Loop::prefetch ? read_sum_simd_prefetch(words + b, e - b)
                         : loop == Loop::plain  ? read_sum_simd(words + b, e - b)
                                                : read_sum_scalar(words + b, e - b);
            }
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            sink = sink + total;
            if (p > 0) gbps.push_back(static_cast<double>(buffer_bytes) / std::max(s, 1e-9) / 1e9);
        }
        (void)sink;
        std::sort(gbps.begin(), gbps.end());
        return gbps;
    };
    const std::vector<double> first = run_passes(simd ? Loop::plain : Loop::scalar);
    const std::vector<double> second = simd ? run_passes(Loop::prefetch) : std::vector<double>{};
    const bool prefetch_won = !second.empty() && second.back() > first.back();
    const std::vector<double>& sorted = prefetch_won ? second : first;

    ReadBandwidth r;
    r.best_gbps = sorted.back();
    r.median_gbps = sorted[sorted.size() / 2];
    r.plain_best_gbps = first.back();
    r.buffer_bytes = buffer_bytes;
    r.n_threads = nt;
    r.passes = passes;
    char buf[200];
    if (simd)
        std::snprintf(buf, sizeof buf, "avx2 read%s, %d thread%s, best of %d passes over %.0f MiB; plain avx2 read %.2f%s",
                      prefetch_won ? " with prefetch" : "", nt, nt == 1 ? "" : "s", passes,
                      static_cast<double>(buffer_bytes) / kMiB, first.back(), prefetch_won ? "" : " (faster than with prefetch)");
    else
        std::snprintf(buf, sizeof buf, "scalar read, %d thread%s, best of %d passes over %.0f MiB", nt, nt == 1 ? "" : "s",
                      passes, static_cast<double>(buffer_bytes) / kMiB);
    r.method = buf;
    return r;
}

} // namespace tern
