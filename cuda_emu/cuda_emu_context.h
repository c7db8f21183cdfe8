#pragma once
// Execution contexts for the emulator's fibers. glibc's swapcontext saves and restores the signal mask
// with a system call on every switch (about 1 us each here); a CUDA thread switches at every barrier
// and shuffle, so on x86-64 and AArch64 a few instructions of assembly save the callee-saved registers
// and the stack pointer instead (signal masks never change inside a kernel). Other targets fall back
// to ucontext.
#include <cstddef>

#if defined(__x86_64__) || defined(__aarch64__)
#define TERN_EMU_ASM_CONTEXT 1
#else
#define TERN_EMU_ASM_CONTEXT 0
#include <ucontext.h>
#endif

namespace cuda_emu::detail {

struct Context {
#if TERN_EMU_ASM_CONTEXT
    void* sp = nullptr;   // the saved stack pointer; the registers sit on that stack
#else
    ucontext_t uc;
#endif
};

// Prepares `ctx` to start `entry` (which must never return) on the given stack.
void context_make(Context& ctx, void* stack, size_t bytes, void (*entry)());
// Saves the running context into `from` and resumes `to`; returns when something switches back to `from`.
void context_switch(Context& from, Context& to);

} // namespace cuda_emu::detail
