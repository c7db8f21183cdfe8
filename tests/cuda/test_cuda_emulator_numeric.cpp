// The CUDA emulator's number types and intrinsics (cuda_emu/cuda_emu_types.h, cuda_emu_math.h):
// half / bfloat16 / fp8 e4m3 conversions exhaustively against the project's own codecs (quant/half.h,
// quant/fp8.h), which must agree with the device everywhere except NaN encodings (the device writes
// canonical NaNs); __dp4a / __dp2a against scalar formulas; half arithmetic; bit intrinsics.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/launch.h"
#include "quant/fp8.h"
#include "quant/half.h"

namespace {

uint32_t bits(float f) { return __builtin_bit_cast(uint32_t, f); }
float from_bits(uint32_t u) { return __builtin_bit_cast(float, u); }

// Floats worth converting: every value of the narrow format, the midpoints between neighbours (ties),
// one f32 ulp either side of those, and random bit patterns over the whole f32 range.
std::vector<float> probe_floats(const std::vector<float>& grid, size_t random_count) {
    std::vector<float> out;
    for (size_t i = 0; i < grid.size(); ++i) {
        const float a = grid[i];
        if (!std::isfinite(a)) continue;
        out.push_back(a);
        out.push_back(-a);
        if (i + 1 < grid.size() && std::isfinite(grid[i + 1])) {
            const float mid = static_cast<float>((static_cast<double>(a) + grid[i + 1]) / 2);
            for (float m : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
                out.push_back(m);
                out.push_back(-m);
            }
        }
    }
    std::mt19937 rng(2026);
    for (size_t i = 0; i < random_count; ++i) out.push_back(from_bits(static_cast<uint32_t>(rng())));
    for (float f : {INFINITY, -INFINITY, NAN, -NAN, 0.0f, -0.0f, 1e-45f, -1e-45f, 3.4028235e38f, -3.4028235e38f})
        out.push_back(f);
    return out;
}

} // namespace

TEST_CASE("__half conversions match quant/half.h over all 65536 halves and many floats") {
    std::vector<float> grid;
    for (uint32_t h = 0; h < 0x7C00; ++h) grid.push_back(tern::f16_to_f32(static_cast<uint16_t>(h)));
    grid.push_back(65536.0f);   // the rounding boundary past the largest finite half
    for (uint32_t h = 0; h < 65536; ++h) {
        const __half x = __ushort_as_half(static_cast<unsigned short>(h));
        const float f = __half2float(x);
        const bool nan = (h & 0x7C00u) == 0x7C00u && (h & 0x3FFu);
        CAPTURE(h);
        REQUIRE(bits(f) == (nan ? 0x7FFFFFFFu : bits(tern::f16_to_f32(static_cast<uint16_t>(h)))));
    }
    size_t n = 0;
    for (float f : probe_floats(grid, 2000000)) {
        const uint16_t want = std::isnan(f) ? 0x7FFF : tern::f32_to_f16(f);
        CAPTURE(bits(f));
        REQUIRE(__half_as_ushort(__float2half_rn(f)) == want);
        ++n;
    }
    CHECK(n > 2000000);
}

TEST_CASE("__nv_bfloat16 conversions match quant/half.h over all 65536 values and many floats") {
    std::vector<float> grid;
    for (uint32_t h = 0; h < 0x7F80; ++h) grid.push_back(tern::bf16_to_f32(static_cast<uint16_t>(h)));
    for (uint32_t h = 0; h < 65536; ++h) {
        const float f = __bfloat162float(__ushort_as_bfloat16(static_cast<unsigned short>(h)));
        CAPTURE(h);
        REQUIRE(bits(f) == (h << 16));
    }
    for (float f : probe_floats(grid, 2000000)) {
        const uint16_t want = std::isnan(f) ? 0x7FFF : tern::f32_to_bf16(f);
        CAPTURE(bits(f));
        REQUIRE(__bfloat16_as_ushort(__float2bfloat16_rn(f)) == want);
    }
    CHECK(__bfloat16_as_ushort(__float2bfloat16(3.4028235e38f)) == 0x7F80);   // rounds past the largest finite
}

TEST_CASE("__nv_fp8_e4m3 conversions (satfinite) match quant/fp8.h over all 256 codes and many floats") {
    std::vector<float> grid;
    for (uint32_t q = 0; q < 0x7F; ++q) grid.push_back(tern::e4m3_to_f32(static_cast<uint8_t>(q)));
    grid.push_back(512.0f);
    for (uint32_t q = 0; q < 256; ++q) {
        __nv_fp8_e4m3 x;
        x.__x = static_cast<__nv_fp8_storage_t>(q);
        const float f = static_cast<float>(x);
        CAPTURE(q);
        REQUIRE(bits(f) == ((q & 0x7F) == 0x7F ? 0x7FFFFFFFu : bits(tern::e4m3_to_f32(static_cast<uint8_t>(q)))));
        // Through half, as the device converts: exact for every code.
        const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(q), __NV_E4M3);
        if ((q & 0x7F) != 0x7F) REQUIRE(__half2float(__half(h)) == f);
    }
    for (float f : probe_floats(grid, 1000000)) {
        const uint8_t want = std::isnan(f) ? 0x7F : tern::f32_to_e4m3(f);
        CAPTURE(bits(f));
        REQUIRE(__nv_fp8_e4m3(f).__x == want);
        REQUIRE(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3) == want);
    }
    CHECK(__nv_cvt_float_to_fp8(500.0f, __NV_NOSAT, __NV_E4M3) == 0x7F);
    CHECK(__nv_cvt_float_to_fp8(450.0f, __NV_NOSAT, __NV_E4M3) == 0x7E);
}

TEST_CASE("half arithmetic rounds once, like the device's native half instructions") {
    std::mt19937 rng(5);
    for (int i = 0; i < 200000; ++i) {
        const __half a = __ushort_as_half(static_cast<unsigned short>(rng() & 0x7BFF)) ;
        const __half b = __ushort_as_half(static_cast<unsigned short>(rng() & 0xFBFF));
        const double exact_sum = static_cast<double>(float(a)) + float(b);
        const double exact_product = static_cast<double>(float(a)) * float(b);
        // Rounding the exact double result directly to half is the correctly rounded reference.
        CHECK(__half_as_ushort(__hadd(a, b)) == tern::f32_to_f16(static_cast<float>(exact_sum)));
        CHECK(__half_as_ushort(__hmul(a, b)) == tern::f32_to_f16(static_cast<float>(exact_product)));
    }
}

TEST_CASE("__dp4a and __dp2a against scalar formulas, wrapping like the device") {
    std::mt19937 rng(11);
    auto sbyte = [](uint32_t v, int i) { return static_cast<int>(static_cast<int8_t>(v >> (8 * i))); };
    auto ubyte = [](uint32_t v, int i) { return static_cast<int>((v >> (8 * i)) & 0xFF); };
    for (int t = 0; t < 100000; ++t) {
        const uint32_t a = rng(), b = rng(), c = t < 10 ? 0x7FFFFFF0u : rng();
        int64_t s = static_cast<int32_t>(c);
        uint64_t u = c;
        for (int i = 0; i < 4; ++i) s += sbyte(a, i) * sbyte(b, i), u += ubyte(a, i) * ubyte(b, i);
        REQUIRE(__dp4a(static_cast<int>(a), static_cast<int>(b), static_cast<int>(c)) ==
                static_cast<int32_t>(static_cast<uint32_t>(s)));
        REQUIRE(__dp4a(a, b, c) == static_cast<uint32_t>(u));
        int64_t lo = static_cast<int32_t>(c), hi = static_cast<int32_t>(c);
        for (int i = 0; i < 2; ++i) {
            const int half = static_cast<int16_t>(a >> (16 * i));
            lo += half * sbyte(b, i);
            hi += half * sbyte(b, 2 + i);
        }
        REQUIRE(__dp2a_lo(static_cast<int>(a), static_cast<int>(b), static_cast<int>(c)) ==
                static_cast<int32_t>(static_cast<uint32_t>(lo)));
        REQUIRE(__dp2a_hi(static_cast<int>(a), static_cast<int>(b), static_cast<int>(c)) ==
                static_cast<int32_t>(static_cast<uint32_t>(hi)));
    }
    CHECK(__dp4a(static_cast<int>(0x80808080u), static_cast<int>(0x80808080u), 0) == 4 * 128 * 128);
}

TEST_CASE("bit and float intrinsics") {
    CHECK(__popc(0xF0F0F0F0u) == 16);
    CHECK(__clz(1) == 31);
    CHECK(__clz(0) == 32);
    CHECK(__ffs(0x50) == 5);
    CHECK(__brev(1u) == 0x80000000u);
    CHECK(__byte_perm(0x33221100u, 0x77665544u, 0x7531) == 0x77553311u);   // bytes 1, 3, 5, 7
    CHECK(__byte_perm(0x33221100u, 0x77665544u, 0x0123) == 0x00112233u);   // byte reverse of x
    CHECK(__funnelshift_l(0x80000000u, 0x1u, 1) == 0x3u);
    CHECK(__funnelshift_r(0x1u, 0x1u, 1) == 0x80000000u);
    CHECK(__umulhi(0xFFFFFFFFu, 2u) == 1u);
    CHECK(__float2int_rn(2.5f) == 2);
    CHECK(__float2int_rn(3.5f) == 4);
    CHECK(__saturatef(-1.0f) == 0.0f);
    CHECK(__saturatef(NAN) == 0.0f);
    CHECK(rsqrtf(4.0f) == 0.5f);
    CHECK(__fmaf_rn(1.0f + 0x1p-23f, 1.0f - 0x1p-23f, -1.0f) == -0x1p-46f);   // one rounding
    CHECK(max(3, 5) == 5);
    CHECK(min(2.0f, -1.0f) == -1.0f);
}
