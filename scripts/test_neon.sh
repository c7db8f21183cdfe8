#!/usr/bin/env bash
# Cross-builds the CPU kernel tests for aarch64 (tests/neon/: tern_quant, tern_kernels and
# tests/kernels/test_kernels_*.cpp, NEON + dotprod set included) and runs them under qemu-aarch64 through
# ctest (cmake/toolchain-aarch64-linux-gnu.cmake sets the emulator). Needs the Debian packages
# g++-aarch64-linux-gnu (its libstdc++ and libgomp come along), qemu-user and doctest-dev; without the
# cross compiler or qemu it says so and exits 0 (skipped), so it can sit in a CI list on any host.
#   TERN_JOBS=2                      build jobs (default 2)
#   TERN_NEON_BUILD=build-neon       build folder (relative to the repository root)
#   extra arguments                  passed to ctest, e.g. -R test_kernels_dot
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${TERN_JOBS:-2}"
build="${TERN_NEON_BUILD:-build-neon}"
sysroot=/usr/aarch64-linux-gnu

missing=()
command -v aarch64-linux-gnu-g++ >/dev/null ||
    missing+=("aarch64 cross compiler (apt-get install g++-aarch64-linux-gnu)")
command -v qemu-aarch64 >/dev/null || missing+=("qemu-aarch64 (apt-get install qemu-user)")
[ -d "$sysroot/lib" ] || missing+=("the aarch64 libraries in $sysroot (apt-get install g++-aarch64-linux-gnu)")
if [ ${#missing[@]} -gt 0 ]; then
    for m in "${missing[@]}"; do echo "test_neon: skipped: no $m" >&2; done
    exit 0
fi

launcher=()
if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi

echo "== aarch64 cross build of the kernel tests ($build)" >&2
cmake -S tests/neon -B "$build" -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-aarch64-linux-gnu.cmake" "${launcher[@]}" >/dev/null
cmake --build "$build" -j "$jobs"

echo "== kernel tests under qemu-aarch64 (NEON + dotprod set)" >&2
# qemu-user emulates its 'max' CPU, which has dotprod, so the NEON set is the default one there;
# test_neon_kernel_set fails if it is not.
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@"
