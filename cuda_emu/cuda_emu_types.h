#pragma once
// CUDA's vector types and the 16- and 8-bit float types for the emulator (cuda_emu.h), with the
// device's conversions bit for bit:
//   float -> __half: round to nearest even, overflow to inf, NaN -> canonical 0x7FFF (sign dropped);
//   __half -> float: exact, NaN -> canonical 0x7FFFFFFF;
//   float -> __nv_bfloat16: round to nearest even, NaN -> canonical 0x7FFF; bf16 -> float: bits << 16;
//   float -> __nv_fp8_e4m3 (satfinite): round to nearest even, |x| >= 448 and inf -> +-448, NaN -> 0x7F;
//   e4m3 -> float: exact (through half on the device), NaN -> canonical 0x7FFFFFFF.
// These are written independently of quant/half.h and quant/fp8.h (through _Float16 and float
// rounding), so the tests comparing the two check both.
#include <cmath>
#include <cstdint>

#define TERN_EMU_VEC2(T, N, A)                                                                                       \
    struct __attribute__((aligned(A))) N##2 {                                                                        \
        T x, y;                                                                                                      \
    };                                                                                                               \
    inline N##2 make_##N##2(T x, T y) { return N##2{x, y}; }
#define TERN_EMU_VEC4(T, N, A)                                                                                       \
    struct __attribute__((aligned(A))) N##4 {                                                                        \
        T x, y, z, w;                                                                                                \
    };                                                                                                               \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return N##4{x, y, z, w}; }
TERN_EMU_VEC2(signed char, char, 2)
TERN_EMU_VEC4(signed char, char, 4)
TERN_EMU_VEC2(unsigned char, uchar, 2)
TERN_EMU_VEC4(unsigned char, uchar, 4)
TERN_EMU_VEC2(short, short, 4)
TERN_EMU_VEC4(short, short, 8)
TERN_EMU_VEC2(unsigned short, ushort, 4)
TERN_EMU_VEC4(unsigned short, ushort, 8)
TERN_EMU_VEC2(int, int, 8)
TERN_EMU_VEC4(int, int, 16)
TERN_EMU_VEC2(unsigned, uint, 8)
TERN_EMU_VEC4(unsigned, uint, 16)
TERN_EMU_VEC2(float, float, 8)
TERN_EMU_VEC4(float, float, 16)
TERN_EMU_VEC2(double, double, 16)
#undef TERN_EMU_VEC2
#undef TERN_EMU_VEC4
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

namespace cuda_emu::detail {

inline uint16_t f32_to_f16_bits(float f) {
    if (std::isnan(f)) return 0x7FFF;
    return __builtin_bit_cast(uint16_t, static_cast<_Float16>(f));   // IEEE RNE, overflow to inf
}
inline float f16_bits_to_f32(uint16_t h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu)) return __builtin_bit_cast(float, 0x7FFFFFFFu);
    return static_cast<float>(__builtin_bit_cast(_Float16, h));
}
// Nearest of the two bf16 neighbours by exact double arithmetic, ties to the even one.
inline uint16_t f32_to_bf16_bits(float f) {
    if (std::isnan(f)) return 0x7FFF;
    const uint32_t bits = __builtin_bit_cast(uint32_t, f);
    const uint32_t lo = bits & 0xFFFF0000u;
    if (lo == bits) return static_cast<uint16_t>(bits >> 16);
    const uint32_t hi = lo + 0x10000u;   // next magnitude up (0x7F80 inf past the largest finite)
    const double x = std::fabs(static_cast<double>(f));
    const double dlo = x - std::fabs(static_cast<double>(__builtin_bit_cast(float, lo)));
    const double ahi = (hi & 0x7FFFFFFFu) == 0x7F800000u ? 0x1p128 : std::fabs(double(__builtin_bit_cast(float, hi)));
    const double dhi = ahi - x;
    const bool up = dhi < dlo || (dhi == dlo && ((lo >> 16) & 1u));
    return static_cast<uint16_t>((up ? hi : lo) >> 16);
}
inline float bf16_bits_to_f32(uint16_t h) { return __builtin_bit_cast(float, static_cast<uint32_t>(h) << 16); }

// Rounds |x| to the e4m3 grid with the FPU (exact scaling by powers of two, nearbyint in the default
// round-to-nearest-even mode), then encodes the grid point.
inline uint8_t f32_to_e4m3_satfinite(float f) {
    if (std::isnan(f)) return 0x7F;
    const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    const float a = std::fabs(f);
    if (a >= 448.0f) return sign | 0x7E;
    int e = 0;
    std::frexp(a, &e);                       // a = m * 2^e, m in [0.5, 1)
    const int exp = std::max(e - 1, -6);     // e4m3 exponent of a; subnormals share 2^-6's spacing
    const float q = std::ldexp(std::nearbyint(std::ldexp(a, 3 - exp)), exp - 3);
    if (q == 0.0f) return sign;
    if (q >= 448.0f) return sign | 0x7E;
    std::frexp(q, &e);
    const int qe = e - 1;
    if (qe < -6) return sign | static_cast<uint8_t>(std::ldexp(q, 9));                  // m * 2^-9
    const int mant = static_cast<int>(std::ldexp(q, 3 - qe)) - 8;                         // 1.mmm
    return sign | static_cast<uint8_t>(((qe + 7) << 3) | mant);
}
inline float e4m3_to_f32(uint8_t q) {
    if ((q & 0x7Fu) == 0x7Fu) return __builtin_bit_cast(float, 0x7FFFFFFFu);
    const int exp = (q >> 3) & 0xF, mant = q & 7;
    const float mag = exp == 0 ? std::ldexp(static_cast<float>(mant), -9) : std::ldexp(1.0f + mant / 8.0f, exp - 7);
    return (q & 0x80u) ? -mag : mag;
}

} // namespace cuda_emu::detail

struct __half_raw {
    unsigned short x;
};
struct __half {
    unsigned short __x;
    __half() = default;
    __half(__half_raw r) : __x(r.x) {}
    __half(float f) : __x(cuda_emu::detail::f32_to_f16_bits(f)) {}
    __half(double f) : __half(static_cast<float>(f)) {}
    __half(int i) : __half(static_cast<float>(i)) {}
    operator float() const { return cuda_emu::detail::f16_bits_to_f32(__x); }
    operator __half_raw() const { return __half_raw{__x}; }
};
struct __half2 {
    __half x, y;
};
typedef __half half;
typedef __half2 half2;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return static_cast<float>(h); }
inline __half2 __float2half2_rn(float f) { return __half2{__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__half(a), __half(b)}; }
inline __half2 __float22half2_rn(float2 v) { return __half2{__half(v.x), __half(v.y)}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline __half2 __halves2half2(__half a, __half b) { return __half2{a, b}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { return __half(__half_raw{u}); }
// One rounding of the exact result: float (24 bits) holds the exact sum, difference and product of two
// halves' 11-bit significands closely enough that rounding it to half is the correctly rounded result.
inline __half __hadd(__half a, __half b) { return __half(float(a) + float(b)); }
inline __half __hsub(__half a, __half b) { return __half(float(a) - float(b)); }
inline __half __hmul(__half a, __half b) { return __half(float(a) * float(b)); }
inline __half __hdiv(__half a, __half b) { return __half(float(a) / float(b)); }
inline __half __hfma(__half a, __half b, __half c) { return __half(std::fma(double(a), double(b), double(c))); }
inline __half __hneg(__half a) { return __half(__half_raw{static_cast<unsigned short>(a.__x ^ 0x8000u)}); }
inline __half __habs(__half a) { return __half(__half_raw{static_cast<unsigned short>(a.__x & 0x7FFFu)}); }
inline __half __hmax(__half a, __half b) { return __half(std::fmax(float(a), float(b))); }
inline __half __hmin(__half a, __half b) { return __half(std::fmin(float(a), float(b))); }
inline __half2 __hadd2(__half2 a, __half2 b) { return __half2{__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return __half2{__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
    return __half2{__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}

struct __nv_bfloat16_raw {
    unsigned short x;
};
struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(__nv_bfloat16_raw r) : __x(r.x) {}
    __nv_bfloat16(float f) : __x(cuda_emu::detail::f32_to_bf16_bits(f)) {}
    __nv_bfloat16(double f) : __nv_bfloat16(static_cast<float>(f)) {}
    operator float() const { return cuda_emu::detail::bf16_bits_to_f32(__x); }
    operator __nv_bfloat16_raw() const { return __nv_bfloat16_raw{__x}; }
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return static_cast<float>(h); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
    return __nv_bfloat162{__nv_bfloat16(a), __nv_bfloat16(b)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return __nv_bfloat16(__nv_bfloat16_raw{u}); }

typedef unsigned char __nv_fp8_storage_t;
enum __nv_saturation_t { __NV_NOSAT, __NV_SATFINITE };
enum __nv_fp8_interpretation_t { __NV_E4M3, __NV_E5M2 };

// Only E4M3 is emulated; __NV_NOSAT turns what satfinite clamps (|x| >= 464 rounds past 448, and inf)
// into NaN as the device does.
inline __nv_fp8_storage_t __nv_cvt_float_to_fp8(float x, __nv_saturation_t sat, __nv_fp8_interpretation_t) {
    const uint8_t q = cuda_emu::detail::f32_to_e4m3_satfinite(x);
    if (sat == __NV_NOSAT && (q & 0x7Fu) == 0x7Eu && !(std::fabs(x) < 464.0f)) return q | 0x7Fu;
    return q;
}
inline __half_raw __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t q, __nv_fp8_interpretation_t) {
    const float f = cuda_emu::detail::e4m3_to_f32(q);
    return __half_raw{cuda_emu::detail::f32_to_f16_bits(f)};
}
struct __nv_fp8_e4m3 {
    __nv_fp8_storage_t __x;
    __nv_fp8_e4m3() = default;
    explicit __nv_fp8_e4m3(float f) : __x(cuda_emu::detail::f32_to_e4m3_satfinite(f)) {}
    explicit __nv_fp8_e4m3(double f) : __nv_fp8_e4m3(static_cast<float>(f)) {}
    explicit __nv_fp8_e4m3(__half h) : __nv_fp8_e4m3(static_cast<float>(h)) {}
    explicit operator float() const { return cuda_emu::detail::e4m3_to_f32(__x); }
    explicit operator __half() const { return __half(static_cast<float>(*this)); }
};
