#include "app/signals.h"

#include <signal.h>
#include <unistd.h>

#include "formats/atomic_file.h"

namespace tern::app {

namespace {

// A signal handler can only reach static storage; this flag is the one piece of global state the
// app keeps, and only the handler and InterruptGuard touch it. Lock-free, so async-signal-safe.
std::atomic<bool> g_interrupted{false};
static_assert(std::atomic<bool>::is_always_lock_free);

struct sigaction g_previous;

extern "C" void on_sigint(int) {
    if (g_interrupted.exchange(true)) {
        // Second Ctrl-C: the user means it. _exit is async-signal-safe; stdio buffers are lost,
        // but what was streamed has already been flushed piece by piece. A file being written
        // (quantize, synth, /save) loses its temporary file first.
        remove_temporary_files_now();
        _exit(130);
    }
}

// ShutdownSignals' count, for the same reason a static.
std::atomic<int> g_shutdown_signals{0};
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction g_previous_int;
struct sigaction g_previous_term;

extern "C" void on_shutdown_signal(int) {
    if (g_shutdown_signals.fetch_add(1) + 1 >= 3) {
        remove_temporary_files_now();
        _exit(130);
    }
}

} // namespace

InterruptGuard::InterruptGuard() {
    g_interrupted = false;
    struct sigaction sa = {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;   // a write interrupted mid-piece resumes instead of failing with EINTR
    sigaction(SIGINT, &sa, &g_previous);
}

InterruptGuard::~InterruptGuard() { sigaction(SIGINT, &g_previous, nullptr); }

const std::atomic<bool>* InterruptGuard::flag() const { return &g_interrupted; }

bool InterruptGuard::interrupted() const { return g_interrupted.load(); }

void InterruptGuard::clear() { g_interrupted = false; }

ShutdownSignals::ShutdownSignals() {
    g_shutdown_signals = 0;
    struct sigaction sa = {};
    sa.sa_handler = on_shutdown_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, &g_previous_int);
    sigaction(SIGTERM, &sa, &g_previous_term);
}

ShutdownSignals::~ShutdownSignals() {
    sigaction(SIGINT, &g_previous_int, nullptr);
    sigaction(SIGTERM, &g_previous_term, nullptr);
}

int ShutdownSignals::count() const { return g_shutdown_signals.load(); }

} // namespace tern::app
