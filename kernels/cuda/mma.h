#pragma once
// Tensor-core fragments through tern wrappers: inline PTX under nvcc (sm_80 and later), and under the
// emulator the same fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16", "... for mma.m16n8k32"
// and "ldmatrix") rebuilt from warp shuffles, so kernels using them run in the emulator tests unchanged.
// Every lane of the warp must call them together (they are .sync.aligned on the device).
//
// The mma wrappers need sm_80 or later (on sm_75 they trap); ldmatrix_x4 and ldmatrix_x4_trans need sm_75.
// Layouts, with g = lane / 4 and t = lane % 4:
//   mma_m16n8k16_f32_f16:
//     A (16x16 f16, row-major), a[4] of two halves each: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//       a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9] (the lower column in the low half);
//     B (16x8 f16, "col"), b[2]: b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
//     C, D (16x8 f32), c[4]: c[0], c[1] = C[g][2t, 2t+1]; c[2], c[3] = C[g+8][2t, 2t+1].
//     The device accumulates in f32 in an unspecified order: compare results by tolerance.
//   mma_m16n8k32_s32_s8 (four signed bytes a word, the lower column / row in the lower byte):
//     A (16x32 s8, row-major), a[4]: a[0] = A[g][4t .. 4t+3], a[1] = A[g+8][4t .. 4t+3],
//       a[2] = A[g][16+4t .. 16+4t+3], a[3] = A[g+8][16+4t .. 16+4t+3];
//     B (32x8 s8, "col"), b[2]: b[0] = B[4t .. 4t+3][g], b[1] = B[16+4t .. 16+4t+3][g];
//     C, D (16x8 s32), c[4]: as the f32 accumulators above.
//   mma_m16n8k16_s32_s8: the first half of the k32 shape: A (16x16) a[0], a[1]; B (16x8) b = B[4t .. 4t+3][g];
//     C, D as above. So a k32 fragment is two k16 fragments: {a[0], a[1]} x b[0] covers k 0 .. 15 and
//     {a[2], a[3]} x b[1] covers k 16 .. 31.
//   The integer products are exact; sums wrap modulo 2^32 (no .satfinite).
//   ldmatrix_x4 loads s8 fragments too: 16-byte rows hold 16 codes, and lane (g, t) receives bytes
//   4t .. 4t+3 of row g of each matrix, the layout of every A and B register above.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

#if defined(TERN_CUDA_EMULATOR)
namespace detail {
inline float half_lo(uint32_t v) { return __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xFFFFu))); }
inline float half_hi(uint32_t v) { return __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16))); }
// Sum of the four signed-byte products of two words.
inline int64_t dot_s8x4(uint32_t a, uint32_t b) {
    int64_t s = 0;
    for (int i = 0; i < 4; ++i)
        s += static_cast<int64_t>(static_cast<int8_t>(a >> (8 * i))) * static_cast<int8_t>(b >> (8 * i));
    return s;
}
inline int wrap_s32(int64_t v) { return static_cast<int>(static_cast<uint32_t>(static_cast<uint64_t>(v))); }
inline uint64_t pack_words(uint32_t lo, uint32_t hi) { return lo | static_cast<uint64_t>(hi) << 32; }
} // namespace detail
#endif

// D = A * B + C for one 16x16 (A) by 16x8 (B) tile in f16 with f32 accumulation.
__device__ __forceinline__ void mma_m16n8k16_f32_f16(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                     const float c[4]) {
#if defined(TERN_CUDA_EMULATOR)
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float acc[4] = {c[0], c[1], c[2], c[3]};
    for (unsigned j = 0; j < 4; ++j) {
        // Lane 4g + j holds A's rows g and g+8 at columns 2j, 2j+1 (a[0], a[1]) and 2j+8, 2j+9 (a[2], a[3]);
        // lane 4n + j holds B's column n at rows 2j, 2j+1 (b[0]) and 2j+8, 2j+9 (b[1]).
        uint32_t ar[4], b0[2], b1[2];
        for (int r = 0; r < 4; ++r) ar[r] = __shfl_sync(0xFFFFFFFFu, a[r], static_cast<int>(4 * g + j));
        for (int r = 0; r < 2; ++r) {
            b0[r] = __shfl_sync(0xFFFFFFFFu, b[r], static_cast<int>(4 * (2 * t) + j));
            b1[r] = __shfl_sync(0xFFFFFFFFu, b[r], static_cast<int>(4 * (2 * t + 1) + j));
        }
        for (int half = 0; half < 2; ++half) {   // k = 2j + {0,1} (registers 0, 1) and 2j + 8 + {0,1} (2, 3)
            const uint32_t row_g = ar[2 * half], row_g8 = ar[2 * half + 1];
            const float bk0_n0 = detail::half_lo(b0[half]), bk1_n0 = detail::half_hi(b0[half]);
            const float bk0_n1 = detail::half_lo(b1[half]), bk1_n1 = detail::half_hi(b1[half]);
            acc[0] += detail::half_lo(row_g) * bk0_n0 + detail::half_hi(row_g) * bk1_n0;
            acc[1] += detail::half_lo(row_g) * bk0_n1 + detail::half_hi(row_g) * bk1_n1;
            acc[2] += detail::half_lo(row_g8) * bk0_n0 + detail::half_hi(row_g8) * bk1_n0;
            acc[3] += detail::half_lo(row_g8) * bk0_n1 + detail::half_hi(row_g8) * bk1_n1;
        }
    }
    for (int i = 0; i < 4; ++i) d[i] = acc[i];
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // m16n8k16 needs sm_80; sm_75 builds compile but must not take this path.
    (void)d, (void)a, (void)b, (void)c;
    __trap();
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
                   "f"(c[3]));
#endif
}

// D = A * B + C for one 16x32 (A) by 32x8 (B) tile of signed bytes with s32 accumulation.
__device__ __forceinline__ void mma_m16n8k32_s32_s8(int d[4], const uint32_t a[4], const uint32_t b[2],
                                                    const int c[4]) {
#if defined(TERN_CUDA_EMULATOR)
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int64_t acc[4] = {c[0], c[1], c[2], c[3]};
    // Two registers a shuffle: 16 shuffles instead of 32.
    const uint64_t a01 = detail::pack_words(a[0], a[1]), a23 = detail::pack_words(a[2], a[3]);
    const uint64_t b01 = detail::pack_words(b[0], b[1]);
    for (unsigned j = 0; j < 4; ++j) {
        // Lane 4g + j holds A's rows g and g+8 at k 4j .. 4j+3 (a[0], a[1]) and 16+4j .. (a[2], a[3]);
        // lane 4n + j holds B's column n at k 4j .. 4j+3 (b[0]) and 16+4j .. (b[1]).
        const uint64_t lo = __shfl_sync(0xFFFFFFFFu, a01, static_cast<int>(4 * g + j));
        const uint64_t hi = __shfl_sync(0xFFFFFFFFu, a23, static_cast<int>(4 * g + j));
        const uint64_t n0 = __shfl_sync(0xFFFFFFFFu, b01, static_cast<int>(4 * (2 * t) + j));
        const uint64_t n1 = __shfl_sync(0xFFFFFFFFu, b01, static_cast<int>(4 * (2 * t + 1) + j));
        const uint32_t row_g[2] = {static_cast<uint32_t>(lo), static_cast<uint32_t>(hi)};
        const uint32_t row_g8[2] = {static_cast<uint32_t>(lo >> 32), static_cast<uint32_t>(hi >> 32)};
        const uint32_t col_0[2] = {static_cast<uint32_t>(n0), static_cast<uint32_t>(n0 >> 32)};
        const uint32_t col_1[2] = {static_cast<uint32_t>(n1), static_cast<uint32_t>(n1 >> 32)};
        for (int half = 0; half < 2; ++half) {   // k = 4j + {0..3} and 16 + 4j + {0..3}
            acc[0] += detail::dot_s8x4(row_g[half], col_0[half]);
            acc[1] += detail::dot_s8x4(row_g[half], col_1[half]);
            acc[2] += detail::dot_s8x4(row_g8[half], col_0[half]);
            acc[3] += detail::dot_s8x4(row_g8[half], col_1[half]);
        }
    }
    for (int i = 0; i < 4; ++i) d[i] = detail::wrap_s32(acc[i]);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // The integer m16n8 shapes need sm_80; sm_75 builds compile but must not take this path.
    (void)d, (void)a, (void)b, (void)c;
    __trap();
#else
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%10, %11, %12, %13};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "r"(c[0]), "r"(c[1]), "r"(c[2]),
                   "r"(c[3]));
#endif
}

// D = A * B + C for one 16x16 (A) by 16x8 (B) tile of signed bytes with s32 accumulation.
__device__ __forceinline__ void mma_m16n8k16_s32_s8(int d[4], const uint32_t a[2], uint32_t b, const int c[4]) {
#if defined(TERN_CUDA_EMULATOR)
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int64_t acc[4] = {c[0], c[1], c[2], c[3]};
    const uint64_t a01 = detail::pack_words(a[0], a[1]);
    for (unsigned j = 0; j < 4; ++j) {
        // Lane 4g + j holds A's rows g and g+8 at k 4j .. 4j+3; lane 4n + j holds B's column n there.
        const uint64_t rows = __shfl_sync(0xFFFFFFFFu, a01, static_cast<int>(4 * g + j));
        const uint32_t col_0 = __shfl_sync(0xFFFFFFFFu, b, static_cast<int>(4 * (2 * t) + j));
        const uint32_t col_1 = __shfl_sync(0xFFFFFFFFu, b, static_cast<int>(4 * (2 * t + 1) + j));
        const auto row_g = static_cast<uint32_t>(rows), row_g8 = static_cast<uint32_t>(rows >> 32);
        acc[0] += detail::dot_s8x4(row_g, col_0);
        acc[1] += detail::dot_s8x4(row_g, col_1);
        acc[2] += detail::dot_s8x4(row_g8, col_0);
        acc[3] += detail::dot_s8x4(row_g8, col_1);
    }
    for (int i = 0; i < 4; ++i) d[i] = detail::wrap_s32(acc[i]);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    (void)d, (void)a, (void)b, (void)c;
    __trap();
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
                 "{%7, %8, %9, %10};\n"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]));
#endif
}

// ldmatrix .x4 of 16-bit elements: lanes 8i .. 8i+7 give the addresses of matrix i's eight rows (16
// bytes each, in shared memory); every lane receives r[i] = matrix i's row lane / 4, elements
// 2 (lane % 4) and 2 (lane % 4) + 1 (the lower in the low half).
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void* row_address) {
#if defined(TERN_CUDA_EMULATOR)
    const unsigned lane = threadIdx.x % 32;
    for (int i = 0; i < 4; ++i) {
        const auto* row = static_cast<const unsigned char*>(
            __shfl_sync(0xFFFFFFFFu, row_address, static_cast<int>(8 * i + lane / 4)));
        uint32_t v;
        __builtin_memcpy(&v, row + 4 * (lane % 4), 4);
        r[i] = v;
    }
#else
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#endif
}

// ldmatrix .x4 .trans of 16-bit elements: addresses as ldmatrix_x4, but every lane receives matrix i
// transposed: r[i] = matrix i's elements (row 2 (lane % 4), column lane / 4) in the low half and (row
// 2 (lane % 4) + 1, column lane / 4) in the high half. A row-major (k, n) tile in shared memory (rows of
// keys, say) so gives the "col" B fragments of mma_m16n8k16_f32_f16 without a transposed copy.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void* row_address) {
#if defined(TERN_CUDA_EMULATOR)
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const auto* row_lo = static_cast<const unsigned char*>(
            __shfl_sync(0xFFFFFFFFu, row_address, static_cast<int>(8 * i + 2 * t)));
        const auto* row_hi = static_cast<const unsigned char*>(
            __shfl_sync(0xFFFFFFFFu, row_address, static_cast<int>(8 * i + 2 * t + 1)));
        uint16_t lo, hi;
        __builtin_memcpy(&lo, row_lo + 2 * g, 2);
        __builtin_memcpy(&hi, row_hi + 2 * g, 2);
        r[i] = lo | static_cast<uint32_t>(hi) << 16;
    }
#else
    const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(row_address));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
#endif
}

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
