#include "quant/fp8.h"

#include <array>

namespace tern {
namespace {

constexpr std::array<float, 256> make_e4m3_table() {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
}

// Built at compile time: no mutable global, no static-initialisation order question.
constexpr std::array<float, 256> kE4m3Table = make_e4m3_table();

static_assert(f32_to_e4m3(448.0f) == 0x7E && f32_to_e4m3(-1e30f) == 0xFE, "saturation");
static_assert(f32_to_e4m3(0.001953125f) == 0x01, "smallest subnormal 2^-9");
static_assert(e4m3_to_f32(0x08) == 0.015625f, "smallest normal 2^-6");

} // namespace

const float* e4m3_table() { return kE4m3Table.data(); }

} // namespace tern
