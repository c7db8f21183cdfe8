#pragma once
// CUDA atomics for the emulator (cuda_emu.h): real atomics, since blocks run on several OS threads.
// Every function returns the old value, as on the device. Misaligned addresses stop the kernel.
#include <cstdint>
#include <source_location>
#include <type_traits>

namespace cuda_emu::detail {

template <typename T> void check_atomic_address(const T* p, const std::source_location& where) {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(T) != 0) fault("misaligned atomic address", where);
    check_dependency_waited("an atomic", where);
}

template <typename T> using AtomicInt = std::enable_if_t<std::is_integral_v<T>, T>;

// Floating-point read-modify-write through a compare-and-swap on the bits.
template <typename F, typename Op> F atomic_float_rmw(F* p, Op op, const std::source_location& where) {
    using U = std::conditional_t<sizeof(F) == 4, uint32_t, uint64_t>;
    check_atomic_address(p, where);
    U* u = reinterpret_cast<U*>(p);
    U old_bits = __atomic_load_n(u, __ATOMIC_RELAXED);
    for (;;) {
        const F old = __builtin_bit_cast(F, old_bits);
        const U new_bits = __builtin_bit_cast(U, op(old));
        if (__atomic_compare_exchange_n(u, &old_bits, new_bits, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return old;
    }
}

template <typename T, typename Op> T atomic_int_rmw(T* p, Op op, const std::source_location& where) {
    check_atomic_address(p, where);
    T old = __atomic_load_n(p, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(p, &old, op(old), true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    return old;
}

} // namespace cuda_emu::detail

#define TERN_EMU_WHERE const std::source_location& where = std::source_location::current()

template <typename T> cuda_emu::detail::AtomicInt<T> atomicAdd(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    cuda_emu::detail::check_atomic_address(p, where);
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline float atomicAdd(float* p, float v, TERN_EMU_WHERE) {
    return cuda_emu::detail::atomic_float_rmw(p, [v](float o) { return o + v; }, where);
}
inline double atomicAdd(double* p, double v, TERN_EMU_WHERE) {
    return cuda_emu::detail::atomic_float_rmw(p, [v](double o) { return o + v; }, where);
}
template <typename T> cuda_emu::detail::AtomicInt<T> atomicSub(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    cuda_emu::detail::check_atomic_address(p, where);
    return __atomic_fetch_sub(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> cuda_emu::detail::AtomicInt<T> atomicExch(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    cuda_emu::detail::check_atomic_address(p, where);
    return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST);
}
inline float atomicExch(float* p, float v, TERN_EMU_WHERE) {
    return cuda_emu::detail::atomic_float_rmw(p, [v](float) { return v; }, where);
}
template <typename T> cuda_emu::detail::AtomicInt<T> atomicMax(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    return cuda_emu::detail::atomic_int_rmw(p, [v](T o) { return o > v ? o : v; }, where);
}
template <typename T> cuda_emu::detail::AtomicInt<T> atomicMin(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    return cuda_emu::detail::atomic_int_rmw(p, [v](T o) { return o < v ? o : v; }, where);
}
template <typename T> cuda_emu::detail::AtomicInt<T> atomicAnd(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    cuda_emu::detail::check_atomic_address(p, where);
    return __atomic_fetch_and(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> cuda_emu::detail::AtomicInt<T> atomicOr(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    cuda_emu::detail::check_atomic_address(p, where);
    return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST);
}
template <typename T> cuda_emu::detail::AtomicInt<T> atomicXor(T* p, std::type_identity_t<T> v, TERN_EMU_WHERE) {
    cuda_emu::detail::check_atomic_address(p, where);
    return __atomic_fetch_xor(p, v, __ATOMIC_SEQ_CST);
}
// ((old >= limit) ? 0 : old + 1) and ((old == 0 || old > limit) ? limit : old - 1), as the device defines them.
inline unsigned atomicInc(unsigned* p, unsigned limit, TERN_EMU_WHERE) {
    return cuda_emu::detail::atomic_int_rmw(p, [limit](unsigned o) { return o >= limit ? 0u : o + 1u; }, where);
}
inline unsigned atomicDec(unsigned* p, unsigned limit, TERN_EMU_WHERE) {
    return cuda_emu::detail::atomic_int_rmw(p, [limit](unsigned o) { return o == 0 || o > limit ? limit : o - 1u; },
                                            where);
}
template <typename T>
cuda_emu::detail::AtomicInt<T> atomicCAS(T* p, std::type_identity_t<T> compare, std::type_identity_t<T> v,
                                         TERN_EMU_WHERE) {
    cuda_emu::detail::check_atomic_address(p, where);
    __atomic_compare_exchange_n(p, &compare, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return compare;   // on failure the builtin wrote the current value here; on success it equals the old value
}

#undef TERN_EMU_WHERE
