// main() of the test_cuda_* executables built with TERN_CUDA_TESTS=device: skip (exit 77) on a machine
// without a usable GPU, else run doctest as tests/doctest_main.cpp does for every other suite.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "tests/cuda_test_support.h"

int main(int argc, char** argv) {
    tern::test::skip_without_cuda_device();
    return doctest::Context(argc, argv).run();
}
