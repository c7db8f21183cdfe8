#!/usr/bin/env bash
# Builds tern and runs every test: the Release build (with CUDA when nvcc is found; GPU tests
# skip without a GPU), then the suite again under ASan+UBSan (CPU only). Installs missing Debian
# packages and fetches the default model (for the Gemma 3 tests) first.
#   TERN_CUDA_ARCHS=89 bash scripts/test.sh   compile CUDA for one architecture (what CI does)
#   TERN_TEST_SKIP_ASAN=1                     only the Release run
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
    # The whole-model accuracy suites (every shared model x prompt, perplexity runs) take minutes
    # even optimised; under the sanitizers they would dominate CI. Their code paths (loader,
    # forward, sampler, session, CLI) are exercised under ASan+UBSan by the other suites.
    ctest --preset asan -j "$jobs" -E '^(test_model_reference|test_perplexity)$'
fi
