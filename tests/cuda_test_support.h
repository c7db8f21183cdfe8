#pragma once
// The test_cuda_* suites run on the CUDA emulator (TERN_CUDA_TESTS=emulator, the default: g++ builds the
// kernels and the tests run on the CPU) or on a real GPU (TERN_CUDA_TESTS=device: the same sources linked
// against the nvcc build, tests/CMakeLists.txt). In device mode every suite's executable starts in
// tests/doctest_main_cuda.cpp, which calls skip_without_cuda_device() before any test case: without a
// usable GPU the executable exits 77, which CTest reports as skipped rather than failed.
//
// Code that only the emulator has (cuda_emu::device_bytes_in_use, cuda_emu::Fault) belongs under
// `#if defined(TERN_CUDA_EMULATOR)` in the suites, so that they build in both modes.
#include <cstdio>
#include <cstdlib>
#include <string>

#if !defined(TERN_CUDA_EMULATOR)
#include "kernels/gpu_info.h"
#endif

namespace tern::test {

// The exit code CTest's SKIP_RETURN_CODE names for the test executables.
inline constexpr int kSkipExitCode = 77;

// On a real CUDA build: returns when a CUDA device is usable, else prints one line saying why not and
// ends the process with kSkipExitCode. Under the emulator (which always has its one device): nothing.
inline void skip_without_cuda_device() {
#if !defined(TERN_CUDA_EMULATOR)
    std::string why;
    if (tern::list_cuda_devices(&why).empty()) {
        std::fprintf(stderr, "SKIPPED: these tests need a CUDA GPU: %s\n", why.c_str());
        std::exit(kSkipExitCode);
    }
#endif
}

} // namespace tern::test
