// The emulator's execution model (cuda_emu.h): one fiber per CUDA thread, a block's fibers switched
// cooperatively on one OS thread, blocks spread over OpenMP threads.
//
// A fiber (cuda_emu_context.h) runs until it calls a synchronising intrinsic that cannot complete yet (a barrier or
// warp rendezvous still missing lanes) or exits; then it switches back to its block's scheduler, which runs the next
// runnable fiber in thread order. The last lane to arrive completes the operation for all and carries on. A pass over
// the block with nothing runnable while threads are still live is a deadlock.
#include <sys/mman.h>
#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "cuda_emu/cuda_emu.h"
#include "cuda_emu/cuda_emu_context.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define TERN_EMU_ASAN 1
#else
#define TERN_EMU_ASAN 0
#endif

thread_local uint3 threadIdx;
thread_local uint3 blockIdx;
thread_local dim3 blockDim;
thread_local dim3 gridDim;

namespace cuda_emu {

namespace detail {
namespace {

// ASan instruments every frame: fibers need more stack than the kernels' own frames suggest.
constexpr size_t kStackBytes = TERN_EMU_ASAN ? 512 * 1024 : 256 * 1024;
constexpr size_t kGuardBytes = 4096;
constexpr size_t kStaleTopBytes = 16 * 1024;   // covers the frames an exiting fiber leaves behind
constexpr size_t kRedZone = 64;   // bytes of 0xA5 around the dynamic shared arena

const char* op_name(WarpOp op) {
    switch (op) {
    case WarpOp::syncwarp: return "__syncwarp";
    case WarpOp::shfl_idx: return "__shfl_sync";
    case WarpOp::shfl_up: return "__shfl_up_sync";
    case WarpOp::shfl_down: return "__shfl_down_sync";
    case WarpOp::shfl_xor: return "__shfl_xor_sync";
    case WarpOp::ballot: return "__ballot_sync";
    case WarpOp::any: return "__any_sync";
    case WarpOp::all: return "__all_sync";
    case WarpOp::match_any: return "__match_any_sync";
    case WarpOp::match_all: return "__match_all_sync";
    case WarpOp::reduce_add: return "__reduce_add_sync";
    case WarpOp::reduce_min_u:
    case WarpOp::reduce_min_i: return "__reduce_min_sync";
    case WarpOp::reduce_max_u:
    case WarpOp::reduce_max_i: return "__reduce_max_sync";
    }
    return "?";
}

std::string hex(unsigned v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

std::string at(const std::source_location& w) {
    return std::string(" at ") + w.file_name() + ":" + std::to_string(w.line());
}

struct Stack {
    unsigned char* base = nullptr;   // the guard page; usable memory starts kGuardBytes above
    bool dirty = false;              // a fiber was abandoned on it (ASan poison may remain)
};

enum class State : uint8_t { runnable, at_barrier, at_warp, exited };

struct Fiber {
    Context ctx;
    Stack* stack = nullptr;
    uint3 tid{};
    unsigned linear = 0, warp = 0, lane = 0;
    State state = State::runnable;
    std::source_location where;   // the synchronising call it waits in
    WarpOp waiting_op = WarpOp::syncwarp;
    unsigned waiting_mask = 0;
    uint64_t result = 0;
    void* fake_stack = nullptr;
    bool waited = false;   // called cudaGridDependencySynchronize (a programmatic dependent launch)
};

struct PendingWarpOp {
    WarpOp op;
    unsigned mask, arrived = 0;
    int width;
    uint64_t value[32];
    int arg[32];
    Fiber* fibers[32];
    std::source_location where;
};

struct Warp {
    unsigned exists = 0;   // lanes that belong to the block
    unsigned exited = 0;
    std::vector<PendingWarpOp> pending;
};

struct Block {
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    unsigned live = 0;
    unsigned barrier_arrived = 0;
    int barrier_sum = 0;
    BarrierOp barrier_op = BarrierOp::sync;
    std::vector<Fiber*> barrier_waiters;
    std::string error;
    Context sched_ctx;
    void* sched_fake_stack = nullptr;
    const void* sched_stack_bottom = nullptr;
    size_t sched_stack_size = 0;
    const std::function<void()>* body = nullptr;
    Fiber* current = nullptr;
    std::vector<unsigned char> dyn;   // red zone | arena | red zone
    size_t dyn_bytes = 0;
    bool programmatic = false;        // launched as a programmatic dependent (launch_dependent, launch.h)
};

// One per OS thread that runs blocks.
struct Worker {
    std::deque<Stack> stacks;   // a deque: fibers keep pointers to their stacks while more are added
    Block block;

    // Runs when the OS thread exits (OpenMP ends threads when a launch asks for fewer than the last one).
    // The stacks still hold ASan poison of frames that never returned (every fiber's first frames, whole
    // call chains abandoned by a fault): cleared before unmapping, or the next mapping at these addresses
    // (another worker's fiber stacks, laid out differently) inherits it and ASan reports the accesses of
    // its frames, whose prologues poison only their red zones.
    ~Worker() {
        for (Stack& s : stacks) {
#if TERN_EMU_ASAN
            ASAN_UNPOISON_MEMORY_REGION(s.base + kGuardBytes, kStackBytes);
#endif
            munmap(s.base, kStackBytes + kGuardBytes);
        }
    }
    Stack& stack(size_t i) {
        while (stacks.size() <= i) {
            void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) throw std::bad_alloc();
            mprotect(p, kGuardBytes, PROT_NONE);   // a stack overflow faults instead of corrupting
            stacks.push_back(Stack{static_cast<unsigned char*>(p)});
        }
        return stacks[i];
    }
};

thread_local std::unique_ptr<Worker> t_worker;
std::atomic<int> g_workers{0};
std::atomic<long long> g_clock{0};

Worker& worker() {
    if (!t_worker) t_worker = std::make_unique<Worker>();   // kept for the OS thread's life: stacks are reused
    return *t_worker;
}

Block& current_block(const std::source_location& where) {
    Worker* w = t_worker.get();
    if (!w || !w->block.current) {
        throw Fault(std::string("CUDA device intrinsic called outside a kernel launch") + at(where));
    }
    return w->block;
}

void start_switch(void** fake_save, const void* bottom, size_t size) {
#if TERN_EMU_ASAN
    __sanitizer_start_switch_fiber(fake_save, bottom, size);
#else
    (void)fake_save, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake_save, const void** bottom_old, size_t* size_old) {
#if TERN_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake_save, bottom_old, size_old);
#else
    (void)fake_save, (void)bottom_old, (void)size_old;
#endif
}

// From a fiber back to the scheduler; returns when the scheduler runs this fiber again.
void yield_to_scheduler(Block& b, Fiber& f) {
    start_switch(&f.fake_stack, b.sched_stack_bottom, b.sched_stack_size);
    context_switch(f.ctx, b.sched_ctx);
    finish_switch(f.fake_stack, nullptr, nullptr);
}

// Leaves the fiber for good (exit or fault): its fake stack is released, its frames abandoned.
[[noreturn]] void leave_fiber(Block& b, Fiber& f) {
    start_switch(nullptr, b.sched_stack_bottom, b.sched_stack_size);
    context_switch(f.ctx, b.sched_ctx);   // never resumed: the next block remakes the context
    std::abort();
}

std::string thread_name(const Block& b, const Fiber& f) {
    (void)b;
    std::ostringstream s;
    s << "block (" << blockIdx.x << "," << blockIdx.y << "," << blockIdx.z << ") thread (" << f.tid.x << ","
      << f.tid.y << "," << f.tid.z << ") [warp " << f.warp << " lane " << f.lane << "]";
    return s.str();
}

// Unwinds the faulting fiber to fiber_main, so that its frames' temporaries are destroyed (no leaks, no
// stale ASan poison); the block's other fibers are abandoned where they wait.
struct FiberAbort {};

[[noreturn]] void fiber_fault(Block& b, Fiber& f, const std::string& what) {
    if (b.error.empty()) b.error = thread_name(b, f) + ": " + what;
    throw FiberAbort{};
}

void check_dynamic_shared_redzones(Block& b, const char* when) {
    if (b.dyn.empty()) return;
#if TERN_EMU_ASAN
    ASAN_UNPOISON_MEMORY_REGION(b.dyn.data(), b.dyn.size());
#endif
    auto clean = [](const unsigned char* p) {
        for (size_t i = 0; i < kRedZone; ++i)
            if (p[i] != 0xA5) return false;
        return true;
    };
    const bool ok = clean(b.dyn.data()) && clean(b.dyn.data() + kRedZone + b.dyn_bytes);
#if TERN_EMU_ASAN
    ASAN_POISON_MEMORY_REGION(b.dyn.data(), kRedZone);
    ASAN_POISON_MEMORY_REGION(b.dyn.data() + kRedZone + b.dyn_bytes, kRedZone);
#endif
    if (!ok && b.error.empty()) {
        b.error = "dynamic shared memory (" + std::to_string(b.dyn_bytes) + " bytes) written out of bounds, seen " +
                  when + " in block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
                  std::to_string(blockIdx.z) + ")";
    }
}

void release_barrier(Block& b) {
    int result = 0;
    switch (b.barrier_op) {
    case BarrierOp::sync: break;
    case BarrierOp::count: result = b.barrier_sum; break;
    case BarrierOp::all: result = b.barrier_sum == static_cast<int>(b.barrier_arrived); break;
    case BarrierOp::any: result = b.barrier_sum != 0; break;
    }
    for (Fiber* w : b.barrier_waiters) {
        w->result = static_cast<uint64_t>(result);
        w->state = State::runnable;
    }
    b.barrier_waiters.clear();
    b.barrier_arrived = 0;
    b.barrier_sum = 0;
}

void on_exit(Block& b, Fiber& f) {
    // A programmatic dependent may start before the kernel it follows ends; a thread that never waited for it
    // may have read what that kernel had not yet written (or written what it still reads).
    if (b.programmatic && !f.waited)
        fiber_fault(b, f,
                    "exited without cudaGridDependencySynchronize() in a kernel launched as a programmatic dependent "
                    "(it must wait before touching memory the previous kernel writes or reads)");
    f.state = State::exited;
    --b.live;
    Warp& w = b.warps[f.warp];
    w.exited |= 1u << f.lane;
    for (const PendingWarpOp& p : w.pending) {
        if (p.mask & (1u << f.lane)) {
            fiber_fault(b, f,
                        std::string("exited while lanes ") + hex(p.arrived) + " wait for it in " + op_name(p.op) +
                            "(mask " + hex(p.mask) + ")" + at(p.where));
        }
    }
    if (b.barrier_arrived > 0 && b.barrier_arrived == b.live) release_barrier(b);
}

void fiber_main() {
    Worker& wk = *t_worker;
    Block& b = wk.block;
    Fiber& f = *b.current;
    finish_switch(nullptr, &b.sched_stack_bottom, &b.sched_stack_size);
    try {
        (*b.body)();
        on_exit(b, f);
    } catch (const FiberAbort&) {
    } catch (const std::exception& e) {
        if (b.error.empty()) b.error = thread_name(b, f) + ": exception thrown in the kernel: " + e.what();
    } catch (...) {
        if (b.error.empty()) b.error = thread_name(b, f) + ": exception thrown in the kernel";
    }
    if (f.state != State::exited) {   // left by a fault: the block stops
        f.state = State::exited;
        f.stack->dirty = true;
    }
    leave_fiber(b, f);
}

uint64_t compute_lane(const PendingWarpOp& p, unsigned lane, Block& b, Fiber& self) {
    const unsigned width = static_cast<unsigned>(p.width);
    const unsigned seg_lo = lane & ~(width - 1u), seg_hi = seg_lo | (width - 1u);
    int src = -1;
    switch (p.op) {
    case WarpOp::syncwarp: return 0;
    case WarpOp::shfl_idx: src = static_cast<int>(seg_lo | (static_cast<unsigned>(p.arg[lane]) & (width - 1u))); break;
    case WarpOp::shfl_up: {
        const int j = static_cast<int>(lane) - p.arg[lane];
        src = j >= static_cast<int>(seg_lo) ? j : static_cast<int>(lane);
        break;
    }
    case WarpOp::shfl_down: {
        const long j = static_cast<long>(lane) + p.arg[lane];
        src = j <= static_cast<long>(seg_hi) ? static_cast<int>(j) : static_cast<int>(lane);
        break;
    }
    case WarpOp::shfl_xor: {
        const unsigned j = (lane ^ static_cast<unsigned>(p.arg[lane])) & 31u;
        src = j <= seg_hi ? static_cast<int>(j) : static_cast<int>(lane);
        break;
    }
    case WarpOp::ballot:
    case WarpOp::any:
    case WarpOp::all: {
        unsigned bits = 0;
        for (unsigned l = 0; l < 32; ++l)
            if ((p.mask >> l) & 1u && p.value[l]) bits |= 1u << l;
        if (p.op == WarpOp::ballot) return bits;
        if (p.op == WarpOp::any) return bits != 0;
        return bits == p.mask;
    }
    case WarpOp::match_any:
    case WarpOp::match_all: {
        unsigned same = 0;
        for (unsigned l = 0; l < 32; ++l)
            if ((p.mask >> l) & 1u && p.value[l] == p.value[lane]) same |= 1u << l;
        if (p.op == WarpOp::match_any) return same;
        return same == p.mask ? p.mask : 0;
    }
    case WarpOp::reduce_add:
    case WarpOp::reduce_min_u:
    case WarpOp::reduce_max_u:
    case WarpOp::reduce_min_i:
    case WarpOp::reduce_max_i: {
        bool first = true;
        uint32_t acc = 0;
        for (unsigned l = 0; l < 32; ++l) {
            if (!((p.mask >> l) & 1u)) continue;
            const uint32_t v = static_cast<uint32_t>(p.value[l]);
            if (first) acc = v;
            else if (p.op == WarpOp::reduce_add) acc += v;
            else if (p.op == WarpOp::reduce_min_u) acc = std::min(acc, v);
            else if (p.op == WarpOp::reduce_max_u) acc = std::max(acc, v);
            else if (p.op == WarpOp::reduce_min_i)
                acc = static_cast<uint32_t>(std::min(static_cast<int32_t>(acc), static_cast<int32_t>(v)));
            else acc = static_cast<uint32_t>(std::max(static_cast<int32_t>(acc), static_cast<int32_t>(v)));
            first = false;
        }
        return acc;
    }
    }
    if (!((p.mask >> src) & 1u)) {
        const bool gone = !((b.warps[self.warp].exists >> src) & 1u);
        fiber_fault(b, self,
                    std::string(op_name(p.op)) + "(mask " + hex(p.mask) + "): lane " + std::to_string(lane) +
                        " reads lane " + std::to_string(src) +
                        (gone ? ", which does not exist in this block" : ", which is not in the mask") + at(p.where));
    }
    return p.value[src];
}

} // namespace

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const std::source_location& where) {
    Block& b = current_block(where);
    Fiber& f = *b.current;
    Warp& w = b.warps[f.warp];
    const unsigned me = 1u << f.lane;
    const char* name = op_name(op);   // (only the fault messages below build strings)
    if (!(mask & me)) fiber_fault(b, f, name + ("(mask " + hex(mask)) + ") leaves out the calling lane" + at(where));
    if (mask & ~w.exists) {
        fiber_fault(b, f,
                    name + ("(mask " + hex(mask)) + ") names lanes " + hex(mask & ~w.exists) +
                        " that do not exist (the block has " + std::to_string(b.fibers.size()) + " threads)" +
                        at(where));
    }
    if (mask & w.exited) {
        fiber_fault(b, f,
                    name + ("(mask " + hex(mask)) + ") names lanes " + hex(mask & w.exited) + " that have exited" +
                        at(where));
    }
    if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
        fiber_fault(b, f,
                    std::string(name) + ": width " + std::to_string(width) + " is not a power of two in 1..32" +
                        at(where));
    }
    PendingWarpOp* p = nullptr;
    for (PendingWarpOp& q : w.pending) {
        if (q.mask != mask) continue;
        if (q.op != op || q.width != width) {
            fiber_fault(b, f,
                        name + ("(mask " + hex(mask)) + ", width " + std::to_string(width) + ")" + at(where) +
                            " meets lanes " + hex(q.arrived) + " waiting in " + op_name(q.op) + "(width " +
                            std::to_string(q.width) + ")" + at(q.where) + " with the same mask");
        }
        p = &q;
        break;
    }
    if (!p) {
        w.pending.push_back(PendingWarpOp{op, mask, 0, width, {}, {}, {}, where});
        p = &w.pending.back();
    }
    p->arrived |= me;
    p->value[f.lane] = value;
    p->arg[f.lane] = arg;
    p->fibers[f.lane] = &f;
    if (p->arrived != mask) {
        f.state = State::at_warp;
        f.where = where;
        f.waiting_op = op;
        f.waiting_mask = mask;
        yield_to_scheduler(b, f);
        return f.result;
    }
    // Last to arrive: compute every lane's result, wake the others, carry on.
    const PendingWarpOp done = *p;
    w.pending.erase(w.pending.begin() + (p - w.pending.data()));
    for (unsigned l = 0; l < 32; ++l) {
        if (!((done.mask >> l) & 1u)) continue;
        done.fibers[l]->result = compute_lane(done, l, b, f);
    }
    for (unsigned l = 0; l < 32; ++l) {
        if ((done.mask >> l) & 1u && done.fibers[l] != &f) done.fibers[l]->state = State::runnable;
    }
    return f.result;
}

int block_barrier(BarrierOp op, int predicate, const std::source_location& where) {
    Block& b = current_block(where);
    Fiber& f = *b.current;
    if (b.barrier_arrived > 0 && op != b.barrier_op) {
        fiber_fault(b, f, "__syncthreads variants differ between threads of the block" + at(where));
    }
    b.barrier_op = op;
    b.barrier_sum += predicate;
    ++b.barrier_arrived;
    b.barrier_waiters.push_back(&f);
    if (b.barrier_arrived == b.live) {
        check_dynamic_shared_redzones(b, "at __syncthreads");   // once per barrier, by the last to arrive
        if (!b.error.empty()) fiber_fault(b, f, "");
        release_barrier(b);
        return static_cast<int>(f.result);
    }
    f.state = State::at_barrier;
    f.where = where;
    yield_to_scheduler(b, f);
    return static_cast<int>(f.result);
}

unsigned active_mask() {
    Block& b = current_block(std::source_location::current());
    const Fiber& f = *b.current;
    const Warp& w = b.warps[f.warp];
    return w.exists & ~w.exited;
}

unsigned char* dynamic_shared_base(size_t* bytes) {
    Block& b = current_block(std::source_location::current());
    if (bytes) *bytes = b.dyn_bytes;
    return b.dyn.data() + kRedZone;
}

void fault(const std::string& what, const std::source_location& where) {
    Block& b = current_block(where);
    fiber_fault(b, *b.current, what + at(where));
}

void grid_dependency_wait(const std::source_location& where) { current_block(where).current->waited = true; }

void check_dependency_waited(const char* what, const std::source_location& where) {
    Block& b = current_block(where);
    if (b.programmatic && !b.current->waited)
        fiber_fault(b, *b.current,
                    std::string(what) + " before cudaGridDependencySynchronize() in a kernel launched as a "
                                        "programmatic dependent" + at(where));
}

long long clock_counter() { return g_clock.fetch_add(1, std::memory_order_relaxed); }

namespace {

std::string deadlock_message(const Block& b) {
    std::ostringstream s;
    s << "deadlock in block (" << blockIdx.x << "," << blockIdx.y << "," << blockIdx.z << "): " << b.live
      << " live threads, none can proceed.";
    int shown = 0;
    if (b.barrier_arrived > 0) {
        s << " " << b.barrier_arrived << " of " << b.live << " wait at __syncthreads"
          << at(b.barrier_waiters.front()->where) << ";";
    }
    for (const Warp& w : b.warps) {
        for (const PendingWarpOp& p : w.pending) {
            if (shown++ == 4) {
                s << " ...";
                return s.str();
            }
            const Fiber* any = nullptr;
            for (unsigned l = 0; l < 32 && !any; ++l)
                if ((p.arrived >> l) & 1u) any = p.fibers[l];
            s << " warp " << (any ? any->warp : 0) << ": lanes " << hex(p.arrived) << " wait in " << op_name(p.op)
              << "(mask " << hex(p.mask) << ")" << at(p.where) << " for lanes " << hex(p.mask & ~p.arrived) << ";";
        }
    }
    return s.str();
}

void run_block(Worker& wk, const dim3& block_dim, size_t dyn_bytes, const std::function<void()>& body,
               bool programmatic) {
    Block& b = wk.block;
    b.programmatic = programmatic;
    const unsigned n = block_dim.x * block_dim.y * block_dim.z;
    const unsigned nwarps = (n + 31) / 32;
    b.fibers.resize(n);
    b.warps.assign(nwarps, Warp{});
    b.live = n;
    b.barrier_arrived = 0;
    b.barrier_sum = 0;
    b.barrier_waiters.clear();
    b.error.clear();
    b.body = &body;
    b.dyn_bytes = dyn_bytes;
    b.dyn.assign(dyn_bytes ? dyn_bytes + 2 * kRedZone : 0, 0xA5);
    if (dyn_bytes) std::memset(b.dyn.data() + kRedZone, 0xFF, dyn_bytes);
#if TERN_EMU_ASAN
    if (dyn_bytes) {
        ASAN_POISON_MEMORY_REGION(b.dyn.data(), kRedZone);
        ASAN_POISON_MEMORY_REGION(b.dyn.data() + kRedZone + dyn_bytes, kRedZone);
    }
#endif
    for (unsigned i = 0; i < n; ++i) {
        Fiber& f = b.fibers[i];
        f.stack = &wk.stack(i);
#if TERN_EMU_ASAN
        // A fiber never returns from its first frames (it switches away from them), so their red zones
        // stay poisoned on the stack: clear them, or the whole stack after a fault abandoned deeper frames.
        const size_t stale = f.stack->dirty ? kStackBytes : kStaleTopBytes;
        ASAN_UNPOISON_MEMORY_REGION(f.stack->base + kGuardBytes + kStackBytes - stale, stale);
#endif
        f.stack->dirty = false;
        f.linear = i;
        f.tid = uint3{i % block_dim.x, (i / block_dim.x) % block_dim.y, i / (block_dim.x * block_dim.y)};
        f.warp = i / 32;
        f.lane = i % 32;
        f.state = State::runnable;
        f.result = 0;
        f.fake_stack = nullptr;
        f.waited = false;
        b.warps[f.warp].exists |= 1u << f.lane;
        context_make(f.ctx, f.stack->base + kGuardBytes, kStackBytes, fiber_main);
    }
    bool started = false;
    for (;;) {
        bool ran = false;
        for (Fiber& f : b.fibers) {
            if (f.state != State::runnable) continue;
            ran = true;
            b.current = &f;
            threadIdx = f.tid;
            start_switch(&b.sched_fake_stack, f.stack->base + kGuardBytes, kStackBytes);
            context_switch(b.sched_ctx, f.ctx);
            finish_switch(b.sched_fake_stack, nullptr, nullptr);
            started = true;
            if (!b.error.empty()) break;
        }
        if (!b.error.empty() || b.live == 0) break;
        if (!ran) {
            b.error = deadlock_message(b);
            break;
        }
    }
    (void)started;
    b.current = nullptr;
    if (!b.error.empty()) {
        for (Fiber& f : b.fibers)
            if (f.state != State::exited) f.stack->dirty = true;
    }
    check_dynamic_shared_redzones(b, "at block end");
#if TERN_EMU_ASAN
    if (!b.dyn.empty()) ASAN_UNPOISON_MEMORY_REGION(b.dyn.data(), b.dyn.size());
#endif
}

int g_worker_threads = 0;

} // namespace
} // namespace detail

void set_worker_threads(int n) { detail::g_worker_threads = n; }
int worker_threads() { return detail::g_worker_threads > 0 ? detail::g_worker_threads : omp_get_max_threads(); }

namespace {
std::atomic<size_t> g_kernel_launches{0};
std::atomic<size_t> g_programmatic_launches{0};
} // namespace

size_t kernel_launches() { return g_kernel_launches.load(std::memory_order_relaxed); }
size_t programmatic_launches() { return g_programmatic_launches.load(std::memory_order_relaxed); }

cudaError_t launch(dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream, std::function<void()> body,
                   bool programmatic) {
    const unsigned long long threads = 1ull * block.x * block.y * block.z;
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || threads == 0 || threads > 1024 || block.x > 1024 ||
        block.y > 1024 || block.z > 64 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7FFFFFFFu) {
        return emu_set_last_error(cudaErrorInvalidConfiguration);
    }
    if (shared_bytes > 227 * 1024) return emu_set_last_error(cudaErrorInvalidValue);
    g_kernel_launches.fetch_add(1, std::memory_order_relaxed);
    if (programmatic) g_programmatic_launches.fetch_add(1, std::memory_order_relaxed);
    auto run = [grid, block, shared_bytes, programmatic, body = std::move(body)] {
        const long long nblocks = 1ll * grid.x * grid.y * grid.z;
        std::mutex error_mutex;
        std::string first_error;
        std::atomic<bool> failed{false};
        const int nthreads = static_cast<int>(std::min<long long>(worker_threads(), nblocks));
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
        for (long long i = 0; i < nblocks; ++i) {
            if (failed.load(std::memory_order_relaxed)) continue;
            try {
                detail::Worker& wk = detail::worker();
                blockIdx = uint3{static_cast<unsigned>(i % grid.x), static_cast<unsigned>((i / grid.x) % grid.y),
                                 static_cast<unsigned>(i / (1ll * grid.x * grid.y))};
                blockDim = block;
                gridDim = grid;
                detail::run_block(wk, block, shared_bytes, body, programmatic);
                if (!wk.block.error.empty()) {
                    std::lock_guard<std::mutex> lock(error_mutex);
                    if (first_error.empty()) first_error = wk.block.error;
                    failed = true;
                }
            } catch (const std::exception& e) {
                std::lock_guard<std::mutex> lock(error_mutex);
                if (first_error.empty()) first_error = e.what();
                failed = true;
            }
        }
        if (failed) throw Fault("CUDA emulator: " + first_error);
    };
    return emu_record_launch(stream, std::move(run));
}

} // namespace cuda_emu
