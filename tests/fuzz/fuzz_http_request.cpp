// libFuzzer target for the "http_request" surface (tests/fuzz/fuzz_entries.h); run by scripts/fuzz.sh.
#include "tests/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    tern::fuzz::http_request({data, size});
    return 0;
}
