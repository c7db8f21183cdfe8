// libFuzzer target for the "request_fields" surface (tests/fuzz/fuzz_entries.h); run by scripts/fuzz.sh.
#include "tests/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    tern::fuzz::request_fields({data, size});
    return 0;
}
