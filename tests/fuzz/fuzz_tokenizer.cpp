// libFuzzer target for the "tokenizer" surface (tests/fuzz/fuzz_entries.h); run by scripts/fuzz.sh.
#include "tests/fuzz/fuzz_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    tern::fuzz::tokenizer({data, size});
    return 0;
}
