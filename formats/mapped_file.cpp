#include "formats/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "formats/atomic_file.h"
#include "base/error.h"
#include "formats/text.h"

namespace tern {
namespace {

// Closes the descriptor on every path out of open() but success, where the MappedFile keeps it.
struct FdGuard {
    int fd;
    ~FdGuard() {
        if (fd >= 0) ::close(fd);
    }
    int release() { return std::exchange(fd, -1); }
};

FileIdentity identity_of(const struct stat& st) {
    return {static_cast<int64_t>(st.st_size), static_cast<int64_t>(st.st_mtim.tv_sec),
            static_cast<int64_t>(st.st_mtim.tv_nsec)};
}

// The descriptor's file no longer has `at_open`'s size or modification time (or cannot be examined).
bool identity_changed(int fd, const FileIdentity& at_open) {
    struct stat st {};
    if (::fstat(fd, &st) != 0) return true;
    return identity_of(st) != at_open;
}

// ---- The files check_mapped_files() watches ------------------------------------------------------
// Keyed by an id that moves with the MappedFile (its address does not), guarded by a mutex: the
// engine thread checks while another thread may open or close a file. The descriptor is the
// MappedFile's; it is removed here before it is closed.
struct Watched {
    int fd = -1;
    FileIdentity identity;
    std::string path;
};
std::mutex g_watch_mutex;
std::map<uint64_t, Watched> g_watched;
uint64_t g_next_watch_id = 1;

uint64_t watch(int fd, const FileIdentity& identity, const std::string& path) {
    std::lock_guard<std::mutex> lock(g_watch_mutex);
    const uint64_t id = g_next_watch_id++;
    g_watched.emplace(id, Watched{fd, identity, path});
    return id;
}

void unwatch(uint64_t id) {
    if (id == 0) return;
    std::lock_guard<std::mutex> lock(g_watch_mutex);
    g_watched.erase(id);
}

std::string errno_text(int err) {
    return std::strerror(err);
}

// ---- SIGBUS on a mapping -------------------------------------------------------------------------
// Reading a page of a mapped file that was truncated (or whose storage failed) after mmap raises
// SIGBUS, which would kill tern with no word (exit 135). The handler finds the mapping the fault
// address lies in and writes that file's prepared one-line message, then exits 3 (../shared/CLI.md:
// runtime failure). Static storage only, as a handler may read nothing else.
constexpr int kMapSlots = 16;
struct MapSlot {
    std::atomic<int> state{0};   // 0 free, 1 being filled, 2 live
    uintptr_t begin = 0;
    uintptr_t end = 0;
    char message[4500] = {};
    size_t message_bytes = 0;
};
MapSlot g_maps[kMapSlots];

extern "C" void on_sigbus(int sig, siginfo_t* info, void*) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(info ? info->si_addr : nullptr);
    for (MapSlot& m : g_maps) {
        if (m.state.load(std::memory_order_acquire) != 2 || at < m.begin || at >= m.end) continue;
        remove_temporary_files_now();
        [[maybe_unused]] const ssize_t ignored = ::write(STDERR_FILENO, m.message, m.message_bytes);
        _exit(static_cast<int>(ExitCode::runtime));
    }
    // Not a mapped file's fault: the default action, after removing temporary files.
    remove_temporary_files_now();
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);
}

void install_sigbus_handler() {
    static std::once_flag once;
    std::call_once(once, [] {
        struct sigaction sa = {};
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, nullptr);
    });
}

int register_mapping(const uint8_t* data, size_t size, const std::string& path) {
    install_sigbus_handler();
    for (int i = 0; i < kMapSlots; ++i) {
        int expected = 0;
        if (!g_maps[i].state.compare_exchange_strong(expected, 1)) continue;
        MapSlot& m = g_maps[i];
        m.begin = reinterpret_cast<uintptr_t>(data);
        m.end = m.begin + size;
        const std::string line = "tern: " + printable(path, 4096) +
                                 ": the file became shorter or unreadable while tern was using it (was it truncated or "
                                 "rewritten in place? write model files to a new name and rename them)\n";
        m.message_bytes = std::min(line.size(), sizeof m.message);
        std::memcpy(m.message, line.data(), m.message_bytes);
        m.state.store(2, std::memory_order_release);
        return i;
    }
    return -1;
}

void unregister_mapping(int slot) {
    if (slot >= 0) g_maps[slot].state.store(0, std::memory_order_release);
}

} // namespace

FileChanged::FileChanged(std::string path_)
    : RuntimeFailure(path_ + ": the file changed while tern was using it (rewritten in place: its size or "
                             "modification time is not what it was when it was opened), so what was computed "
                             "from it since may be wrong; write model files to a new name and rename them"),
      path(std::move(path_)) {}

void check_mapped_files() {
    std::optional<std::string> changed;
    {
        std::lock_guard<std::mutex> lock(g_watch_mutex);
        for (const auto& [id, w] : g_watched)
            if (identity_changed(w.fd, w.identity)) {
                changed = w.path;
                break;
            }
    }
    if (changed) throw FileChanged(*changed);
}

bool MappedFile::changed() const { return fd_ >= 0 && identity_changed(fd_, identity_); }

MappedFile MappedFile::open(const std::string& path) {
    // O_NONBLOCK so that a FIFO given by mistake fails below instead of blocking forever in
    // open(); it has no effect on regular files.
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        const int err = errno;
        if (err == ENOENT) throw InputError(path + ": no such file");
        if (err == EACCES) throw InputError(path + ": cannot open: permission denied");
        if (err == ENOTDIR) throw InputError(path + ": no such file (a parent in the path is not a directory)");
        throw InputError(path + ": cannot open: " + errno_text(err));
    }
    FdGuard guard{fd};

    struct stat st {};
    if (::fstat(fd, &st) != 0) throw InputError(path + ": cannot stat: " + errno_text(errno));
    if (S_ISDIR(st.st_mode)) throw InputError(path + ": is a directory, expected a GGUF file");
    if (!S_ISREG(st.st_mode)) throw InputError(path + ": is not a regular file, expected a GGUF file");

    MappedFile m;
    m.path_ = path;
    if (st.st_size == 0) return m; // mmap of length 0 is EINVAL; an empty span is the honest answer

    const size_t size = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        if (err == ENOMEM)
            throw RuntimeFailure(path + ": cannot map " + std::to_string(size) +
                                 " bytes: out of address space or memory");
        throw InputError(path + ": cannot map the file: " + errno_text(err));
    }
    m.data_ = static_cast<const uint8_t*>(p);
    m.size_ = size;
    m.sigbus_slot_ = register_mapping(m.data_, m.size_, path);
    m.identity_ = identity_of(st);
    m.fd_ = guard.release();
    m.watch_id_ = watch(m.fd_, m.identity_, path);
    return m;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      fd_(std::exchange(other.fd_, -1)), identity_(other.identity_),
      sigbus_slot_(std::exchange(other.sigbus_slot_, -1)), watch_id_(std::exchange(other.watch_id_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        close_mapping();
        path_ = std::move(other.path_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        fd_ = std::exchange(other.fd_, -1);
        identity_ = other.identity_;
        sigbus_slot_ = std::exchange(other.sigbus_slot_, -1);
        watch_id_ = std::exchange(other.watch_id_, 0);
    }
    return *this;
}

MappedFile::~MappedFile() { close_mapping(); }

void MappedFile::close_mapping() noexcept {
    unwatch(std::exchange(watch_id_, 0));
    unregister_mapping(std::exchange(sigbus_slot_, -1));
    if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

} // namespace tern
