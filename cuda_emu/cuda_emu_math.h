#pragma once
// Device math and bit intrinsics for the emulator (cuda_emu.h). The fast-math intrinsics (__expf,
// __logf, __sinf, __cosf, __powf, __fdividef) and rsqrtf are approximate on the device (a few ulp, and
// __fdividef returns 0 for huge divisors); here they are computed exactly, so kernels using them must be
// compared by tolerance. The _rn / _rz forms are exact in both.
#include <cmath>
#include <cstdint>

inline float __expf(float x) { return std::exp(x); }
inline float __exp10f(float x) { return std::pow(10.0f, x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __frsqrt_rn(float x) { return 1.0f / std::sqrt(x); }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __frcp_rn(float x) { return 1.0f / x; }
// A NaN that device arithmetic makes is always the canonical 0x7FFFFFFF (positive); x86 makes
// 0xFFC00000 (negative) for inf * 0, inf - inf, 0 / 0 and passes an operand's NaN through. The _rn
// forms give the device's NaN, so a kernel that lets a NaN's sign reach its output differs from the
// CPU here as it does on a GPU (seen: the f8 KV encoder's inf * 0).
inline float cuda_emu_device_nan(float r) { return r != r ? __builtin_bit_cast(float, 0x7FFFFFFFu) : r; }
inline float __fadd_rn(float a, float b) { return cuda_emu_device_nan(a + b); }
inline float __fsub_rn(float a, float b) { return cuda_emu_device_nan(a - b); }
inline float __fmul_rn(float a, float b) { return cuda_emu_device_nan(a * b); }
inline float __fdiv_rn(float a, float b) { return cuda_emu_device_nan(a / b); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return cuda_emu_device_nan(std::fma(a, b, c)); }
inline float __saturatef(float x) { return x >= 1.0f ? 1.0f : (x > 0.0f ? x : 0.0f); }   // NaN -> 0

inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
inline int __float2int_rz(float x) { return static_cast<int>(x); }
inline int __float2int_rd(float x) { return static_cast<int>(std::floor(x)); }
inline int __float2int_ru(float x) { return static_cast<int>(std::ceil(x)); }
inline unsigned __float2uint_rn(float x) { return static_cast<unsigned>(std::nearbyint(x)); }
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned x) { return static_cast<float>(x); }
inline int __float_as_int(float x) { return __builtin_bit_cast(int, x); }
inline unsigned __float_as_uint(float x) { return __builtin_bit_cast(unsigned, x); }
inline float __int_as_float(int x) { return __builtin_bit_cast(float, x); }
inline float __uint_as_float(unsigned x) { return __builtin_bit_cast(float, x); }
inline long long __double_as_longlong(double x) { return __builtin_bit_cast(long long, x); }
inline double __longlong_as_double(long long x) { return __builtin_bit_cast(double, x); }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
// Byte i of the result is byte (s >> 4i) & 7 of the 8-byte value {y:x}.
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xFFu) << (8 * i);
    return r;
}
inline unsigned __funnelshift_l(unsigned lo, unsigned hi, unsigned shift) {
    const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
    return static_cast<unsigned>((v << (shift & 31u)) >> 32);
}
inline unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
    return static_cast<unsigned>(v >> (shift & 31u));
}
inline unsigned __umulhi(unsigned a, unsigned b) { return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32); }
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<int64_t>(a) * b) >> 32); }
inline int __mul24(int a, int b) {
    const int64_t a24 = static_cast<int32_t>(static_cast<uint32_t>(a) << 8) >> 8;
    const int64_t b24 = static_cast<int32_t>(static_cast<uint32_t>(b) << 8) >> 8;
    return static_cast<int>(static_cast<uint32_t>(a24 * b24));
}

// Four signed (or unsigned) byte products summed into c; the sum wraps modulo 2^32 as on the device.
inline int __dp4a(int a, int b, int c) {
    uint32_t acc = static_cast<uint32_t>(c);
    for (int i = 0; i < 4; ++i) {
        const int32_t x = static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i));
        const int32_t y = static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
        acc += static_cast<uint32_t>(x * y);
    }
    return static_cast<int>(acc);
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xFFu) * ((b >> (8 * i)) & 0xFFu);
    return c;
}
// Two 16-bit halves of a times two bytes of b: the low bytes (0, 1) for _lo, the high ones (2, 3) for _hi.
inline int tern_emu_dp2a(int a, int b, int c, int byte0) {
    uint32_t acc = static_cast<uint32_t>(c);
    for (int i = 0; i < 2; ++i) {
        const int32_t x = static_cast<int16_t>(static_cast<uint32_t>(a) >> (16 * i));
        const int32_t y = static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * (byte0 + i)));
        acc += static_cast<uint32_t>(x * y);
    }
    return static_cast<int>(acc);
}
inline int __dp2a_lo(int a, int b, int c) { return tern_emu_dp2a(a, b, c, 0); }
inline int __dp2a_hi(int a, int b, int c) { return tern_emu_dp2a(a, b, c, 2); }

// The device's overloaded min / max.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline double min(double a, double b) { return std::fmin(a, b); }
inline double max(double a, double b) { return std::fmax(a, b); }

template <typename T> T __ldg(const T* p) { return *p; }
template <typename T> T __ldcg(const T* p) { return *p; }   // L2 only on the device; one memory here
template <typename T> T __ldcs(const T* p) { return *p; }
template <typename T> void __stcs(T* p, T v) { *p = v; }
