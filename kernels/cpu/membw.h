#pragma once
// A STREAM-like probe of the memory read bandwidth this machine gives a given number of threads:
// the ceiling `tern bench` compares decode against (decode reads every weight once per token, so
// its GB/s over this peak says how much of the memory system a token uses).
#include <cstddef>
#include <cstdint>
#include <string>

namespace tern {

struct ReadBandwidth {
    double best_gbps = 0;     // the fastest pass, in 1e9 bytes/s (STREAM reports the best, too)
    double median_gbps = 0;   // the middle pass of the same loop, to show how noisy the machine was
    double plain_best_gbps = 0;   // the plain loop's best pass (what STREAM would report)
    uint64_t buffer_bytes = 0;
    int n_threads = 0;
    int passes = 0;
    std::string method;       // "avx2 read, 2 threads, best of 5 passes over 1040 MiB"
};

// The buffer the probe reads by default: at least 1 GiB and 4x the last-level cache (a buffer the
// cache could hold would measure the cache), but at most a quarter of the available memory.
uint64_t default_read_probe_bytes();

// Each of n_threads OpenMP threads (0 = physical cores) sums its own contiguous slice of a buffer
// of buffer_bytes (rounded down to 4 KiB; 0 = default_read_probe_bytes()) that was first written by
// the same thread; after one untimed pass, `passes` timed passes. With AVX2 that is done twice, with the
// plain loop and with the prefetching one, and the faster loop's best and median are returned (a memory
// system that software prefetch reads faster has that higher peak). `scalar` forces the portable loop.
// Throws std::invalid_argument for passes < 1 or a buffer under 4 KiB.
ReadBandwidth measure_read_bandwidth(int n_threads, uint64_t buffer_bytes = 0, int passes = 5, bool scalar = false);

// The per-thread read loops, exposed so the tests can hold the SIMD one against its scalar twin:
// the wrapping sum of n 64-bit words. read_sum_simd falls back to the scalar loop without AVX2.
uint64_t read_sum_scalar(const uint64_t* words, size_t n);
uint64_t read_sum_simd(const uint64_t* words, size_t n);
uint64_t read_sum_simd_prefetch(const uint64_t* words, size_t n);   // the same sum, lines prefetched ahead

} // namespace tern
