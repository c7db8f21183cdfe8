#pragma once
// Kernels written once for both compilers: nvcc builds them in sample_kernels_nvcc.cu (with CUDA on)
// and the emulator tests run them on the CPU. They show the supported idioms: static __shared__
// arrays, dynamic shared memory through tern::cuda::dynamic_shared, _sync warp intrinsics with exact
// masks, grid-stride loops, atomics.
#include "kernels/cuda/mma.h"
#include "kernels/cuda/runtime.h"

namespace tern::cuda::samples {

// Sums x[0, n) into out[blockIdx.x] per block (grid-stride), through a static shared array. BLOCK is
// blockDim.x, a power of two.
template <int BLOCK> __global__ void block_sum(const float* __restrict__ x, int n, float* __restrict__ out) {
    __shared__ float partial[BLOCK];
    float s = 0.0f;
    for (int i = blockIdx.x * BLOCK + threadIdx.x; i < n; i += BLOCK * gridDim.x) s += x[i];
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int stride = BLOCK / 2; stride > 0; stride /= 2) {
        if (static_cast<int>(threadIdx.x) < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

__device__ __forceinline__ int warp_sum_xor(int v, int width) {
    for (int offset = width / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset, width);
    return v;
}

// Per lane of each full warp, at one shuffle width: out[4 * i + 0] the width-segment sum by butterfly,
// [1] the segment sum by shfl_down (valid in the segment's first lane), [2] the inclusive prefix sum
// within the segment by shfl_up, [3] the segment's lane `src` broadcast by shfl (src may exceed width).
__global__ void warp_shuffles(const int* __restrict__ x, int width, int src, int* __restrict__ out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int v = x[i];
    out[4 * i + 0] = warp_sum_xor(v, width);
    int down = v;
    for (int offset = width / 2; offset > 0; offset /= 2) down += __shfl_down_sync(0xFFFFFFFFu, down, offset, width);
    out[4 * i + 1] = down;
    int scan = v;
    for (int offset = 1; offset < width; offset *= 2) {
        const int up = __shfl_up_sync(0xFFFFFFFFu, scan, offset, width);
        if (static_cast<int>(threadIdx.x % width) >= offset) scan += up;
    }
    out[4 * i + 2] = scan;
    out[4 * i + 3] = __shfl_sync(0xFFFFFFFFu, v, src, width);
}

// y = a * x + y over n elements with a grid-stride loop (any grid and block size).
__global__ void saxpy(int n, float a, const float* __restrict__ x, float* __restrict__ y) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) y[i] = a * x[i] + y[i];
}

// Reverses each block's chunk of blockDim.x ints through dynamic shared memory (blockDim.x ints of it).
__global__ void reverse_chunks(const int* __restrict__ in, int n, int* __restrict__ out) {
    int* chunk = tern::cuda::dynamic_shared<int>();
    const int base = blockIdx.x * blockDim.x;
    const int len = min(static_cast<int>(blockDim.x), n - base);
    if (static_cast<int>(threadIdx.x) < len) chunk[threadIdx.x] = in[base + threadIdx.x];
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < len) out[base + threadIdx.x] = chunk[len - 1 - threadIdx.x];
}

// Counts, per value in [0, bins), how many of x[0, n) equal it, in global memory from every block.
__global__ void histogram(const int* __restrict__ x, int n, unsigned* __restrict__ counts) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        atomicAdd(&counts[x[i]], 1u);
}

// One warp: d (16x8, row-major f32) = a (16x16 row-major halves, staged in shared memory and loaded with
// ldmatrix) times b (16x8 row-major halves) through one tensor-core mma.
__global__ void mma_tile(const __half* __restrict__ a, const __half* __restrict__ b, float* __restrict__ d) {
    __shared__ __align__(16) __half a_tile[16 * 16];
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (unsigned i = lane; i < 256; i += 32) a_tile[i] = a[i];
    __syncwarp();
    uint32_t af[4];
    ldmatrix_x4(af, &a_tile[(lane % 16) * 16 + (lane / 16) * 8]);
    auto pack = [](__half lo, __half hi) {
        return static_cast<uint32_t>(__half_as_ushort(lo)) | (static_cast<uint32_t>(__half_as_ushort(hi)) << 16);
    };
    const uint32_t bf[2] = {pack(b[(2 * t) * 8 + g], b[(2 * t + 1) * 8 + g]),
                            pack(b[(2 * t + 8) * 8 + g], b[(2 * t + 9) * 8 + g])};
    const float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float out[4];
    mma_m16n8k16_f32_f16(out, af, bf, c);
    d[g * 8 + 2 * t] = out[0];
    d[g * 8 + 2 * t + 1] = out[1];
    d[(g + 8) * 8 + 2 * t] = out[2];
    d[(g + 8) * 8 + 2 * t + 1] = out[3];
}

// One warp: d (16x8, row-major f32) = a (16x16 row-major halves) times b (16x16 row-major halves, staged in
// shared memory and loaded with ldmatrix_x4_trans as the B fragments of two 8-column tiles), columns 0..7 of
// b in d's first 8 columns' tile d0 and columns 8..15 in d1: each 16x8 row-major f32.
__global__ void mma_tile_trans(const __half* __restrict__ a, const __half* __restrict__ b, float* __restrict__ d0,
                               float* __restrict__ d1) {
    __shared__ __align__(16) __half a_tile[16 * 16];
    __shared__ __align__(16) __half b_tile[16 * 16];
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (unsigned i = lane; i < 256; i += 32) a_tile[i] = a[i], b_tile[i] = b[i];
    __syncwarp();
    uint32_t af[4], bf[4];
    ldmatrix_x4(af, &a_tile[(lane % 16) * 16 + (lane / 16) * 8]);
    // Matrices: (k 0..7, n 0..7), (k 8..15, n 0..7), (k 0..7, n 8..15), (k 8..15, n 8..15).
    ldmatrix_x4_trans(bf, &b_tile[(lane % 8 + 8 * (lane / 8 % 2)) * 16 + 8 * (lane / 16)]);
    const float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int half = 0; half < 2; ++half) {
        float out[4];
        mma_m16n8k16_f32_f16(out, af, bf + 2 * half, c);
        float* d = half ? d1 : d0;
        d[g * 8 + 2 * t] = out[0];
        d[g * 8 + 2 * t + 1] = out[1];
        d[(g + 8) * 8 + 2 * t] = out[2];
        d[(g + 8) * 8 + 2 * t + 1] = out[3];
    }
}

// One warp: d32 (16x8 row-major s32) = a (16x32 row-major s8, staged in shared memory and loaded with
// ldmatrix) times b (32x8 row-major s8) plus c (16x8 s32) through one int8 mma.m16n8k32, and d16 the same
// over k 0 .. 15 only through one mma.m16n8k16 (the first halves of the k32 fragments).
__global__ void mma_tile_s8(const int8_t* __restrict__ a, const int8_t* __restrict__ b, const int* __restrict__ c,
                            int* __restrict__ d32, int* __restrict__ d16) {
    __shared__ __align__(16) int8_t a_tile[16 * 32];
    const unsigned lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (unsigned i = lane; i < 16 * 32; i += 32) a_tile[i] = a[i];
    __syncwarp();
    // Matrix i = lane / 8: rows 8 (i % 2) .. +7, bytes 16 (i / 2) .. +15, giving a[0] .. a[3] in order.
    uint32_t af[4];
    ldmatrix_x4(af, &a_tile[(lane % 8 + 8 * (lane / 8 % 2)) * 32 + 16 * (lane / 16)]);
    auto column_word = [&](unsigned k0) {   // B[k0 .. k0+3][g], the lower k in the lower byte
        uint32_t w = 0;
        for (unsigned i = 0; i < 4; ++i)
            w |= static_cast<uint32_t>(static_cast<uint8_t>(b[(k0 + i) * 8 + g])) << (8 * i);
        return w;
    };
    const uint32_t bf[2] = {column_word(4 * t), column_word(16 + 4 * t)};
    const int cf[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    int out[4];
    mma_m16n8k32_s32_s8(out, af, bf, cf);
    d32[g * 8 + 2 * t] = out[0];
    d32[g * 8 + 2 * t + 1] = out[1];
    d32[(g + 8) * 8 + 2 * t] = out[2];
    d32[(g + 8) * 8 + 2 * t + 1] = out[3];
    mma_m16n8k16_s32_s8(out, af, bf[0], cf);
    d16[g * 8 + 2 * t] = out[0];
    d16[g * 8 + 2 * t + 1] = out[1];
    d16[(g + 8) * 8 + 2 * t] = out[2];
    d16[(g + 8) * 8 + 2 * t + 1] = out[3];
}

} // namespace tern::cuda::samples
