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
                                    std::to_string(n_in) + " elements (q4_0, q8_0: a multiple of 32; q4_K, q6_K: of 256)");
}

constexpr size_t kQ4KPackedBlock = 64 + 128 + 128 + 2048;

// One packed Q4_K super-block of 16 rows from the rows' blocks (nullptr: a padding row).
void pack_q4_k(const BlockQ4_K* const rows[kPackRows], uint8_t* out) {
    std::memset(out, 0, kQ4KPackedBlock);
    for (int r = 0; r < kPackRows; ++r) {
        const BlockQ4_K* b = rows[r];
        if (!b) continue;
        std::memcpy(out + 2 * r, &b->d, 2);
        std::memcpy(out + 32 + 2 * r, &b->dmin, 2);
        for (int j = 0; j < 8; ++j) {
            uint8_t sc, m;
            q4_k_scale_min(b->scales, j, sc, m);
            out[64 + 16 * j + r] = sc;
            out[192 + 32 * (j / 2) + 2 * r + j % 2] = m;
        }
        for (int i = 0; i < QK_K / 2; ++i) out[320 + (i / 4) * 64 + 4 * r + i % 4] = b->qs[i];
    }
}

void unpack_q4_k(const uint8_t* in, int r, BlockQ4_K* b) {
    std::memcpy(&b->d, in + 2 * r, 2);
    std::memcpy(&b->dmin, in + 32 + 2 * r, 2);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; ++j) {
        sc[j] = in[64 + 16 * j + r];
        m[j] = in[192 + 32 * (j / 2) + 2 * r + j % 2];
    }
    // The 6-bit packing of FORMATS.md §3.4, inverted.
    for (int j = 0; j < 4; ++j) {
        b->scales[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
        b->scales[4 + j] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
        b->scales[8 + j] = static_cast<uint8_t>((sc[j + 4] & 15) | ((m[j + 4] & 15) << 4));
    }
    for (int i = 0; i < QK_K / 2; ++i) b->qs[i] = in[320 + (i / 4) * 64 + 4 * r + i % 4];
}

constexpr size_t kQ6KPackedBlock = 32 + 256 + 2048 + 1024;

// The 256 six-bit codes of a Q6_K block (element order) and back (FORMATS.md §3.5: per 128-element half h,
// ql[64h + l] low nibble = element 128h + l, high nibble = 128h + 64 + l (l < 64); qh[32h + l] bit pair g =
// the top two bits of element 128h + 32g + l (l < 32)).
void q6_k_codes(const BlockQ6_K& b, uint8_t q[QK_K]) {
    for (int e = 0; e < QK_K; ++e) {
        const int h = e / 128, w = e % 128;
        const uint8_t low = w < 64 ? (b.ql[64 * h + w] & 0x0F) : (b.ql[64 * h + w - 64] >> 4);
        const uint8_t high = (b.qh[32 * h + w % 32] >> (2 * (w / 32))) & 3;
        q[e] = static_cast<uint8_t>(low | (high << 4));
    }
}

void q6_k_store(const uint8_t q[QK_K], BlockQ6_K& b) {
    std::memset(b.ql, 0, sizeof b.ql);
    std::memset(b.qh, 0, sizeof b.qh);
    for (int e = 0; e < QK_K; ++e) {
        const int h = e / 128, w = e % 128;
        if (w < 64)
            b.ql[64 * h + w] |= q[e] & 0x0F;
        else
            b.ql[64 * h + w - 64] |= static_cast<uint8_t>((q[e] & 0x0F) << 4);
        b.qh[32 * h + w % 32] |= static_cast<uint8_t>((q[e] >> 4) << (2 * (w / 32)));
    }
}

// Where element e (0..255) of lane r lives in a packed Q6_K super-block: its low nibble (byte, shift) and its
// top two bits (byte, shift). Pair c = e / 64 covers sub-blocks 4c .. 4c + 3.
void q6_k_slots(int e, int r, size_t& lo_byte, int& lo_shift, size_t& hi_byte, int& hi_shift) {
    const int c = e / 64, w = e % 64, half = w / 32, s = (w % 32) / 4, t = w % 4;
    lo_byte = 288 + static_cast<size_t>((8 * c + s) * 64 + 4 * r + t);
    lo_shift = 4 * half;
    hi_byte = 288 + 2048 + static_cast<size_t>((4 * c + s % 4) * 64 + 4 * r + t);
    hi_shift = 4 * half + 2 * (s / 4);
}

void pack_q6_k(const BlockQ6_K* const rows[kPackRows], uint8_t* out) {
    std::memset(out, 0, kQ6KPackedBlock);
    for (int r = 0; r < kPackRows; ++r) {
        const BlockQ6_K* b = rows[r];
        if (!b) continue;
        std::memcpy(out + 2 * r, &b->d, 2);
        for (int j = 0; j < 16; ++j) out[32 + 16 * j + r] = static_cast<uint8_t>(b->scales[j]);
        uint8_t q[QK_K];
        q6_k_codes(*b, q);
        for (int e = 0; e < QK_K; ++e) {
            size_t lb, hb;
            int ls, hs;
            q6_k_slots(e, r, lb, ls, hb, hs);
            out[lb] |= static_cast<uint8_t>((q[e] & 0x0F) << ls);
            out[hb] |= static_cast<uint8_t>((q[e] >> 4) << hs);
        }
    }
}

void unpack_q6_k(const uint8_t* in, int r, BlockQ6_K* b) {
    std::memcpy(&b->d, in + 2 * r, 2);
    for (int j = 0; j < 16; ++j) b->scales[j] = static_cast<int8_t>(in[32 + 16 * j + r]);
    uint8_t q[QK_K];
    for (int e = 0; e < QK_K; ++e) {
        size_t lb, hb;
        int ls, hs;
        q6_k_slots(e, r, lb, ls, hb, hs);
        q[e] = static_cast<uint8_t>(((in[lb] >> ls) & 0x0F) | (((in[hb] >> hs) & 3) << 4));
    }
    q6_k_store(q, *b);
}

} // namespace

bool packable(GgmlType t, int64_t n_in) {
    if (t == GgmlType::Q4_K || t == GgmlType::Q6_K) return n_in > 0 && n_in % QK_K == 0;
    return (t == GgmlType::Q4_0 || t == GgmlType::Q8_0) && n_in > 0 && n_in % 32 == 0;
}

size_t packed_group_bytes(GgmlType t, int64_t n_in) {
    if (t == GgmlType::Q4_K) return static_cast<size_t>(n_in / QK_K) * kQ4KPackedBlock;
    if (t == GgmlType::Q6_K) return static_cast<size_t>(n_in / QK_K) * kQ6KPackedBlock;
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
    const size_t rb = row_bytes(t, n_in);
    const auto* s = static_cast<const uint8_t*>(src);
    auto* d = static_cast<uint8_t*>(dst);
    if (t == GgmlType::Q4_K) {
        const int64_t nsb = n_in / QK_K;
        for (int64_t g = row0 / kPackRows; g * kPackRows < row1; ++g)
            for (int64_t b = 0; b < nsb; ++b) {
                const BlockQ4_K* rows[kPackRows] = {};
                for (int r = 0; r < kPackRows && g * kPackRows + r < n_out; ++r)
                    rows[r] = reinterpret_cast<const BlockQ4_K*>(s + static_cast<size_t>(g * kPackRows + r) * rb) + b;
                pack_q4_k(rows, d + static_cast<size_t>(g) * packed_group_bytes(t, n_in) + static_cast<size_t>(b) * kQ4KPackedBlock);
            }
        return;
    }
    if (t == GgmlType::Q6_K) {
        const int64_t nsb = n_in / QK_K;
        for (int64_t g = row0 / kPackRows; g * kPackRows < row1; ++g)
            for (int64_t b = 0; b < nsb; ++b) {
                const BlockQ6_K* rows[kPackRows] = {};
                for (int r = 0; r < kPackRows && g * kPackRows + r < n_out; ++r)
                    rows[r] = reinterpret_cast<const BlockQ6_K*>(s + static_cast<size_t>(g * kPackRows + r) * rb) + b;
                pack_q6_k(rows, d + static_cast<size_t>(g) * packed_group_bytes(t, n_in) + static_cast<size_t>(b) * kQ6KPackedBlock);
            }
        return;
    }
    const Codes cd = codes_of(t);
    const size_t blk = 2 + cd.qs_bytes;   // the source block: f16 d then the codes
    const int64_t nb = n_in / 32;
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
    const size_t rb = row_bytes(t, n_in);
    const auto* p = static_cast<const uint8_t*>(packed);
    auto* d = static_cast<uint8_t*>(dst);
    if (t == GgmlType::Q4_K) {
        for (int64_t row = 0; row < n_out; ++row)
            for (int64_t b = 0; b < n_in / QK_K; ++b)
                unpack_q4_k(p + static_cast<size_t>(row / kPackRows) * packed_group_bytes(t, n_in) + static_cast<size_t>(b) * kQ4KPackedBlock,
                            static_cast<int>(row % kPackRows),
                            reinterpret_cast<BlockQ4_K*>(d + static_cast<size_t>(row) * rb) + b);
        return;
    }
    if (t == GgmlType::Q6_K) {
        for (int64_t row = 0; row < n_out; ++row)
            for (int64_t b = 0; b < n_in / QK_K; ++b)
                unpack_q6_k(p + static_cast<size_t>(row / kPackRows) * packed_group_bytes(t, n_in) + static_cast<size_t>(b) * kQ6KPackedBlock,
                            static_cast<int>(row % kPackRows),
                            reinterpret_cast<BlockQ6_K*>(d + static_cast<size_t>(row) * rb) + b);
        return;
    }
    const Codes cd = codes_of(t);
    const size_t blk = 2 + cd.qs_bytes;
    const int64_t nb = n_in / 32;
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
