#pragma once
// How far ahead a loop that streams a large buffer once requests each cache line: into L2 kFarPrefetchBytes
// ahead (an L2 miss waits in the L2's deeper queue without holding one of the L1's few fill buffers) and into
// L1 kNearPrefetchBytes ahead (by then it is an L2 hit). Shared by the weight-streaming tiles
// (gemm_packed_avx512.cpp, gemm_packed_avx2.cpp) and the read-bandwidth probe (membw.cpp), so the probe's peak is
// measured the way decode reads. Measured on the 2-core Xeon: bench/results/cpu.md, section 2026-11-22 17:30 UTC
// (tern 57471be; L2 4-16 KiB x L1 0.5-4 KiB swept); on the 2-core Zen 3 no other pair separated from this one
// (same file, section 2026-11-23 07:57 UTC, tern e96bfc9).
#include <algorithm>
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

// Each cache line that holds a byte of [p, p + bytes), once, into L2 only (prefetcht1). The address is literal:
// the caller places it ahead of its reads.
[[gnu::always_inline]] inline void prefetch_lines_l2(const uint8_t* p, size_t bytes) {
    const uintptr_t end = reinterpret_cast<uintptr_t>(p) + bytes;
    for (uintptr_t line = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(63); line < end; line += 64)
        __builtin_prefetch(reinterpret_cast<const uint8_t*>(line), 0, 2);
}

// For a loop that reads n_streams equal streams side by side, each `stream_bytes` long, and then the next run of
// streams right after them (stream i of the next run starts n_streams * stream_bytes after stream i of this one):
// calls piece(p, n) for the bytes [ahead, ahead + bytes) of stream `stream` where, past its end, a stream goes on
// in its successor in the following runs. One piece, or two (three...) where the range crosses a stream's end.
template <typename Piece>
[[gnu::always_inline]] inline void for_each_successor_piece(const uint8_t* stream, size_t stream_bytes, int n_streams, size_t ahead,
                                                            size_t bytes, Piece piece) {
    if (ahead + bytes <= stream_bytes) {   // the usual case, without a division
        piece(stream + ahead, bytes);
        return;
    }
    const size_t skip = static_cast<size_t>(n_streams - 1) * stream_bytes;   // from one stream's end to its successor
    while (bytes > 0) {
        const size_t run = ahead / stream_bytes, in_run = std::min(bytes, (run + 1) * stream_bytes - ahead);
        piece(stream + ahead + run * skip, in_run);
        ahead += in_run;
        bytes -= in_run;
    }
}

// The lines of stream `stream`'s bytes [offset, offset + bytes) kFarPrefetchBytes ahead, into L2 only (once each per
// call; a line two calls share is requested twice), continuing past the stream's end in its successor
// (for_each_successor_piece): so the first 8 KiB of the next run's streams are on their way before it starts (a
// plain address + kFarPrefetchBytes lands in the neighbouring stream, which is read already). In llama-1b's Q4_0
// matrices of n_in 2048 (18 KiB groups, 4 side by side) those starts were a third of the bytes; decode of the
// model's layer matrices, alternated per token in one process, 20 pairs: Q4_0 1.17-1.20x at 1 thread and 1.11x at
// 2, Q8_0 1.06x and 1.04x.
[[gnu::always_inline]] inline void prefetch_streams_far(const uint8_t* stream, size_t stream_bytes, int n_streams, size_t offset,
                                                        size_t bytes) {
    for_each_successor_piece(stream, stream_bytes, n_streams, offset + kFarPrefetchBytes, bytes, prefetch_lines_l2);
}

} // namespace tern
