#pragma once
// Row-interleaved ("packed") copies of Q4_0, Q8_0, Q4_K and Q6_K weight matrices for the CPU's packed matmul
// (kernels/cpu/gemm_packed.h). Pure functions: bytes in, bytes out, and an exact inverse for the tests.
//
// Why: the plain layout keeps each row's blocks together, so a SIMD kernel must reduce one row's lanes
// horizontally and load each block's f16 scale on its own. Interleaving kPackRows = 16 rows puts row r of
// a group in 32-bit lane r of a 512-bit register: one vpdpbusd multiplies 4 elements of 16 rows with the
// same 4 activation bytes (a broadcast), the 16 scales of a block are one 32-byte load, and no horizontal
// sum is ever needed.
//
// Layout of one group of 16 rows (rows g*16 .. g*16+15), block b after block b-1, n_in/32 blocks:
//   Q4_0x16 block (288 bytes = 16 * 18):  d[16] (f16 bits of rows 0..15)
//                                          then chunks s = 0..3 of 64 bytes: row r's qs[4s .. 4s+3] at 4r
//     so lane r of chunk s holds elements 4s..4s+3 in its low nibbles and 16+4s..16+4s+3 in its high ones.
//   Q8_0x16 block (544 bytes = 16 * 34):  d[16], then chunks s = 0..7 of 64 bytes: row r's qs[4s .. 4s+3]
//     XOR 0x80 (the code + 128, as unsigned bytes) at 4r.
//   Q4_Kx16 super-block (2368 bytes = 16 * 144 + 64; 256 elements): d[16], dmin[16] (f16 bits), then
//     scales: sub-block j = 0..7: 16 bytes, row r's 6-bit scale at 16j + r;
//     mins: pair k = 0..3: 32 bytes, row r's mins of sub-blocks 2k, 2k+1 at 32k + 2r, 32k + 2r + 1;
//     codes: c = 0..3, s = 0..7: chunks of 64 bytes, row r's qs[32c + 4s .. 32c + 4s + 3] at 4r, so the low
//     nibbles are elements 64c + 4s.. (sub-block 2c) and the high ones 64c + 32 + 4s.. (sub-block 2c + 1).
//     The scales are unpacked from their 6-bit packing (a bijection, so unpack_rows restores the bytes).
//   Q6_Kx16 super-block (3360 bytes = 16 * 210): d[16], then scales: sub-block j = 0..15: 16 bytes, row r's
//     signed scale at 16j + r (one sign-extending load per sub-block); then low nibbles: c = 0..3, s = 0..7: chunks of 64 bytes,
//     lane r byte t = low4(64c + 4s + t) | low4(64c + 32 + 4s + t) << 4; then top bits: c = 0..3, s' = 0..3:
//     chunks of 64 bytes, lane r byte t holds the top two bits of elements 64c + 4s' + t, 64c + 16 + 4s' + t,
//     64c + 32 + 4s' + t, 64c + 48 + 4s' + t in bit pairs 0-1, 2-3, 4-5, 6-7 (codes 0..63, value q - 32).
// Groups follow each other; a last group with fewer than 16 rows is padded with zero bytes (rows whose
// scale is 0, so their outputs are 0 and are never stored).
#include <cstddef>
#include <cstdint>

#include "quant/types.h"

namespace tern {

inline constexpr int kPackRows = 16;

// Whether a (n_out, n_in) matrix of format t has a packed layout (Q4_0, Q8_0: n_in a multiple of 32;
// Q4_K, Q6_K: of 256).
bool packable(GgmlType t, int64_t n_in);
// Bytes of the packed copy of n_out rows (rounded up to whole groups) and of one group.
size_t packed_group_bytes(GgmlType t, int64_t n_in);
size_t packed_bytes(GgmlType t, int64_t n_out, int64_t n_in);

// src: n_out dense rows of t (row_bytes(t, n_in) each); dst: packed_bytes(t, n_out, n_in) bytes.
// Rows [row0, row1) of whole groups only: row0 and row1 multiples of 16, or row1 = n_out (lets the caller
// split the work over threads).
// Throws std::invalid_argument when !packable(t, n_in).
void repack_rows(GgmlType t, const void* src, int64_t n_out, int64_t n_in, void* dst);
void repack_rows(GgmlType t, const void* src, int64_t n_out, int64_t n_in, void* dst, int64_t row0, int64_t row1);
// The inverse: n_out dense rows back from a packed copy (the round-trip test's oracle).
void unpack_rows(GgmlType t, const void* packed, int64_t n_out, int64_t n_in, void* dst);

} // namespace tern
