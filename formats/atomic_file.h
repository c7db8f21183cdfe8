#pragma once
// AtomicFile: the one way tern writes a file another program (or a later tern) reads -- quantize and
// synth outputs, /save's conversations, prompt-cache entries. The bytes go to a new, unique
// temporary file beside PATH (PATH.tmp.<pid>.<random>, created with O_EXCL and O_NOFOLLOW, mode 0600),
// which is renamed over PATH only once everything is written (and, when durable, fsynced). So:
//   - a reader never sees a half-written file under PATH, and two writers of one PATH each rename a
//     complete file of their own (the last rename wins) instead of writing into a shared temporary;
//   - a planted symlink is never followed: not at the temporary name (O_EXCL|O_NOFOLLOW) nor at
//     PATH, which must be absent or a regular file (a symlink, directory, device node or FIFO there
//     is refused, so `/save /dev/full` cannot replace a device node with a regular file);
//   - the temporary file is removed on every way out that runs code: an exception or error (the
//     destructor), and SIGINT/SIGTERM/SIGHUP/SIGQUIT (remove_temporary_files_now(), called by the app's
//     signal handlers). SIGKILL (or a power cut) runs nothing and leaves PATH.tmp.<pid>.<random>: the next
//     write to PATH removes it (remove_stale_temporaries).
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace tern {

class AtomicFile {
public:
    struct Options {
        // The mode PATH gets at the rename (less the umask); the temporary file is 0600 until then.
        mode_t mode = 0644;
        // fsync the data before the rename and the directory after it, so the new file survives a
        // power cut. The prompt cache turns it off: a lost entry is a cache miss, and its checksum
        // catches a torn one.
        bool durable = true;
        // Used in messages: "cannot save the conversation", "cannot write the model", ...
        std::string what = "cannot write";
    };

    // Checks PATH (absent or a regular file, not a symlink) and creates the temporary file.
    // Throws UsageError when PATH exists and is not a regular file, RuntimeFailure (naming PATH
    // and the temporary file) when the temporary file cannot be created.
    explicit AtomicFile(std::string path, Options options);
    explicit AtomicFile(std::string path) : AtomicFile(std::move(path), Options{}) {}
    ~AtomicFile(); // removes the temporary file unless commit() succeeded
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    // Appends bytes; RuntimeFailure naming the temporary file on failure (ENOSPC, EFBIG, ...).
    void write(const void* data, size_t n);
    void write_zeros(uint64_t n);
    uint64_t written() const { return written_; }

    // fsync (when durable), close, re-check PATH, rename the temporary file over PATH, fsync the
    // directory (when durable). After a failure the temporary file is gone and PATH unchanged.
    void commit();

    const std::string& path() const { return path_; }
    const std::string& temporary_path() const { return temp_; }

private:
    [[noreturn]] void fail_errno(const std::string& what, int err) const;

    std::string path_;
    std::string temp_;
    Options options_;
    int fd_ = -1;
    int slot_ = -1; // this file's entry in the signal handlers' list of temporary files
    bool committed_ = false;
    uint64_t written_ = 0;
};

// Throws UsageError naming PATH when it exists and is not a regular file (a symlink, a directory,
// a device node, a FIFO): such a target is refused, never replaced. Commands call it before long
// work, so a bad OUT fails at once; AtomicFile checks again.
void check_write_target(const std::string& path);

// Removes the temporary files that writers of PATH killed without a chance to clean up (SIGKILL) left
// beside it: entries of PATH's directory named exactly PATH.tmp.<pid>.<16 hex digits>, whose pid is not a
// live process (kill(pid, 0) fails with ESRCH, in this pid namespace), that are regular files owned by
// this user, examined and unlinked relative to the directory without following a symlink. Best effort:
// nothing is reported. Every AtomicFile calls it before creating its own temporary file.
void remove_stale_temporaries(const std::string& path) noexcept;

// Unlinks every temporary file an AtomicFile (or a TemporaryFileName) holds right now. Async-signal-safe:
// signal handlers call it before the process ends.
void remove_temporary_files_now() noexcept;

// Installs the process's handlers for SIGINT, SIGTERM, SIGHUP and SIGQUIT: each removes the live
// temporary files, then SIGINT exits 130 (../shared/CLI.md: interrupted) and the others end the
// process by the same signal with its default action (a shell reports 128 + the signal number:
// 143 for SIGTERM, 129 for SIGHUP, 131 for SIGQUIT). Commands that handle Ctrl-C themselves
// (app/signals.h) install their own SIGINT handler over this one while they run. Call once, early.
void install_temporary_file_cleanup_on_signals();

// Registers a file name that must not outlive the process (bench's temporary model) with the same
// signal-time cleanup; the destructor unregisters it (it does not unlink).
class TemporaryFileName {
public:
    explicit TemporaryFileName(const std::string& path);
    ~TemporaryFileName();
    TemporaryFileName(const TemporaryFileName&) = delete;
    TemporaryFileName& operator=(const TemporaryFileName&) = delete;

private:
    int slot_ = -1;
};

} // namespace tern
