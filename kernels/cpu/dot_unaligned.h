#pragma once
// Element loads for weight rows read straight from the mapping. GGUF lets a file choose any power-of-two
// alignment, 1 included, so an f32 or f16 row may start at any byte: indexing it as float* / uint16_t*
// would be undefined behaviour (and a fault on strict-alignment targets). memcpy of one element compiles
// to the same single load on x86-64 and aarch64.
#include <cstdint>
#include <cstring>

namespace tern {

inline float load_f32_at(const void* base, int64_t i) {
    float v;
    std::memcpy(&v, static_cast<const unsigned char*>(base) + i * int64_t{sizeof(float)}, sizeof v);
    return v;
}

inline uint16_t load_u16_at(const void* base, int64_t i) {
    uint16_t v;
    std::memcpy(&v, static_cast<const unsigned char*>(base) + i * int64_t{sizeof(uint16_t)}, sizeof v);
    return v;
}

} // namespace tern
