#pragma once
// How far ahead a loop that streams a large buffer once requests each cache line: into L2 kFarPrefetchBytes
// ahead (an L2 miss waits in the L2's deeper queue without holding one of the L1's few fill buffers) and into
// L1 kNearPrefetchBytes ahead (by then it is an L2 hit). Shared by the weight-streaming tiles
// (gemm_packed_avx512.cpp) and the read-bandwidth probe (membw.cpp), so the probe's peak is measured the way
// decode reads. Measured on the 2-core Xeon: bench/results/cpu-2026-11-22-s5.md (L2 4-16 KiB x L1 0.5-4 KiB swept).
#include <cstddef>

namespace tern {

constexpr size_t kFarPrefetchBytes = 8192;
constexpr size_t kNearPrefetchBytes = 2048;

} // namespace tern
