#pragma once
// Tensor-core fragments through tern wrappers: inline PTX under nvcc (sm_80 and later), and under the
// emulator the same fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16" and "ldmatrix")
// rebuilt from warp shuffles, so kernels using them run in the emulator tests unchanged. Every lane of
// the warp must call them together (they are .sync.aligned on the device).
//
// mma_m16n8k16_f32_f16 needs sm_80 or later (on sm_75 it traps); ldmatrix_x4 needs sm_75.
// Layouts, with g = lane / 4 and t = lane % 4:
//   A (16x16 f16, row-major), a[4] of two halves each: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//       a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9] (the lower column in the low half);
//   B (16x8 f16, "col"), b[2]: b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
//   C, D (16x8 f32), c[4]: c[0], c[1] = C[g][2t, 2t+1]; c[2], c[3] = C[g+8][2t, 2t+1].
// The device accumulates in f32 in an unspecified order: compare results by tolerance.
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

#if defined(TERN_CUDA_EMULATOR)
namespace detail {
inline float half_lo(uint32_t v) { return __half2float(__ushort_as_half(static_cast<unsigned short>(v & 0xFFFFu))); }
inline float half_hi(uint32_t v) { return __half2float(__ushort_as_half(static_cast<unsigned short>(v >> 16))); }
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

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
