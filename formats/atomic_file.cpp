#include "formats/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string_view>

#include "base/error.h"
#include "formats/text.h"

namespace tern {
namespace {

// ---- the signal handlers' list of live temporary files -------------------------------------------
// Static storage only: a handler may read nothing else. A slot is claimed with a compare-exchange,
// filled, then published; the handler unlinks the published ones. A name that does not fit (or a
// process with more than kSlots files open for writing at once) is simply not cleaned up by a signal.
constexpr int kSlots = 16;
constexpr size_t kPathBytes = 4096;
enum SlotState : int { kFree = 0, kFilling = 1, kLive = 2 };
std::atomic<int> g_state[kSlots];
char g_path[kSlots][kPathBytes];
static_assert(std::atomic<int>::is_always_lock_free);

int register_temporary(const std::string& path) {
    if (path.size() >= kPathBytes) return -1;
    for (int i = 0; i < kSlots; ++i) {
        int expected = kFree;
        if (!g_state[i].compare_exchange_strong(expected, kFilling)) continue;
        std::memcpy(g_path[i], path.c_str(), path.size() + 1);
        g_state[i].store(kLive, std::memory_order_release);
        return i;
    }
    return -1;
}

void unregister_temporary(int slot) {
    if (slot >= 0) g_state[slot].store(kFree, std::memory_order_release);
}

// The process's umask, read once before main() runs (reading it means setting it, which is not
// thread-safe later): the final file gets the mode an ordinary open(O_CREAT, mode) would give it.
const mode_t g_umask = [] {
    const mode_t m = ::umask(077);
    ::umask(m);
    return m;
}();

// The temporary name's tail: ".tmp.<pid>.<16 lowercase hex digits>" (stale_temporary_pid reads it back).
constexpr int kSuffixHexDigits = 16;
std::string unique_suffix() {
    static std::mt19937_64 rng{std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32)};
    static std::atomic<uint64_t> counter{0};
    char buf[64];
    std::snprintf(buf, sizeof buf, ".tmp.%d.%0*llx", static_cast<int>(::getpid()), kSuffixHexDigits,
                  static_cast<unsigned long long>(rng() ^ counter.fetch_add(1)));
    return buf;
}

// The pid in `name` when it is exactly `base`.tmp.<pid>.<16 lowercase hex digits> (an AtomicFile's temporary
// name for PATH = .../base), else -1.
pid_t temporary_name_pid(std::string_view name, std::string_view base) {
    const std::string_view prefix = ".tmp.";
    if (name.size() <= base.size() + prefix.size() || name.substr(0, base.size()) != base ||
        name.substr(base.size(), prefix.size()) != prefix)
        return -1;
    std::string_view rest = name.substr(base.size() + prefix.size());
    const size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string_view::npos || dot > 9 || rest[0] == '0') return -1;   // 1 .. 999999999
    long pid = 0;
    for (const char c : rest.substr(0, dot)) {
        if (c < '0' || c > '9') return -1;
        pid = pid * 10 + (c - '0');
    }
    const std::string_view hex = rest.substr(dot + 1);
    if (hex.size() != kSuffixHexDigits) return -1;
    for (const char c : hex)
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return -1;
    return static_cast<pid_t>(pid);
}

std::string base_name_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string errno_hint(int err) {
    switch (err) {
    case ENOSPC:
        return " (disk full?)";
    case EFBIG:
        return " (file size limit reached: see 'ulimit -f', or the filesystem's maximum file size)";
    case EDQUOT:
        return " (disk quota exceeded)";
    case EACCES:
    case EPERM:
        return " (check the directory's permissions)";
    case EROFS:
        return " (the file system is read-only)";
    case ENOENT:
        return " (does the directory exist?)";
    default:
        return "";
    }
}

const char* kind_of(mode_t mode) {
    if (S_ISLNK(mode)) return "a symbolic link";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

std::string directory_of(const std::string& path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

} // namespace

void remove_stale_temporaries(const std::string& path) noexcept {
    const std::string base = base_name_of(path);
    if (base.empty()) return;
    const int dfd = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    // readdir on a duplicate, so that dfd stays ours for fstatat and unlinkat (closedir closes the duplicate).
    const int list_fd = ::dup(dfd);
    DIR* dir = list_fd >= 0 ? ::fdopendir(list_fd) : nullptr;
    if (!dir) {
        if (list_fd >= 0) ::close(list_fd);
        ::close(dfd);
        return;
    }
    const pid_t self = ::getpid();
    const uid_t me = ::geteuid();
    while (const dirent* e = ::readdir(dir)) {
        const pid_t pid = temporary_name_pid(e->d_name, base);
        if (pid <= 0 || pid == self) continue;
        // Only a writer that is gone: ESRCH. EPERM is a live process of another user; a pid reused by a live
        // process keeps the file (left for a later write), never the reverse.
        if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
        // A regular file of ours, looked at where it is: never through a symlink, never another user's file.
        struct stat st {};
        if (::fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!S_ISREG(st.st_mode) || st.st_uid != me) continue;
        ::unlinkat(dfd, e->d_name, 0);   // a name swapped since fstatat: unlinkat removes the entry, follows nothing
    }
    ::closedir(dir);
    ::close(dfd);
}

void check_write_target(const std::string& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return; // absent (or unreachable: creating the file says why)
    if (S_ISREG(st.st_mode)) return;
    throw UsageError(printable(path, 4096) + ": is " + kind_of(st.st_mode) +
                     ", not a regular file; tern does not replace it (give the path of a new or regular file)");
}

void remove_temporary_files_now() noexcept {
    for (int i = 0; i < kSlots; ++i)
        if (g_state[i].load(std::memory_order_acquire) == kLive) ::unlink(g_path[i]);
}

namespace {

extern "C" void remove_temporary_files_and_exit(int sig) {
    const int saved_errno = errno;
    remove_temporary_files_now();
    if (sig == SIGINT) _exit(static_cast<int>(ExitCode::interrupted));
    // The default action of the same signal, so the parent sees how the process ended.
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig); // pending until this handler returns (the signal is blocked while it runs)
    errno = saved_errno;
}

} // namespace

void install_temporary_file_cleanup_on_signals() {
    struct sigaction sa = {};
    sa.sa_handler = remove_temporary_files_and_exit;
    sigemptyset(&sa.sa_mask);
    // One cleanup at a time: a second signal waits until the first handler has ended the process.
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT})
        sigaddset(&sa.sa_mask, sig);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
        struct sigaction old = {};
        sigaction(sig, nullptr, &old);
        if (old.sa_handler == SIG_IGN) continue; // `nohup tern ...` keeps ignoring SIGHUP
        sigaction(sig, &sa, nullptr);
    }
}

TemporaryFileName::TemporaryFileName(const std::string& path) : slot_(register_temporary(path)) {}

TemporaryFileName::~TemporaryFileName() {
    unregister_temporary(slot_);
}

AtomicFile::AtomicFile(std::string path, Options options) : path_(std::move(path)), options_(std::move(options)) {
    check_write_target(path_);
    remove_stale_temporaries(path_);
    for (int attempt = 0;; ++attempt) {
        temp_ = path_ + unique_suffix();
        // Claimed before the file exists, so a signal between open() and here cannot leave it.
        slot_ = register_temporary(temp_);
        fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd_ >= 0) break;
        const int err = errno;
        unregister_temporary(slot_);
        slot_ = -1;
        if (err == EEXIST && attempt < 8) continue; // a name taken (by chance or on purpose): draw another
        fail_errno("cannot create " + printable(temp_, 4096), err);
    }
}

AtomicFile::~AtomicFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(temp_.c_str());
    unregister_temporary(slot_);
}

void AtomicFile::fail_errno(const std::string& what, int err) const {
    std::string m = printable(path_, 4096) + ": ";
    if (!options_.what.empty()) m += options_.what + ": ";
    throw RuntimeFailure(m + what + ": " + std::strerror(err) + errno_hint(err));
}

void AtomicFile::write(const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
        // At most 1 GiB per call: Linux transfers at most ~2 GiB per write anyway.
        const ssize_t w = ::write(fd_, p, std::min<size_t>(n, size_t{1} << 30));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail_errno("cannot write " + printable(temp_, 4096), w < 0 ? errno : ENOSPC);
        p += w;
        n -= static_cast<size_t>(w);
        written_ += static_cast<uint64_t>(w);
    }
}

void AtomicFile::write_zeros(uint64_t n) {
    static constexpr char kZeros[4096] = {};
    while (n > 0) {
        const size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof kZeros));
        write(kZeros, k);
        n -= k;
    }
}

void AtomicFile::commit() {
    const mode_t mode = options_.mode & ~g_umask;
    if (mode != 0600 && ::fchmod(fd_, mode) != 0) fail_errno("cannot set the mode of " + printable(temp_, 4096), errno);
    if (options_.durable && ::fsync(fd_) != 0) fail_errno("cannot flush " + printable(temp_, 4096), errno);
    const int fd = fd_;
    fd_ = -1;
    // close() can report a deferred write error (NFS, some quotas).
    if (::close(fd) != 0) fail_errno("cannot close " + printable(temp_, 4096), errno);
    // PATH again: something may have been put there while the file was written. rename() would
    // replace a symlink itself rather than follow it, but a device node or FIFO must stay.
    check_write_target(path_);
    if (::rename(temp_.c_str(), path_.c_str()) != 0)
        fail_errno("cannot rename " + printable(temp_, 4096) + " to " + printable(path_, 4096), errno);
    committed_ = true;
    unregister_temporary(slot_);
    slot_ = -1;
    if (!options_.durable) return;
    const int dfd = ::open(directory_of(path_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        ::fsync(dfd); // best effort: some filesystems refuse fsync on directories
        ::close(dfd);
    }
}

} // namespace tern
