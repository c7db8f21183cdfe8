// Row interleaving of Q4_0 / Q8_0 matrices (layout in repack.h).
#include "quant/repack.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "quant/blocks.h"

namespace tern {
namespace {

// Bytes of codes per block and the XOR applied to each code byte in the packed copy.
struct Codes {
    size_t qs_bytes;
    uint8_t flip;
};

Codes codes_of(GgmlType t) {
    return t == GgmlType::Q4_0 ? Codes{QK4_0 / 2, 0x00} : Codes{QK8_0, 0x80};
}

void check(GgmlType t, int64_t n_in, const char* fn) {
    if (!packable(t, n_in))
        throw std::invalid_argument(std::string(fn) + ": no packed layout for " + std::string(type_name(t)) + " rows of " +
                                    std::to_string(n_in) + " elements (q4_0 or q8_0, a multiple of 32)");
}

} // namespace

bool packable(GgmlType t, int64_t n_in) {
    return (t == GgmlType::Q4_0 || t == GgmlType::Q8_0) && n_in > 0 && n_in % 32 == 0;
}

size_t packed_group_bytes(GgmlType t, int64_t n_in) {
    return static_cast<size_t>(kPackRows) * row_bytes(t, n_in);
}

size_t packed_bytes(GgmlType t, int64_t n_out, int64_t n_in) {
    const int64_t groups = (n_out + kPackRows - 1) / kPackRows;
    return static_cast<size_t>(groups) * packed_group_bytes(t, n_in);
}

void repack_rows(GgmlType t, const void* src, int64_t n_out, int64_t n_in, void* dst) {
    repack_rows(t, src, n_out, n_in, dst, 0, n_out);
}

void repack_rows(GgmlType t, const void* src, int64_t n_out, int64_t n_in, void* dst, int64_t row0, int64_t row1) {
    check(t, n_in, "repack_rows");
    if (row0 % kPackRows != 0 || (row1 % kPackRows != 0 && row1 != n_out) || row0 < 0 || row1 > n_out || row0 > row1)
        throw std::invalid_argument("repack_rows: row range [" + std::to_string(row0) + ", " + std::to_string(row1) +
                                    ") is not whole groups of " + std::to_string(kPackRows) + " inside " +
                                    std::to_string(n_out) + " rows");
    const Codes cd = codes_of(t);
    const size_t blk = 2 + cd.qs_bytes;   // the source block: f16 d then the codes
    const size_t rb = row_bytes(t, n_in);
    const int64_t nb = n_in / 32;
    const auto* s = static_cast<const uint8_t*>(src);
    auto* d = static_cast<uint8_t*>(dst);
    for (int64_t g = row0 / kPackRows; g * kPackRows < row1; ++g) {
        uint8_t* out = d + static_cast<size_t>(g) * packed_group_bytes(t, n_in);
        for (int64_t b = 0; b < nb; ++b, out += kPackRows * blk) {
            std::memset(out, 0, kPackRows * blk);
            for (int r = 0; r < kPackRows; ++r) {
                const int64_t row = g * kPackRows + r;
                if (row >= n_out) break;
                const uint8_t* in = s + static_cast<size_t>(row) * rb + static_cast<size_t>(b) * blk;
                std::memcpy(out + 2 * r, in, 2);
                for (size_t i = 0; i < cd.qs_bytes; ++i) {
                    const size_t chunk = i / 4, byte = i % 4;
                    out[2 * kPackRows + chunk * 4 * kPackRows + 4 * r + byte] = in[2 + i] ^ cd.flip;
                }
            }
        }
    }
}

void unpack_rows(GgmlType t, const void* packed, int64_t n_out, int64_t n_in, void* dst) {
    check(t, n_in, "unpack_rows");
    const Codes cd = codes_of(t);
    const size_t blk = 2 + cd.qs_bytes;
    const size_t rb = row_bytes(t, n_in);
    const int64_t nb = n_in / 32;
    const auto* p = static_cast<const uint8_t*>(packed);
    auto* d = static_cast<uint8_t*>(dst);
    for (int64_t row = 0; row < n_out; ++row) {
        const int64_t g = row / kPackRows;
        const int r = static_cast<int>(row % kPackRows);
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* in = p + static_cast<size_t>(g) * packed_group_bytes(t, n_in) + static_cast<size_t>(b) * kPackRows * blk;
            uint8_t* out = d + static_cast<size_t>(row) * rb + static_cast<size_t>(b) * blk;
            std::memcpy(out, in + 2 * r, 2);
            for (size_t i = 0; i < cd.qs_bytes; ++i)
                out[2 + i] = in[2 * kPackRows + (i / 4) * 4 * kPackRows + 4 * r + i % 4] ^ cd.flip;
        }
    }
}

} // namespace tern
