#pragma once
// Row-interleaved ("panel") copies of F16 and BF16 weight matrices for the CPU's 16-bit GEMM
// (kernels/cpu/gemm_f16.h). Pure functions: 16-bit words in, the same words in another order out, and an
// exact inverse for the tests. The words are never converted, so one layout serves both formats.
//
// Why: in the plain layout a SIMD kernel walks one row's elements, so it must reduce each output's lanes
// horizontally and convert every weight once per activation column it meets. A panel of kF16PanelRows = 16
// rows stored k-major puts element k of the 16 rows in one 32-byte run: one load + one conversion gives a
// vector whose lane r is row r, which is multiplied with one broadcast activation per column, and nothing
// is ever summed across lanes.
//
// Layout: panel p holds rows 16p .. 16p + 15; word (k, r) of panel p at p * 16 * n_in + 16 * k + r. Panels
// follow each other; a last panel with fewer than 16 rows is padded with zero words (+0.0 in both formats).
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace tern {

inline constexpr int kF16PanelRows = 16;

// Whether weights of format t have a panel layout (F16 and BF16, any n_in > 0).
bool panel16_packable(GgmlType t, int64_t n_in);
// Bytes of the panel copy of n_out rows (rounded up to whole panels).
size_t panel16_bytes(int64_t n_out, int64_t n_in);

// src: n_out dense rows of n_in 16-bit words; dst: panel16_bytes(n_out, n_in) bytes. Rows [row0, row1) of
// whole panels only: row0 a multiple of 16, row1 a multiple of 16 or n_out (lets the caller split the work
// over threads). Throws std::invalid_argument on a bad range.
void repack_panel16(const void* src, int64_t n_out, int64_t n_in, void* dst, int64_t row0, int64_t row1);
void repack_panel16(const void* src, int64_t n_out, int64_t n_in, void* dst);
// The inverse: n_out dense rows back from a panel copy (the round-trip test's oracle).
void unpack_panel16(const void* panels, int64_t n_out, int64_t n_in, void* dst);

} // namespace tern
