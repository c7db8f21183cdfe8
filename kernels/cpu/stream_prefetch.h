#pragma once
// How far ahead a loop that streams a large buffer once requests each cache line: into L2 kFarPrefetchBytes
// ahead (an L2 miss waits in the L2's deeper queue without holding one of the L1's few fill buffers) and into
// L1 kNearPrefetchBytes ahead (by then it is an L2 hit). Shared by the weight-streaming tiles
// (gemm_packed_avx512.cpp, gemm_packed_avx2.cpp) and the read-bandwidth probe (membw.cpp), so the probe's peak is
// measured the way decode reads. Measured on the 2-core Xeon: bench/results/cpu-2026-11-22-s5.md (L2 4-16 KiB x
// L1 0.5-4 KiB swept); on the 2-core Zen 3 no other pair separated from this one (cpu-2026-11-23-s9.md).
#include <cstddef>
#include <cstdint>

namespace tern {

constexpr size_t kFarPrefetchBytes = 8192;
constexpr size_t kNearPrefetchBytes = 2048;

// Requests the line at `line` both distances ahead: into L2 (prefetcht1) and into L1 (prefetcht0). The hints
// are literal constants (gcc rejects a hint it cannot fold, as in an -O1 sanitizer build). Always inlined: the
// per-ISA files include this, and no out-of-line copy built with one file's flags may serve another.
[[gnu::always_inline]] inline void prefetch_ahead(const uint8_t* line) {
    __builtin_prefetch(line + kFarPrefetchBytes, 0, 2);
    __builtin_prefetch(line + kNearPrefetchBytes, 0, 3);
}

// Every cache line of [p, p + bytes), both distances ahead.
[[gnu::always_inline]] inline void prefetch_range_ahead(const uint8_t* p, size_t bytes) {
    for (size_t o = 0; o < bytes; o += 64) prefetch_ahead(p + o);
}

// Each cache line that holds a byte of [p, p + bytes), once, into L2 only, kFarPrefetchBytes ahead: for a loop that
// reads several streams side by side, where the L1 requests cost more than they save (gemm_packed_avx2.cpp).
[[gnu::always_inline]] inline void prefetch_lines_far(const uint8_t* p, size_t bytes) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
    for (uintptr_t line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63); line < end; line += 64)
        __builtin_prefetch(reinterpret_cast<const uint8_t*>(line) + kFarPrefetchBytes, 0, 2);
}

} // namespace tern
