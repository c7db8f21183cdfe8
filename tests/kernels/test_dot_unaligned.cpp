// The f32 / f16 / bf16 dot kernels read weight rows straight from a model's mapping, and GGUF lets a
// file choose general.alignment = 1, so a row may start at any byte. Each kernel set must give the
// same result for a row at an odd address as for the same row aligned (and, under UBSan, no
// misaligned-load report from the scalar tails). The loader also copies such tensors to aligned
// memory (engine/weights.cpp); this checks the kernels on their own.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/dot.h"
#include "quant/half.h"

using namespace tern;

namespace {

// `bytes` copied to `offset` bytes past a 64-byte boundary of `storage`.
const uint8_t* placed(std::vector<uint8_t>& storage, const std::vector<uint8_t>& bytes, size_t offset) {
    storage.assign(bytes.size() + 128, 0);
    const auto base = reinterpret_cast<uintptr_t>(storage.data());
    uint8_t* at = storage.data() + ((64 - base % 64) % 64) + offset;
    std::memcpy(at, bytes.data(), bytes.size());
    return at;
}

} // namespace

TEST_CASE("f32, f16 and bf16 dot kernels give the same result for weight rows at any byte offset") {
    std::mt19937 rng(26);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (const CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512, CpuIsa::neon}) {
        const CpuKernels* k = cpu_kernels_for(isa);
        if (!k) continue;
        CAPTURE(cpu_isa_name(isa));
        // Lengths with a vector body and a scalar tail, and tails alone.
        for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{37}, int64_t{99}}) {
            CAPTURE(n);
            std::vector<float> w(static_cast<size_t>(n)), x(static_cast<size_t>(n));
            for (auto& v : w) v = dist(rng);
            for (auto& v : x) v = dist(rng);
            std::vector<uint16_t> w16(w.size()), x16(x.size()), wb(w.size()), xb(x.size());
            for (size_t i = 0; i < w.size(); ++i) {
                w16[i] = f32_to_f16(w[i]);
                x16[i] = f32_to_f16(x[i]);
                wb[i] = f32_to_bf16(w[i]);
                xb[i] = f32_to_bf16(x[i]);
            }
            const auto as_bytes = [](const auto& v) {
                const auto* p = reinterpret_cast<const uint8_t*>(v.data());
                return std::vector<uint8_t>(p, p + v.size() * sizeof(v[0]));
            };
            struct Kernel {
                VecDotFn fn;
                std::vector<uint8_t> w, x;
            };
            for (const Kernel& kern : {Kernel{k->f32, as_bytes(w), as_bytes(x)}, Kernel{k->f16, as_bytes(w16), as_bytes(x16)},
                                       Kernel{k->bf16, as_bytes(wb), as_bytes(xb)}}) {
                std::vector<uint8_t> ws, xs;
                const float want = kern.fn(n, placed(ws, kern.w, 0), placed(xs, kern.x, 0));
                for (const size_t offset : {size_t{1}, size_t{2}, size_t{3}, size_t{5}}) {
                    CAPTURE(offset);
                    const float got = kern.fn(n, placed(ws, kern.w, offset), placed(xs, kern.x, offset));
                    CHECK(got == want);
                }
            }
        }
    }
}
