// nvcc's half of the same-source check: the emulator's sample kernels, launched through the launcher,
// compiled for the device. The emulator tests compile the same header with g++.
#include "kernels/cuda/launch.h"
#include "tests/cuda_emu/sample_kernels.cuh"

namespace tern::cuda::samples {

void launch_all(cudaStream_t stream, const float* x, float* y, float* sums, const int* xi, int* outi, unsigned* counts,
                int n, const __half* ha, const __half* hb, float* hd, const int8_t* qa, const int8_t* qb, const int* qc,
                int* qd32, int* qd16) {
    launch(block_sum<256>, dim3(8), dim3(256), 0, stream, x, n, sums);
    launch(warp_shuffles, dim3(1), dim3(64), 0, stream, xi, 8, 3, outi);
    launch(saxpy, dim3(4), dim3(128), 0, stream, n, 2.0f, x, y);
    launch(reverse_chunks, dim3((n + 127) / 128), dim3(128), 128 * sizeof(int), stream, xi, n, outi);
    launch(histogram, dim3(4), dim3(128), 0, stream, xi, n, counts);
    launch(mma_tile, dim3(1), dim3(32), 0, stream, ha, hb, hd);
    launch(mma_tile_s8, dim3(1), dim3(32), 0, stream, qa, qb, qc, qd32, qd16);
}

} // namespace tern::cuda::samples
