#!/usr/bin/env bash
# Builds tern and runs every test: the Release build (with CUDA when nvcc is found; GPU tests
# skip without a GPU), then the suite again under ASan+UBSan (CPU only), then a short fuzz run
# (scripts/fuzz.sh: every libFuzzer target for TERN_FUZZ_SECONDS, default 30 s, each), then the CPU
# kernel tests cross-built for aarch64 and run under qemu (scripts/test_neon.sh: the NEON set). Installs
# missing Debian packages and fetches the default model (for the Gemma 3 tests) first.
#   TERN_CUDA_ARCHS=89 bash scripts/test.sh   compile CUDA for one architecture (what CI does)
#   TERN_TEST_SKIP_ASAN=1                     no ASan+UBSan run
#   TERN_TEST_SKIP_FUZZ=1                     no fuzz run
#   TERN_TEST_SKIP_NEON=1                     no aarch64 / qemu run
#   TERN_TEST_QUICK=1                         (set for the ASan run) the slow suites (model accuracy,
#                                             emulated CUDA, Gemma 3) run a covering subset of files,
#                                             prompts, shapes and steps (tests/quick_mode.h)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${TERN_JOBS:-2}"

bash scripts/deps.sh
if model=$(bash scripts/fetch_model.sh); then
    export TERN_GEMMA="$model"
else
    echo "test: could not fetch the default model; the Gemma 3 tests will be skipped" >&2
fi

cuda_args=()
[ -n "${TERN_CUDA_ARCHS:-}" ] && cuda_args+=("-DCMAKE_CUDA_ARCHITECTURES=${TERN_CUDA_ARCHS}")

echo "== Release build and tests" >&2
cmake --preset release "${cuda_args[@]}" >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

if [ -z "${TERN_TEST_SKIP_ASAN:-}" ]; then
    echo "== ASan+UBSan build and tests" >&2
    cmake --preset asan >/dev/null
    cmake --build --preset asan -j "$jobs"
    # The whole suite, the bad-input matrix included. The whole-model accuracy suites (every shared
    # model x prompt, perplexity runs) take minutes even optimised; TERN_TEST_QUICK=1 makes them
    # run a covering subset (both architectures, a tied output, f32/q4_0/q4_K/q6_K/q8_0, fewer
    # prompts and perplexity files) so that under the sanitizers they stay minutes, not an hour.
    TERN_TEST_QUICK=1 ctest --preset asan -j "$jobs"
fi

if [ -z "${TERN_TEST_SKIP_FUZZ:-}" ]; then
    echo "== short fuzz run" >&2
    bash scripts/fuzz.sh "${TERN_FUZZ_SECONDS:-30}"
fi

if [ -z "${TERN_TEST_SKIP_NEON:-}" ]; then
    echo "== NEON kernels under qemu-aarch64" >&2
    # The attention kernels have no NEON version (the scalar twin runs there, ~10 min under qemu); x86
    # already tests that twin, so it is left out here.
    bash scripts/test_neon.sh -E test_kernels_attention
fi
