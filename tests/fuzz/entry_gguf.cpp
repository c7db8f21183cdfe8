// fuzz entry "gguf": the GGUF reader over arbitrary bytes, then every accessor a caller may use on
// what it accepted, so a file that parses but holds odd values cannot trip the getters either.
#include "base/error.h"
#include "formats/gguf.h"
#include "tests/fuzz/fuzz_entries.h"

namespace tern::fuzz {
namespace {

// Each getter may refuse a value of the wrong type (TernError); none may do anything else.
template <class F> void tolerate(F&& f) {
    try {
        f();
    } catch (const TernError&) {
    }
}

void use_every_value(const GgufFile& file) {
    for (const GgufKv& kv : file.metadata()) {
        const std::string& key = kv.key;
        (void)kv.value.to_display();
        (void)kv.value.to_display(5);
        tolerate([&] { (void)file.get_u32(key); });
        tolerate([&] { (void)file.get_int(key); });
        tolerate([&] { (void)file.get_f32(key); });
        tolerate([&] { (void)file.get_bool(key); });
        tolerate([&] { (void)file.get_string(key); });
        tolerate([&] { (void)file.get_string_array(key); });
        tolerate([&] { (void)file.get_f32_array(key); });
        tolerate([&] { (void)file.get_int_array(key); });
        tolerate([&] { (void)file.get_per_layer(key, 3); });
    }
}

void use_every_tensor(const GgufFile& file) {
    volatile uint8_t sink = 0;
    for (const GgufTensor& t : file.tensors()) {
        (void)t.shape_string();
        if (file.find_tensor(t.name) != &t) __builtin_trap(); // names are unique
        // The reader promised [data, data + n_bytes) lies inside the input: touch both ends so
        // ASan sees any broken promise (the fuzzer's input buffer is exactly its size).
        if (t.n_bytes > 0) sink = sink + t.data[0] + t.data[t.n_bytes - 1];
    }
}

} // namespace

void gguf(Input input) {
    try {
        const GgufFile file = GgufFile::parse(input, "fuzz.gguf");
        use_every_value(file);
        use_every_tensor(file);
    } catch (const TernError&) {
    }
}

} // namespace tern::fuzz
