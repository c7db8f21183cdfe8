// The CUDA emulator's host API (cuda_emu/cuda_emu_host.h) and the launcher (kernels/cuda/launch.h):
// device memory, copies and their checks, the last-error protocol, launch-configuration errors, streams,
// events and graph capture with replay.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kernels/cuda/launch.h"

using tern::cuda::check;
using tern::cuda::launch;

namespace {

__global__ void add_to_all(int* data, int n, int amount) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) data[i] += amount;
}

// A value read from device memory at run time: graphs keep kernel arguments, so per-step values live there.
__global__ void add_from_device(int* data, int n, const int* amount) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) data[i] += *amount;
}

} // namespace

TEST_CASE("device memory: malloc, copies both ways, memset, free, and the checks on them") {
    const size_t before = cuda_emu::device_bytes_in_use();
    int* d = nullptr;
    check(cudaMalloc(&d, 100 * sizeof(int)), "cudaMalloc");
    CHECK(reinterpret_cast<uintptr_t>(d) % 256 == 0);
    std::vector<int> h(100), back(100);
    for (int i = 0; i < 100; ++i) h[i] = i * i;
    check(cudaMemcpy(d, h.data(), 100 * sizeof(int), cudaMemcpyHostToDevice), "H2D");
    check(cudaMemcpy(back.data(), d, 100 * sizeof(int), cudaMemcpyDeviceToHost), "D2H");
    CHECK(back == h);
    check(cudaMemset(d, 0, 10 * sizeof(int)), "memset");
    check(cudaMemcpy(back.data(), d, 100 * sizeof(int), cudaMemcpyDeviceToHost), "D2H");
    CHECK(back[9] == 0);
    CHECK(back[10] == 100);

    // A host pointer where a device pointer belongs, a copy past the allocation's end, an unknown free:
    // each an error code, remembered by cudaGetLastError once.
    CHECK(cudaMemcpy(back.data(), h.data(), 4, cudaMemcpyHostToDevice) == cudaErrorInvalidValue);
    CHECK(cudaMemcpy(back.data(), d, 101 * sizeof(int), cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    CHECK(cudaFree(h.data()) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(std::string(cudaGetErrorString(cudaErrorInvalidValue)) == "invalid argument");

    check(cudaFree(d), "cudaFree");
    CHECK(cuda_emu::device_bytes_in_use() == before);
    int count = 0;
    check(cudaGetDeviceCount(&count), "count");
    CHECK(count == 1);
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "props");
    CHECK(prop.warpSize == 32);
}

TEST_CASE("launch-configuration errors come back from the launcher as tern::cuda::Error") {
    int x = 0;
    CHECK_THROWS_WITH_AS(launch(add_to_all, dim3(1), dim3(1025), 0, nullptr, &x, 1, 1),
                         doctest::Contains("invalid configuration argument"), tern::cuda::Error);
    CHECK_THROWS_AS(launch(add_to_all, dim3(0), dim3(32), 0, nullptr, &x, 1, 1), tern::cuda::Error);
    CHECK_THROWS_AS(launch(add_to_all, dim3(1), dim3(32), 300 * 1024, nullptr, &x, 1, 1), tern::cuda::Error);
    CHECK(x == 0);   // nothing ran
    CHECK(cudaGetLastError() == cudaSuccess);   // the launcher consumed the error
    launch(add_to_all, dim3(1), dim3(32), 0, nullptr, &x, 1, 5);
    CHECK(x == 5);
}

TEST_CASE("streams run in order; events time them") {
    cudaStream_t s = nullptr;
    check(cudaStreamCreate(&s), "stream");
    cudaEvent_t start = nullptr, stop = nullptr;
    check(cudaEventCreate(&start), "event");
    check(cudaEventCreate(&stop), "event");
    int* d = nullptr;
    check(cudaMalloc(&d, 64 * sizeof(int)), "malloc");
    std::vector<int> h(64, 1), back(64);
    check(cudaEventRecord(start, s), "record");
    check(cudaMemcpyAsync(d, h.data(), 64 * sizeof(int), cudaMemcpyHostToDevice, s), "H2D");
    launch(add_to_all, dim3(2), dim3(32), 0, s, d, 64, 10);
    check(cudaMemsetAsync(d, 0, sizeof(int), s), "memset");
    check(cudaMemcpyAsync(back.data(), d, 64 * sizeof(int), cudaMemcpyDeviceToHost, s), "D2H");
    check(cudaEventRecord(stop, s), "record");
    check(cudaStreamSynchronize(s), "sync");
    check(cudaEventSynchronize(stop), "sync");
    CHECK(back[0] == 0);
    CHECK(back[63] == 11);
    float ms = -1.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
    CHECK(ms >= 0.0f);
    check(cudaFree(d), "free");
    check(cudaEventDestroy(start), "destroy");
    check(cudaEventDestroy(stop), "destroy");
    check(cudaStreamDestroy(s), "destroy");
}

TEST_CASE("a global-mode capture refuses cudaMalloc and cudaFree, as the runtime does; relaxed mode allows them") {
    cudaStream_t s = nullptr;
    check(cudaStreamCreate(&s), "stream");
    int* kept = nullptr;
    check(cudaMalloc(&kept, 64), "malloc");
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
    int* during = nullptr;
    CHECK(cudaMalloc(&during, 64) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaFree(kept) == cudaErrorStreamCaptureUnsupported);   // captured launches may still point into it
    cudaGetLastError();
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(s, &graph), "end capture");
    check(cudaGraphDestroy(graph), "destroy graph");
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "begin relaxed capture");
    check(cudaMalloc(&during, 64), "malloc while capturing relaxed");
    check(cudaFree(during), "free while capturing relaxed");
    check(cudaStreamEndCapture(s, &graph), "end capture");
    check(cudaGraphDestroy(graph), "destroy graph");
    check(cudaFree(kept), "free after the capture");
    // A stream destroyed while capturing ends its capture.
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
    check(cudaStreamDestroy(s), "destroy stream");
    check(cudaMalloc(&during, 64), "malloc after the capturing stream is gone");
    check(cudaFree(during), "free");
}

TEST_CASE("graph capture records launches and copies, and every replay runs them again") {
    cudaStream_t s = nullptr;
    check(cudaStreamCreate(&s), "stream");
    int *d = nullptr, *d_amount = nullptr;
    check(cudaMalloc(&d, 40 * sizeof(int)), "malloc");
    check(cudaMalloc(&d_amount, sizeof(int)), "malloc");
    check(cudaMemset(d, 0, 40 * sizeof(int)), "memset");
    int amount = 3, host_amount = 100;
    std::vector<int> back(40, -1);

    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), "begin capture");
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(s, &status), "is capturing");
    CHECK(status == cudaStreamCaptureStatusActive);
    check(cudaMemcpyAsync(d_amount, &host_amount, sizeof(int), cudaMemcpyHostToDevice, s), "H2D");
    launch(add_to_all, dim3(2), dim3(16), 0, s, d, 40, amount);   // the argument 3 is kept by value
    launch(add_from_device, dim3(1), dim3(64), 0, s, d, 40, static_cast<const int*>(d_amount));
    check(cudaMemcpyAsync(back.data(), d, 40 * sizeof(int), cudaMemcpyDeviceToHost, s), "D2H");
    cudaGraph_t graph = nullptr;
    check(cudaStreamEndCapture(s, &graph), "end capture");
    CHECK(back[0] == -1);   // capture ran nothing

    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    amount = 1000;   // changing the host variable after capture does not reach the graph
    for (int step = 1; step <= 3; ++step) {
        host_amount = 10 * step;   // the captured H2D copy reads this host memory at replay time
        check(cudaGraphLaunch(exec, s), "graph launch");
        check(cudaStreamSynchronize(s), "sync");
    }
    // Per element: 3 per replay plus 10 + 20 + 30 from device memory.
    CHECK(back[0] == 3 * 3 + 60);
    CHECK(back[39] == 3 * 3 + 60);
    check(cudaGraphExecDestroy(exec), "destroy exec");
    check(cudaGraphDestroy(graph), "destroy graph");
    CHECK(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal) == cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();
    check(cudaFree(d), "free");
    check(cudaFree(d_amount), "free");
    check(cudaStreamDestroy(s), "destroy");
}
