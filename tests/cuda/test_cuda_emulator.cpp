// The CUDA emulator's execution model (cuda_emu/cuda_emu.h): indices, static and dynamic shared
// memory, __syncthreads, every warp shuffle and vote with widths and partial masks, divergent warps,
// atomics from blocks on several OS threads, worker counts changing between launches, and the undefined
// behaviour it must stop with a message.
// Numeric types and intrinsics: test_cuda_emulator_numeric.cpp; host API: test_cuda_emulator_host.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sys/wait.h>
#include <unistd.h>
#endif

#include "kernels/cuda/launch.h"
#include "tests/cuda_emu/sample_kernels.cuh"

using tern::cuda::launch;
using tern::cuda::launch_dependent;
namespace samples = tern::cuda::samples;

namespace {

// ---- kernels used only here (the faulty ones are faulty on purpose) ------------------------------------

__global__ void record_indices(unsigned* out) {
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned threads = blockDim.x * blockDim.y * blockDim.z;
    out[block * threads + thread] = (block << 16) | thread;
}

// Each block fills a static shared tile with its own id, syncs, and checks every entry: blocks that ran
// at the same time on other OS threads must not have written into it.
__global__ void shared_isolation(int* bad) {
    __shared__ int tile[128];
    tile[threadIdx.x] = static_cast<int>(blockIdx.x);
    __syncthreads();
    int wrong = 0;
    for (int i = 0; i < 128; ++i) wrong += tile[(threadIdx.x + i) % 128] != static_cast<int>(blockIdx.x);
    __syncthreads();
    if (wrong) atomicAdd(bad, wrong);
}

// Even lanes reduce among themselves with mask 0x55555555, odd lanes take a longer path (a loop of
// different length per lane) and vote with mask 0xAAAAAAAA; then the whole warp meets at a full-mask
// shuffle. out[lane * 3 + k].
__global__ void divergent(int* out) {
    const int lane = threadIdx.x % 32;
    int v = lane;
    if (lane % 2 == 0) {
        for (int offset = 2; offset < 32; offset *= 2) v += __shfl_xor_sync(0x55555555u, v, offset);
        out[lane * 3 + 0] = v;   // sum of even lanes: 240
        out[lane * 3 + 1] = static_cast<int>(__ballot_sync(0x55555555u, lane % 4 == 0));
    } else {
        int spin = 0;
        for (int k = 0; k < lane; ++k) spin += k;   // lanes reach the vote after different amounts of work
        out[lane * 3 + 0] = __any_sync(0xAAAAAAAAu, lane == 31) + 2 * __all_sync(0xAAAAAAAAu, spin >= 0);
        out[lane * 3 + 1] = static_cast<int>(__ballot_sync(0xAAAAAAAAu, lane > 16));
    }
    out[lane * 3 + 2] = __shfl_sync(0xFFFFFFFFu, v, 0);   // lane 0 holds 240 after its branch
}

// Lanes 0..15 and 16..31 shuffle inside their half with half masks; widths of 16 keep them apart.
__global__ void half_warps(int* out) {
    const int lane = threadIdx.x % 32;
    const unsigned mask = lane < 16 ? 0x0000FFFFu : 0xFFFF0000u;
    int v = lane;
    for (int offset = 8; offset > 0; offset /= 2) v += __shfl_down_sync(mask, v, offset, 16);
    __syncwarp(mask);
    out[lane] = __shfl_sync(mask, v, 0, 16);   // each half's first lane holds the half's sum
}

__global__ void votes(const int* pred, int* out) {
    const int i = threadIdx.x;
    const int lane = i % 32;
    const int p = pred[i];
    out[i * 6 + 0] = static_cast<int>(__ballot_sync(0xFFFFFFFFu, p));
    out[i * 6 + 1] = __any_sync(0xFFFFFFFFu, p);
    out[i * 6 + 2] = __all_sync(0xFFFFFFFFu, p);
    out[i * 6 + 3] = static_cast<int>(__match_any_sync(0xFFFFFFFFu, p));
    out[i * 6 + 4] = __syncthreads_count(p);
    out[i * 6 + 5] = static_cast<int>(__reduce_add_sync(0xFFFFFFFFu, static_cast<unsigned>(lane)));
}

__global__ void sync_and_or(const int* pred, int* out) {
    const int p = pred[threadIdx.x];
    const int all = __syncthreads_and(p);
    const int any = __syncthreads_or(p);
    if (threadIdx.x == 0) out[0] = all, out[1] = any;
}

__global__ void shuffle_after_exit(int* out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = __shfl_sync(0xFFFFFFFFu, static_cast<int>(threadIdx.x), 0);
}

__global__ void shuffle_without_self(int* out) {
    out[threadIdx.x] = __shfl_sync(0x0000FFFFu, static_cast<int>(threadIdx.x), 0);   // lanes 16..31 not in mask
}

__global__ void shuffle_from_outside_mask(int* out) {
    if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000FFFFu, static_cast<int>(threadIdx.x), 20);
}

__global__ void barrier_not_reached(int* out) {
    if (threadIdx.x == 0) {
        __syncthreads();   // the other lanes wait for lane 0 in __syncwarp: nobody can move
    } else {
        __syncwarp();
    }
    out[threadIdx.x] = 1;
}

__global__ void barrier_across_warps_mismatch(int* out) {
    // Warp 0 waits at __syncthreads; warp 1 waits at a __syncwarp that its lane 0 never reaches.
    if (threadIdx.x < 32 || threadIdx.x == 32) {
        __syncthreads();
    } else {
        __syncwarp(0xFFFFFFFFu);
    }
    out[threadIdx.x] = 1;
}

__global__ void syncwarp_in_partial_warp(int* out) {
    __syncwarp();   // the block has 20 threads: lanes 20..31 of the mask do not exist
    out[threadIdx.x] = 1;
}

__global__ void mixed_intrinsics(int* out) {
    const int lane = threadIdx.x % 32;
    if (lane % 2) {
        out[lane] = __shfl_sync(0xFFFFFFFFu, lane, 0);
    } else {
        out[lane] = static_cast<int>(__ballot_sync(0xFFFFFFFFu, 1));
    }
}

__global__ void bad_width(int* out) { out[threadIdx.x] = __shfl_xor_sync(0xFFFFFFFFu, 1, 1, 12); }

__global__ void dynamic_shared_overrun(int* out) {
    int* s = tern::cuda::dynamic_shared<int>();
    s[threadIdx.x + 1] = 1;   // the last thread writes one int past the end
    __syncthreads();
    out[threadIdx.x] = s[0];
}

__global__ void trapping(int* out) {
    if (threadIdx.x == 5) __trap();
    out[threadIdx.x] = 1;
}

__global__ void misaligned_atomic(char* base) { atomicAdd(reinterpret_cast<int*>(base + 2), 1); }

std::mutex g_ids_mutex;
std::set<std::thread::id> g_ids;

__global__ void atomics(int* i_sum, unsigned* u_sum, unsigned long long* ull_sum, float* f_sum, int* i_max,
                        unsigned* u_min, int* cas_counter, unsigned* ring, unsigned* exch) {
    const int gid = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    atomicAdd(i_sum, gid % 7 - 3);
    atomicAdd(u_sum, 2u);
    atomicAdd(ull_sum, 1ull << 33);
    atomicAdd(f_sum, 1.0f);   // integer-valued sums below 2^24 are exact in any order
    atomicMax(i_max, gid * 3 - 1000);
    atomicMin(u_min, static_cast<unsigned>(gid) + 17u);
    int old = *cas_counter;   // a CAS retry loop, as kernels build their own atomics
    for (;;) {
        const int seen = atomicCAS(cas_counter, old, old + 1);
        if (seen == old) break;
        old = seen;
    }
    atomicInc(ring, 9u);   // wraps to 0 after 9
    atomicExch(exch, static_cast<unsigned>(gid));
    if (threadIdx.x == 0) {
        // Host-only bookkeeping: which OS threads ran blocks. The pause keeps one worker from taking every
        // block before the others have started.
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        std::lock_guard<std::mutex> lock(g_ids_mutex);
        g_ids.insert(std::this_thread::get_id());
    }
}

// `depth` frames, each with a local array ASan instruments (red zones around it), then a barrier; with
// `fault`, thread 5 of each block traps there instead, abandoning the others' frames where they wait.
// kLocal sets the frame size, so kernels with different kLocal lay their frames out differently.
template <int kLocal> __device__ __noinline__ int deep_frames(int depth, bool fault) {
    volatile int local[kLocal];
    for (int i = 0; i < kLocal; ++i) local[i] = depth + i;
    if (depth > 0) return deep_frames<kLocal>(depth - 1, fault) + local[depth % kLocal];
    if (fault && threadIdx.x == 5) __trap();
    __syncthreads();
    return local[threadIdx.x % kLocal];
}

template <int kLocal> __global__ void deep_stack(int* out, int depth, int fault) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = deep_frames<kLocal>(depth, fault != 0);
}

__global__ void dynamic_shared_fill(unsigned* out) {
    const unsigned* s = tern::cuda::dynamic_shared<unsigned>();
    out[threadIdx.x] = s[threadIdx.x];   // read before any write: the emulator's 0xFF fill
}

#if defined(__SANITIZE_ADDRESS__)
__global__ void static_shared_overrun(int* out) {
    __shared__ int tile[32];
    tile[threadIdx.x + 1] = 1;   // the last thread indexes one past the end
    __syncthreads();
    out[threadIdx.x] = tile[threadIdx.x];
}

// Runs `f` in a forked child (one worker thread) and returns whether it failed and what it printed on
// stderr: the sanitizers stop the process, so their reports are checked from outside.
template <typename F> std::pair<bool, std::string> run_in_child(F&& f) {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    const pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        cuda_emu::set_worker_threads(1);
        f();
        _exit(0);
    }
    close(fds[1]);
    std::string text;
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return {!(WIFEXITED(status) && WEXITSTATUS(status) == 0), text};
}
#endif

template <typename F> std::string fault_text(F&& f) {
    try {
        f();
    } catch (const cuda_emu::Fault& e) {
        return e.what();
    }
    return "(no fault)";
}

// After a fault the emulator must run the next launch normally.
void check_still_works() {
    std::vector<unsigned> out(2 * 64);
    launch(record_indices, dim3(2), dim3(64), 0, nullptr, out.data());
    CHECK(out[64 + 5] == ((1u << 16) | 5u));
}

} // namespace

TEST_CASE("every thread of a 3-D grid runs once with its own indices") {
    const dim3 grid(3, 2, 2), block(8, 4, 2);
    const unsigned threads = 64, blocks = 12;
    std::vector<unsigned> out(blocks * threads, 0xFFFFFFFFu);
    launch(record_indices, grid, block, 0, nullptr, out.data());
    for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < threads; ++t) REQUIRE(out[b * threads + t] == ((b << 16) | t));
}

TEST_CASE("block reduction through static shared memory and __syncthreads, ragged sizes") {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (int n : {1, 255, 256, 1000, 100003}) {
        std::vector<float> x(n);
        for (float& v : x) v = dist(rng);
        const int grid = 37;
        std::vector<float> sums(grid, NAN);
        launch(samples::block_sum<256>, dim3(grid), dim3(256), 0, nullptr, x.data(), n, sums.data());
        double got = 0, want = 0, abs_sum = 0;
        for (float s : sums) got += s;
        for (float v : x) want += v, abs_sum += std::fabs(v);
        CHECK_MESSAGE(std::fabs(got - want) <= 1e-5 * abs_sum + 1e-6, "n=" << n);
    }
}

TEST_CASE("static shared memory is per block while blocks run on several OS threads") {
    cuda_emu::set_worker_threads(4);
    int bad = 0;
    launch(shared_isolation, dim3(64), dim3(128), 0, nullptr, &bad);
    CHECK(bad == 0);
    cuda_emu::set_worker_threads(0);
}

TEST_CASE("warp shuffles: xor, down, up and idx at every width") {
    std::vector<int> x(64);
    for (int i = 0; i < 64; ++i) x[i] = i * 7 + 3;
    for (int width : {1, 2, 4, 8, 16, 32}) {
        for (int src : {0, 3, width + 1, 31}) {
            std::vector<int> out(4 * 64);
            launch(samples::warp_shuffles, dim3(1), dim3(64), 0, nullptr, x.data(), width, src, out.data());
            for (int i = 0; i < 64; ++i) {
                const int seg = i / width * width;
                int seg_sum = 0, prefix = 0;
                for (int j = seg; j < seg + width; ++j) seg_sum += x[j];
                for (int j = seg; j <= i; ++j) prefix += x[j];
                CAPTURE(width);
                CAPTURE(src);
                CAPTURE(i);
                REQUIRE(out[4 * i + 0] == seg_sum);
                if (i == seg) REQUIRE(out[4 * i + 1] == seg_sum);
                REQUIRE(out[4 * i + 2] == prefix);
                REQUIRE(out[4 * i + 3] == x[seg + src % width]);
            }
        }
    }
}

TEST_CASE("shuffles past a segment's end return the lane's own value; xor may read earlier segments") {
    static int out_down[32], out_xor[32], out_up[32];
    struct K {
        static __global__ void run(int* d, int* x, int* u) {
            const int lane = static_cast<int>(threadIdx.x);
            d[lane] = __shfl_down_sync(0xFFFFFFFFu, lane, 1, 4);   // the 4th lane of each segment keeps its own
            x[lane] = __shfl_xor_sync(0xFFFFFFFFu, lane, 8, 8);    // lanes 0..7 would read a later segment
            u[lane] = __shfl_up_sync(0xFFFFFFFFu, lane, 3, 8);
        }
    };
    launch(K::run, dim3(1), dim3(32), 0, nullptr, out_down, out_xor, out_up);
    for (int lane = 0; lane < 32; ++lane) {
        CAPTURE(lane);
        CHECK(out_down[lane] == (lane % 4 == 3 ? lane : lane + 1));
        CHECK(out_xor[lane] == ((lane ^ 8) > (lane | 7) ? lane : (lane ^ 8)));
        CHECK(out_up[lane] == (lane % 8 < 3 ? lane : lane - 3));
    }
}

TEST_CASE("divergent warps meet at shuffles and votes with partial masks, then reconverge") {
    std::vector<int> out(32 * 3 * 3, -1);
    launch(divergent, dim3(1), dim3(32), 0, nullptr, out.data());
    for (int lane = 0; lane < 32; ++lane) {
        CAPTURE(lane);
        if (lane % 2 == 0) {
            CHECK(out[lane * 3 + 0] == 240);
            CHECK(static_cast<unsigned>(out[lane * 3 + 1]) == 0x11111111u);
        } else {
            CHECK(out[lane * 3 + 0] == 3);
            CHECK(static_cast<unsigned>(out[lane * 3 + 1]) == 0xAAAA0000u);
        }
        CHECK(out[lane * 3 + 2] == 240);
    }
    std::vector<int> halves(32);
    launch(half_warps, dim3(1), dim3(32), 0, nullptr, halves.data());
    for (int lane = 0; lane < 32; ++lane) CHECK(halves[lane] == (lane < 16 ? 120 : 376));
}

TEST_CASE("ballot, any, all, match_any, __syncthreads_count and __reduce_add_sync") {
    const int n = 64;
    std::vector<int> pred(n), out(n * 6);
    for (int i = 0; i < n; ++i) pred[i] = (i % 3 == 0) || i >= 40;
    launch(votes, dim3(1), dim3(n), 0, nullptr, pred.data(), out.data());
    const int count = static_cast<int>(std::count(pred.begin(), pred.end(), 1));
    for (int w = 0; w < 2; ++w) {
        unsigned ballot = 0;
        for (int l = 0; l < 32; ++l) ballot |= static_cast<unsigned>(pred[w * 32 + l]) << l;
        for (int l = 0; l < 32; ++l) {
            const int i = w * 32 + l;
            CAPTURE(i);
            CHECK(static_cast<unsigned>(out[i * 6 + 0]) == ballot);
            CHECK(out[i * 6 + 1] == (ballot != 0));
            CHECK(out[i * 6 + 2] == (ballot == 0xFFFFFFFFu));
            CHECK(static_cast<unsigned>(out[i * 6 + 3]) == (pred[i] ? ballot : ~ballot));
            CHECK(out[i * 6 + 4] == count);
            CHECK(out[i * 6 + 5] == 496);
        }
    }
    std::vector<int> ones(96, 1), res(2);
    launch(sync_and_or, dim3(1), dim3(96), 0, nullptr, ones.data(), res.data());
    CHECK(res == std::vector<int>{1, 1});
    ones[77] = 0;
    launch(sync_and_or, dim3(1), dim3(96), 0, nullptr, ones.data(), res.data());
    CHECK(res == std::vector<int>{0, 1});
}

TEST_CASE("undefined behaviour stops the launch with a message naming it") {
    std::vector<int> out(64);
    int* o = out.data();
    SUBCASE("a shuffle naming a lane that has exited") {
        const std::string msg = fault_text([&] { launch(shuffle_after_exit, dim3(1), dim3(32), 0, nullptr, o); });
        CHECK(msg.find("exited") != std::string::npos);
        CHECK(msg.find("__shfl_sync") != std::string::npos);
    }
    SUBCASE("a shuffle whose mask leaves out the caller") {
        const std::string msg = fault_text([&] { launch(shuffle_without_self, dim3(1), dim3(32), 0, nullptr, o); });
        CHECK(msg.find("leaves out the calling lane") != std::string::npos);
        CHECK(msg.find("test_cuda_emulator.cpp") != std::string::npos);   // the call's source line
    }
    SUBCASE("a shuffle reading a lane outside the mask") {
        const std::string msg =
            fault_text([&] { launch(shuffle_from_outside_mask, dim3(1), dim3(32), 0, nullptr, o); });
        CHECK(msg.find("reads lane 20, which is not in the mask") != std::string::npos);
    }
    SUBCASE("a __syncthreads that not every live thread reaches") {
        const std::string msg = fault_text([&] { launch(barrier_not_reached, dim3(1), dim3(32), 0, nullptr, o); });
        CHECK(msg.find("deadlock") != std::string::npos);
        CHECK(msg.find("__syncthreads") != std::string::npos);
        CHECK(msg.find("__syncwarp") != std::string::npos);
        const std::string msg2 =
            fault_text([&] { launch(barrier_across_warps_mismatch, dim3(2), dim3(64), 0, nullptr, o); });
        CHECK(msg2.find("deadlock") != std::string::npos);
    }
    SUBCASE("a warp intrinsic naming lanes that do not exist") {
        const std::string msg =
            fault_text([&] { launch(syncwarp_in_partial_warp, dim3(1), dim3(20), 0, nullptr, o); });
        CHECK(msg.find("do not exist") != std::string::npos);
    }
    SUBCASE("lanes of one mask at different intrinsics") {
        const std::string msg = fault_text([&] { launch(mixed_intrinsics, dim3(1), dim3(32), 0, nullptr, o); });
        CHECK(msg.find("with the same mask") != std::string::npos);
    }
    SUBCASE("a shuffle width that is not a power of two") {
        const std::string msg = fault_text([&] { launch(bad_width, dim3(1), dim3(32), 0, nullptr, o); });
        CHECK(msg.find("width 12") != std::string::npos);
    }
#if !defined(__SANITIZE_ADDRESS__)
    SUBCASE("dynamic shared memory written past its end: the red zone check") {
        const std::string msg =
            fault_text([&] { launch(dynamic_shared_overrun, dim3(1), dim3(32), 32 * sizeof(int), nullptr, o); });
        CHECK(msg.find("out of bounds") != std::string::npos);
    }
#else
    // Under the asan preset the red zones are poisoned, so ASan reports the write itself, and UBSan's
    // bounds check reports indexing past a static __shared__ array (which has no red zones).
    SUBCASE("dynamic shared memory written past its end: ASan's report") {
        const auto [failed, text] =
            run_in_child([&] { launch(dynamic_shared_overrun, dim3(1), dim3(32), 32 * sizeof(int), nullptr, o); });
        CHECK(failed);
        CHECK(text.find("AddressSanitizer") != std::string::npos);
    }
    SUBCASE("a static shared array indexed past its end: UBSan's report") {
        const auto [failed, text] =
            run_in_child([&] { launch(static_shared_overrun, dim3(1), dim3(32), 0, nullptr, o); });
        CHECK(failed);
        CHECK(text.find("out of bounds for type 'int [32]'") != std::string::npos);
    }
#endif
    SUBCASE("__trap") {
        const std::string msg = fault_text([&] { launch(trapping, dim3(3), dim3(32), 0, nullptr, o); });
        CHECK(msg.find("__trap() called") != std::string::npos);
        CHECK(msg.find("thread (5,0,0)") != std::string::npos);
    }
    SUBCASE("a misaligned atomic") {
        alignas(8) char buf[16] = {};
        const std::string msg = fault_text([&] { launch(misaligned_atomic, dim3(1), dim3(1), 0, nullptr, buf); });
        CHECK(msg.find("misaligned atomic") != std::string::npos);
    }
    check_still_works();
}

TEST_CASE("atomics from many blocks on several OS threads give exact results") {
    cuda_emu::set_worker_threads(4);
    g_ids.clear();
    const int blocks = 96, threads = 128, n = blocks * threads;
    int i_sum = 0, i_max = -1000000, cas_counter = 0;
    unsigned u_sum = 0, u_min = 0xFFFFFFFFu, ring = 0, exch = 0xFFFFFFFFu;
    unsigned long long ull_sum = 0;
    float f_sum = 0.0f;
    launch(atomics, dim3(blocks), dim3(threads), 0, nullptr, &i_sum, &u_sum, &ull_sum, &f_sum, &i_max, &u_min,
           &cas_counter, &ring, &exch);
    int want_i = 0;
    for (int g = 0; g < n; ++g) want_i += g % 7 - 3;
    CHECK(i_sum == want_i);
    CHECK(u_sum == 2u * n);
    CHECK(ull_sum == (1ull << 33) * n);
    CHECK(f_sum == static_cast<float>(n));
    CHECK(i_max == (n - 1) * 3 - 1000);
    CHECK(u_min == 17u);
    CHECK(cas_counter == n);
    CHECK(ring == static_cast<unsigned>(n % 10));
    CHECK(exch < static_cast<unsigned>(n));
    CHECK(g_ids.size() > 1);   // the blocks really ran on several OS threads
    std::vector<int> x(100000);
    std::mt19937 rng(3);
    for (int& v : x) v = static_cast<int>(rng() % 37);
    std::vector<unsigned> counts(37), want(37);
    for (int v : x) ++want[v];
    launch(samples::histogram, dim3(40), dim3(256), 0, nullptr, x.data(), static_cast<int>(x.size()), counts.data());
    CHECK(counts == want);
    cuda_emu::set_worker_threads(0);
}

TEST_CASE("the worker count lowered and raised between launches, after faults that abandoned deep frames") {
    // OpenMP ends the threads a smaller team leaves out, and their workers unmap their fiber stacks; the
    // threads a larger team then starts map new stacks, often at the same addresses. Stacks abandoned by
    // a fault hold ASan poison deep down (the waiting threads' frames): unless it is cleared before the
    // unmapping, the next kernel's frames, laid out differently, meet it and ASan reports a false
    // stack-buffer-overflow (the asan preset; other builds check the results only).
    const int blocks = 32, threads = 64, depth = 150;
    std::vector<int> out(blocks * threads);
    int want_sum = 0; // deep_frames<37>(depth) less the last frame's local[tid % 37]
    for (int d = 1; d <= depth; ++d) want_sum += d + d % 37;
    for (int round = 0; round < 3; ++round) {
        CAPTURE(round);
        cuda_emu::set_worker_threads(8);
        const std::string msg = fault_text(
            [&] { launch(deep_stack<64>, dim3(blocks), dim3(threads), 0, nullptr, out.data(), 100, 1); });
        CHECK(msg.find("__trap() called") != std::string::npos);
        cuda_emu::set_worker_threads(2); // a team of 2: the other threads exit
        check_still_works();
        std::this_thread::sleep_for(std::chrono::milliseconds(20)); // their exit runs after the launch returns
        cuda_emu::set_worker_threads(8);
        std::fill(out.begin(), out.end(), -1);
        launch(deep_stack<37>, dim3(blocks), dim3(threads), 0, nullptr, out.data(), depth, 0);
        for (int i = 0; i < blocks * threads; ++i) REQUIRE(out[i] == want_sum + i % threads % 37);
    }
    cuda_emu::set_worker_threads(0);
}

TEST_CASE("dynamic shared memory: per block, sized by the launch, filled with 0xFF at block start") {
    for (int n : {1, 100, 128, 1000}) {
        std::vector<int> in(n), out(n, -7);
        std::iota(in.begin(), in.end(), 0);
        launch(samples::reverse_chunks, dim3((n + 127) / 128), dim3(128), 128 * sizeof(int), nullptr, in.data(), n,
               out.data());
        for (int i = 0; i < n; ++i) {
            const int base = i / 128 * 128, len = std::min(128, n - base);
            REQUIRE(out[i] == base + (len - 1 - (i - base)));
        }
    }
    std::vector<unsigned> fill(64, 0);
    launch(dynamic_shared_fill, dim3(2), dim3(64), 64 * sizeof(unsigned), nullptr, fill.data());
    CHECK(std::all_of(fill.begin(), fill.end(), [](unsigned v) { return v == 0xFFFFFFFFu; }));
}

TEST_CASE("a grid-stride loop covers ragged sizes with any grid") {
    for (int n : {1, 31, 33, 1000, 4097}) {
        for (dim3 grid : {dim3(1), dim3(3), dim3(64)}) {
            for (dim3 block : {dim3(32), dim3(96), dim3(1024)}) {
                std::vector<float> x(n), y(n);
                for (int i = 0; i < n; ++i) x[i] = static_cast<float>(i), y[i] = 1.0f;
                launch(samples::saxpy, grid, block, 0, nullptr, n, 2.0f, x.data(), y.data());
                for (int i = 0; i < n; ++i) REQUIRE(y[i] == 2.0f * static_cast<float>(i) + 1.0f);
            }
        }
    }
}

TEST_CASE("ldmatrix and mma.m16n8k16 wrappers follow the PTX fragment layouts") {
    std::mt19937 rng(9);
    std::uniform_int_distribution<int> small(-8, 8);   // small integers: every product and sum is exact
    std::vector<__half> a(16 * 16), b(16 * 8);
    for (__half& v : a) v = __float2half(static_cast<float>(small(rng)) / 4.0f);
    for (__half& v : b) v = __float2half(static_cast<float>(small(rng)) / 2.0f);
    std::vector<float> d(16 * 8, NAN);
    launch(samples::mma_tile, dim3(1), dim3(32), 0, nullptr, a.data(), b.data(), d.data());
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 8; ++j) {
            double want = 0;
            for (int k = 0; k < 16; ++k) want += static_cast<double>(float(a[i * 16 + k])) * float(b[k * 8 + j]);
            CAPTURE(i);
            CAPTURE(j);
            REQUIRE(d[i * 8 + j] == static_cast<float>(want));
        }
    }
}

TEST_CASE("ldmatrix_x4_trans gives the B fragments of a row-major (k, n) tile") {
    std::mt19937 rng(10);
    std::uniform_int_distribution<int> small(-8, 8);   // small integers: every product and sum is exact
    std::vector<__half> a(16 * 16), b(16 * 16);
    for (__half& v : a) v = __float2half(static_cast<float>(small(rng)) / 4.0f);
    for (__half& v : b) v = __float2half(static_cast<float>(small(rng)) / 2.0f);
    std::vector<float> d0(16 * 8, NAN), d1(16 * 8, NAN);
    launch(samples::mma_tile_trans, dim3(1), dim3(32), 0, nullptr, a.data(), b.data(), d0.data(), d1.data());
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) {
            double want = 0;
            for (int k = 0; k < 16; ++k) want += static_cast<double>(float(a[i * 16 + k])) * float(b[k * 16 + j]);
            CAPTURE(i);
            CAPTURE(j);
            REQUIRE((j < 8 ? d0[i * 8 + j] : d1[i * 8 + j - 8]) == static_cast<float>(want));
        }
    }
}

TEST_CASE("ldmatrix and the int8 mma.m16n8k32 / m16n8k16 wrappers follow the PTX fragment layouts") {
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> byte(-128, 127), acc(-1 << 20, 1 << 20);
    for (int trial = 0; trial < 3; ++trial) {
        CAPTURE(trial);
        std::vector<int8_t> a(16 * 32), b(32 * 8);
        std::vector<int> c(16 * 8);
        for (int8_t& v : a) v = static_cast<int8_t>(byte(rng));
        for (int8_t& v : b) v = static_cast<int8_t>(byte(rng));
        for (int& v : c) v = acc(rng);
        if (trial == 1) {   // the extreme codes: -128 * -128 summed over k is the largest product there is
            std::fill(a.begin(), a.end(), int8_t{-128});
            std::fill(b.begin(), b.end(), int8_t{-128});
        }
        std::vector<int> d32(16 * 8, -1), d16(16 * 8, -1);
        launch(samples::mma_tile_s8, dim3(1), dim3(32), 0, nullptr, a.data(), b.data(), c.data(), d32.data(),
               d16.data());
        for (int i = 0; i < 16; ++i) {
            for (int j = 0; j < 8; ++j) {
                int64_t want32 = c[i * 8 + j], want16 = c[i * 8 + j];
                for (int k = 0; k < 32; ++k) {
                    const int64_t p = static_cast<int64_t>(a[i * 32 + k]) * b[k * 8 + j];
                    want32 += p;
                    if (k < 16) want16 += p;
                }
                CAPTURE(i);
                CAPTURE(j);
                REQUIRE(d32[i * 8 + j] == want32);
                REQUIRE(d16[i * 8 + j] == want16);
            }
        }
    }
}

namespace {

__global__ void dependent_increment(const int* in, int* out) {
    tern::cuda::dependent_launch::wait_and_release();
    out[threadIdx.x] = in[threadIdx.x] + 1;
}
__global__ void increment_without_wait(const int* in, int* out) { out[threadIdx.x] = in[threadIdx.x] + 1; }
__global__ void atomic_before_wait(int* out) {
    atomicAdd(out, 1);
    tern::cuda::dependent_launch::wait_and_release();
}
__global__ void exit_before_wait(int* out) {
    if (threadIdx.x >= 16) return;   // these threads leave without waiting
    tern::cuda::dependent_launch::wait_and_release();
    out[threadIdx.x] = 1;
}

} // namespace

TEST_CASE("a programmatic dependent launch faults a thread that touches memory or exits before its wait") {
    std::vector<int> in(32), out(32, 0);
    std::iota(in.begin(), in.end(), 0);
    // Outside a ProgrammaticLaunches scope launch_dependent is a plain launch: no wait needed.
    launch_dependent(increment_without_wait, dim3(1), dim3(32), 0, nullptr, in.data(), out.data());
    CHECK(out[31] == 32);
    {
        const tern::cuda::ProgrammaticLaunches on(true);
        launch_dependent(dependent_increment, dim3(1), dim3(32), 0, nullptr, out.data(), out.data());
        CHECK(out[31] == 33);
        std::string msg = fault_text(
            [&] { launch_dependent(increment_without_wait, dim3(1), dim3(32), 0, nullptr, in.data(), out.data()); });
        CHECK(msg.find("exited without cudaGridDependencySynchronize()") != std::string::npos);
        msg = fault_text([&] { launch_dependent(atomic_before_wait, dim3(1), dim3(32), 0, nullptr, out.data()); });
        CHECK(msg.find("an atomic before cudaGridDependencySynchronize()") != std::string::npos);
        CHECK(msg.find("test_cuda_emulator.cpp") != std::string::npos);
        msg = fault_text([&] { launch_dependent(exit_before_wait, dim3(1), dim3(32), 0, nullptr, out.data()); });
        CHECK(msg.find("thread (16,0,0)") != std::string::npos);
        // launch() is never programmatic, whatever the scope.
        launch(increment_without_wait, dim3(1), dim3(32), 0, nullptr, in.data(), out.data());
        {
            const tern::cuda::ProgrammaticLaunches off(false);
            launch_dependent(increment_without_wait, dim3(1), dim3(32), 0, nullptr, in.data(), out.data());
        }
        CHECK(tern::cuda::programmatic_launches_on);   // the inner scope restored the outer one's setting
    }
    CHECK_FALSE(tern::cuda::programmatic_launches_on);
    launch_dependent(increment_without_wait, dim3(1), dim3(32), 0, nullptr, in.data(), out.data());
    check_still_works();
}
