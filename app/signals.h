#pragma once
// Ctrl-C while generating: the first SIGINT raises a flag that the session checks every step, so
// the text printed so far is flushed and the command exits 130; a second SIGINT exits at once
// (a stuck forward on a huge model must not make Ctrl-C useless).
#include <atomic>

namespace tern::app {

class InterruptGuard {
public:
    // Installs the handler (clearing the flag); the destructor restores the previous one.
    InterruptGuard();
    ~InterruptGuard();
    InterruptGuard(const InterruptGuard&) = delete;
    InterruptGuard& operator=(const InterruptGuard&) = delete;

    // The flag to hand to GenerateOptions::cancel.
    const std::atomic<bool>* flag() const;
    bool interrupted() const;
    // Lowers the flag again (tern chat: Ctrl-C stops one reply, not the program).
    void clear();
};

} // namespace tern::app

namespace tern::app {

// SIGINT and SIGTERM while `tern serve` runs: the handler only counts them, and the server's main loop
// reads count(): the first drains (no new requests, the admitted ones finish, exit 0), the second
// cancels what is left; a third ends the process at once (exit 130), as a second Ctrl-C does elsewhere.
class ShutdownSignals {
public:
    // Installs the handlers (count 0); the destructor restores the previous ones.
    ShutdownSignals();
    ~ShutdownSignals();
    ShutdownSignals(const ShutdownSignals&) = delete;
    ShutdownSignals& operator=(const ShutdownSignals&) = delete;

    int count() const;
};

} // namespace tern::app
