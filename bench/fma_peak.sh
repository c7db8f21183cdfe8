#!/usr/bin/env bash
# The machine's f32 FMA ceiling: a tiny program with 12 independent 8-wide FMA chains per thread (more than the
# FMA latency x pipes of any AVX2 core), timed at 1 and 2 threads. Prefill of F16/BF16 weights is bounded by it
# (each weight is one f32 FMA per token on AVX2 CPUs), so `prefill tok/s <= peak / (2 * matmul MACs per token)`.
# Usage: bench/fma_peak.sh [THREADS...]   (default "1 2"); needs g++ with AVX2/FMA and OpenMP.
set -euo pipefail
threads=${*:-"1 2"}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/fma.cpp" <<'CPP'
#include <immintrin.h>
#include <omp.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
int main(int argc, char** argv) {
    const int nt = std::atoi(argv[1]);
    const long iters = 200000000L / 12;
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        float sink = 0;
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(nt) reduction(+ : sink)
        {
            const float s = 0.1f * (omp_get_thread_num() + 1);
            // Named chains with distinct starts: an array would be kept on the stack by gcc, equal starts merged.
            __m256 a0 = _mm256_set1_ps(s), a1 = _mm256_set1_ps(s + 0.01f), a2 = _mm256_set1_ps(s + 0.02f),
                   a3 = _mm256_set1_ps(s + 0.03f), a4 = _mm256_set1_ps(s + 0.04f), a5 = _mm256_set1_ps(s + 0.05f),
                   a6 = _mm256_set1_ps(s + 0.06f), a7 = _mm256_set1_ps(s + 0.07f), a8 = _mm256_set1_ps(s + 0.08f),
                   a9 = _mm256_set1_ps(s + 0.09f), a10 = _mm256_set1_ps(s + 0.10f), a11 = _mm256_set1_ps(s + 0.11f);
            const __m256 m = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
            for (long k = 0; k < iters; ++k) {
#define STEP(x) x = _mm256_fmadd_ps(x, m, b);
                STEP(a0) STEP(a1) STEP(a2) STEP(a3) STEP(a4) STEP(a5) STEP(a6) STEP(a7) STEP(a8) STEP(a9) STEP(a10) STEP(a11)
            }
            const __m256 t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
            sink += t[0];
        }
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double gflops = double(iters) * 12 * 16 * nt / sec / 1e9;
        if (gflops > best) best = gflops;
        if (sink == 12345.0f) std::puts("");   // keeps the chains alive
    }
    std::printf("f32 FMA peak, %d thread(s): %.1f GFLOP/s (best of 3)\n", nt, best);
}
CPP
g++ -O2 -mavx2 -mfma -fopenmp "$work/fma.cpp" -o "$work/fma"
for t in $threads; do "$work/fma" "$t"; done
