// Fiber context switching (cuda_emu_context.h).
#include "cuda_emu/cuda_emu_context.h"

#include <cstdint>
#include <cstring>

#if TERN_EMU_ASM_CONTEXT

// tern_emu_switch(void** save_sp, void* new_sp): pushes the callee-saved registers (and the FP control
// words, which are callee-saved too) on the current stack, stores the stack pointer in *save_sp, loads
// new_sp and pops the same layout from there. A new context's stack is laid out as if it had switched
// away just before calling its entry function.
extern "C" void tern_emu_switch(void** save_sp, void* new_sp);

#if defined(__x86_64__)
asm(R"(
    .text
    .globl tern_emu_switch
    .type tern_emu_switch, @function
tern_emu_switch:
    .cfi_startproc
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .cfi_endproc
    .size tern_emu_switch, .-tern_emu_switch
    .section .note.GNU-stack,"",@progbits
    .text
)");
#elif defined(__aarch64__)
asm(R"(
    .text
    .globl tern_emu_switch
    .type tern_emu_switch, %function
tern_emu_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mrs x9, fpcr
    str x9, [sp, #160]
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    ldr x9, [sp, #160]
    msr fpcr, x9
    add sp, sp, #176
    ret
    .size tern_emu_switch, .-tern_emu_switch
    .section .note.GNU-stack,"",%progbits
    .text
)");
#endif

namespace cuda_emu::detail {

void context_make(Context& ctx, void* stack, size_t bytes, void (*entry)()) {
    uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t(15);
#if defined(__x86_64__)
    // From the saved stack pointer up: FP control words, r15 r14 r13 r12 rbx rbp, the return address
    // (entry), then a zero return address for entry itself. On entry rsp % 16 must be 8, as after a call.
    top -= 16;
    auto* slot = reinterpret_cast<uint64_t*>(top);
    slot[0] = reinterpret_cast<uint64_t>(entry);   // popped by ret: rsp = top + 8 at entry
    slot[1] = 0;
    uint64_t* regs = slot - 7;
    std::memset(regs, 0, 7 * sizeof(uint64_t));
    uint32_t mxcsr = 0;
    uint16_t fpucw = 0;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    std::memcpy(reinterpret_cast<char*>(regs), &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(regs) + 4, &fpucw, 2);
    ctx.sp = regs;
#else
    // 176 bytes of saved registers; x30 (the link register) holds entry, ret jumps there with sp = top.
    top -= 176;
    auto* regs = reinterpret_cast<uint64_t*>(top);
    std::memset(regs, 0, 176);
    regs[11] = reinterpret_cast<uint64_t>(entry);   // x30 at offset 88
    uint64_t fpcr = 0;
    asm volatile("mrs %0, fpcr" : "=r"(fpcr));
    regs[20] = fpcr;
    ctx.sp = regs;
#endif
}

void context_switch(Context& from, Context& to) { tern_emu_switch(&from.sp, to.sp); }

} // namespace cuda_emu::detail

#else

namespace cuda_emu::detail {

void context_make(Context& ctx, void* stack, size_t bytes, void (*entry)()) {
    getcontext(&ctx.uc);
    ctx.uc.uc_stack.ss_sp = stack;
    ctx.uc.uc_stack.ss_size = bytes;
    ctx.uc.uc_link = nullptr;
    makecontext(&ctx.uc, entry, 0);
}

void context_switch(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }

} // namespace cuda_emu::detail

#endif
