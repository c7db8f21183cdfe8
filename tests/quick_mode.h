#pragma once
// TERN_TEST_QUICK set to anything but 0 (scripts/test.sh sets it for the ASan+UBSan run): the slow suites then
// run a covering subset, each saying which. A header of its own, free of the heavier includes of
// tests/test_support.h, so that the test_cuda_* suites can include it after the emulator's macros.

namespace tern::test {

bool quick_mode();   // tests/test_support.cpp

} // namespace tern::test
