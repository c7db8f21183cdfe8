// The GPU's measured memory bandwidth, the ceiling tern's decode GB/s is put against (bench/gpu_check.sh
// compiles and runs it: nvcc -O3 -arch=sm_XX bench/cuda_copy_bandwidth.cu). A standalone program: it uses
// nothing of tern's.
//
//   cuda_copy_bandwidth [GiB per buffer, default 2] [timed repetitions, default 10]
//
// Two measurements on buffers far larger than the L2 cache, each the best (and the median) of the timed
// repetitions after two warm-ups, timed with CUDA events:
//   copy: cudaMemcpy device to device of the buffer. GB/s = (bytes read + bytes written) / time, i.e.
//         2 x buffer bytes / time: the usual convention for a copy (and the one METHOD notes use).
//   read: a kernel that only reads the buffer (16-byte loads, several in flight per thread) and sums it.
//         GB/s = bytes read / time. Decode reads weights and writes almost nothing, so this is the ceiling
//         closest to what `tern bench` reports as decode GB/s; the copy figure is the conventional one.
// The buffer holds a non-zero pattern and the read kernel's sum is checked against it, so a kernel that
// skipped data would fail instead of looking fast. The last line of stdout is one JSON object.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        std::fprintf(stderr, "cuda_copy_bandwidth: %s: %s\n", what, cudaGetErrorString(e));
        std::exit(1);
    }
}

// Sums every 32-bit word of `words16` (16-byte vectors) into *out; four independent loads per thread per
// iteration keep enough bytes in flight to saturate HBM.
__global__ void read_sum(const uint4* __restrict__ words16, size_t n16, unsigned* out) {
    const size_t stride = size_t(gridDim.x) * blockDim.x;
    size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    unsigned s = 0;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = words16[i], b = words16[i + stride], c = words16[i + 2 * stride], d = words16[i + 3 * stride];
        s += a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w + c.x + c.y + c.z + c.w + d.x + d.y + d.z + d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = words16[i];
        s += a.x + a.y + a.z + a.w;
    }
    for (int offset = 16; offset > 0; offset /= 2) s += __shfl_down_sync(0xffffffffu, s, offset);
    if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

struct Stats {
    double best_ms, median_ms;
};

template <typename Run> Stats time_runs(int reps, Run run) {
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    for (int w = 0; w < 2; ++w) run();
    check(cudaDeviceSynchronize(), "warm-up");
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
        check(cudaEventRecord(start), "cudaEventRecord");
        run();
        check(cudaEventRecord(stop), "cudaEventRecord");
        check(cudaEventSynchronize(stop), "cudaEventSynchronize");
        float t = 0;
        check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
        ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    std::sort(ms.begin(), ms.end());
    return {ms.front(), ms[ms.size() / 2]};
}

} // namespace

int main(int argc, char** argv) {
    const double gib = argc > 1 ? std::atof(argv[1]) : 2.0;
    const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
    if (!(gib > 0 && gib <= 64) || reps < 1) {
        std::fprintf(stderr, "usage: cuda_copy_bandwidth [GiB per buffer, 0-64, default 2] [repetitions >= 1]\n");
        return 2;
    }
    const size_t bytes = size_t(gib * 1024 * 1024 * 1024) / 64 * 64;

    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");

    void *src = nullptr, *dst = nullptr;
    unsigned* sum = nullptr;
    check(cudaMalloc(&src, bytes), "cudaMalloc (source)");
    check(cudaMalloc(&dst, bytes), "cudaMalloc (destination)");
    check(cudaMalloc(&sum, sizeof(unsigned)), "cudaMalloc (sum)");
    const unsigned pattern = 0x5A5A5A5Au;
    check(cudaMemset(src, 0x5A, bytes), "cudaMemset");
    check(cudaMemset(dst, 0xA5, bytes), "cudaMemset");

    const Stats copy =
        time_runs(reps, [&] { check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy"); });

    const size_t n16 = bytes / 16;
    const int threads = 256, blocks = prop.multiProcessorCount * 8;
    const Stats read = time_runs(reps, [&] {
        check(cudaMemsetAsync(sum, 0, sizeof(unsigned)), "cudaMemsetAsync");
        read_sum<<<blocks, threads>>>(static_cast<const uint4*>(dst), n16, sum);
        check(cudaGetLastError(), "read_sum launch");
    });
    unsigned got = 0;
    check(cudaMemcpy(&got, sum, sizeof got, cudaMemcpyDeviceToHost), "cudaMemcpy (sum)");
    const unsigned want = static_cast<unsigned>((bytes / 4) * uint64_t(pattern));   // mod 2^32, like the kernel
    if (got != want) {
        std::fprintf(stderr, "cuda_copy_bandwidth: the read kernel summed %08x, expected %08x: not every byte was read"
                             " (or the copy was wrong)\n", got, want);
        return 1;
    }
    cudaFree(src);
    cudaFree(dst);
    cudaFree(sum);

    const double gb = double(bytes) / 1e9;
    const double copy_best = 2 * gb / (copy.best_ms / 1e3), copy_median = 2 * gb / (copy.median_ms / 1e3);
    const double read_best = gb / (read.best_ms / 1e3), read_median = gb / (read.median_ms / 1e3);
    std::printf("device   %s (sm_%d%d, %d SMs, %.1f GiB)\n", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, double(prop.totalGlobalMem) / (1024.0 * 1024 * 1024));
    std::printf("buffer   %.2f GiB, best and median of %d runs after 2 warm-ups\n", double(bytes) / (1 << 30), reps);
    std::printf("copy     %8.1f GB/s best, %8.1f median  (cudaMemcpy D2D; bytes read + bytes written)\n", copy_best,
                copy_median);
    std::printf("read     %8.1f GB/s best, %8.1f median  (read-only kernel; bytes read)\n", read_best, read_median);
    std::printf("{\"device\": \"%s\", \"compute_capability\": \"%d.%d\", \"sms\": %d, \"buffer_bytes\": %zu, "
                "\"repetitions\": %d, \"copy_gbps_best\": %.1f, \"copy_gbps_median\": %.1f, "
                "\"read_gbps_best\": %.1f, \"read_gbps_median\": %.1f, "
                "\"convention\": \"copy: (bytes read + bytes written) / time of a D2D cudaMemcpy; "
                "read: bytes read / time of a read-only kernel; GB = 1e9 bytes\"}\n",
                prop.name, prop.major, prop.minor, prop.multiProcessorCount, bytes, reps, copy_best, copy_median,
                read_best, read_median);
    return 0;
}
