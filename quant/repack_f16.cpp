// Panel layout of F16 / BF16 matrices (layout in repack_f16.h).
#include "quant/repack_f16.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tern {

bool panel16_packable(GgmlType t, int64_t n_in) {
    return (t == GgmlType::F16 || t == GgmlType::BF16) && n_in > 0;
}

size_t panel16_bytes(int64_t n_out, int64_t n_in) {
    const int64_t panels = (n_out + kF16PanelRows - 1) / kF16PanelRows;
    return static_cast<size_t>(panels) * kF16PanelRows * static_cast<size_t>(n_in) * 2;
}

void repack_panel16(const void* src, int64_t n_out, int64_t n_in, void* dst, int64_t row0, int64_t row1) {
    if (n_in <= 0 || n_out < 0 || row0 < 0 || row0 > row1 || row1 > n_out || row0 % kF16PanelRows != 0 ||
        (row1 % kF16PanelRows != 0 && row1 != n_out))
        throw std::invalid_argument("repack_panel16: rows [" + std::to_string(row0) + ", " + std::to_string(row1) +
                                    ") of " + std::to_string(n_out) + " x " + std::to_string(n_in) +
                                    " are not whole 16-row panels");
    const auto* s = static_cast<const uint16_t*>(src);
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t p0 = row0; p0 < row1; p0 += kF16PanelRows) {
        uint16_t* panel = d + p0 * n_in;   // panel p0 / 16 starts at (p0 / 16) * 16 * n_in words
        const int rows = static_cast<int>(std::min<int64_t>(kF16PanelRows, n_out - p0));
        if (rows < kF16PanelRows) std::memset(panel, 0, static_cast<size_t>(kF16PanelRows * n_in) * 2);
        // Row by row, so the source is read sequentially (the mapped file's pages fault in once, in order).
        for (int r = 0; r < rows; ++r) {
            const uint16_t* row = s + (p0 + r) * n_in;
            for (int64_t k = 0; k < n_in; ++k) panel[k * kF16PanelRows + r] = row[k];
        }
    }
}

void repack_panel16(const void* src, int64_t n_out, int64_t n_in, void* dst) {
    repack_panel16(src, n_out, n_in, dst, 0, n_out);
}

void unpack_panel16(const void* panels, int64_t n_out, int64_t n_in, void* dst) {
    const auto* s = static_cast<const uint16_t*>(panels);
    auto* d = static_cast<uint16_t*>(dst);
    for (int64_t r = 0; r < n_out; ++r) {
        const uint16_t* panel = s + (r / kF16PanelRows) * kF16PanelRows * n_in;
        for (int64_t k = 0; k < n_in; ++k) d[r * n_in + k] = panel[k * kF16PanelRows + r % kF16PanelRows];
    }
}

} // namespace tern
