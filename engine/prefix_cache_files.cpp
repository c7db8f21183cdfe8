#include "engine/prefix_cache_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace tern {
namespace fs = std::filesystem;
namespace {

std::string errno_text(int err) { return std::strerror(err); }

// Closes a descriptor on every path out.
struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

std::string unique_suffix() {
    static std::mt19937_64 rng{std::random_device{}() ^ (uint64_t(::getpid()) << 32)};
    char buf[48];
    std::snprintf(buf, sizeof buf, ".tmp.%d.%016llx", static_cast<int>(::getpid()),
                  static_cast<unsigned long long>(rng()));
    return buf;
}

} // namespace

std::optional<std::vector<uint8_t>> read_cache_file(const fs::path& path, uint64_t max_bytes, bool* missing,
                                                    std::string* why) {
    *missing = false;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) *missing = true;   // no entry, or no directory yet
        else *why = "cannot stat: " + errno_text(errno);
        return std::nullopt;
    }
    if (!S_ISREG(st.st_mode)) {
        *why = S_ISLNK(st.st_mode) ? "a symbolic link, not an entry" : "not a regular file";
        return std::nullopt;
    }
    // O_NONBLOCK: should a FIFO replace the file between lstat and open, open does not wait for a
    // writer; O_NOFOLLOW: nor is a symlink followed.
    Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC)};
    if (f.fd < 0) {
        if (errno == ENOENT) *missing = true;   // evicted by another run meanwhile
        else *why = "cannot open: " + errno_text(errno);
        return std::nullopt;
    }
    if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        *why = "not a regular file";
        return std::nullopt;
    }
    if (static_cast<uint64_t>(st.st_size) > max_bytes) {
        *why = "larger than any entry can be (" + std::to_string(st.st_size) + " bytes)";
        return std::nullopt;
    }
    std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
        const ssize_t n = ::read(f.fd, bytes.data() + got, bytes.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            *why = "read failed: " + errno_text(errno);
            return std::nullopt;
        }
        if (n == 0) break;   // shrank since fstat: the parser reports it as truncated
        got += static_cast<size_t>(n);
    }
    bytes.resize(got);
    ::futimens(f.fd, nullptr);   // best effort: a read-only cache still serves hits
    return bytes;
}

bool write_cache_file_atomically(const fs::path& path, std::span<const uint8_t> bytes, std::string* why) {
    const fs::path temp = path.string() + unique_suffix();
    Fd f{::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)};
    if (f.fd < 0) {
        *why = temp.string() + ": cannot create: " + errno_text(errno);
        return false;
    }
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(f.fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int err = n < 0 ? errno : ENOSPC;
            *why = temp.string() + ": write failed: " + errno_text(err);
            ::unlink(temp.c_str());
            return false;
        }
        done += static_cast<size_t>(n);
    }
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) {   // NFS and some quotas report a failed write only here
        *why = temp.string() + ": close failed: " + errno_text(errno);
        ::unlink(temp.c_str());
        return false;
    }
    if (::rename(temp.c_str(), path.c_str()) != 0) {
        *why = path.string() + ": cannot rename the new entry into place: " + errno_text(errno);
        ::unlink(temp.c_str());
        return false;
    }
    return true;
}

bool remove_cache_path(const fs::path& path) {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
    if (S_ISDIR(st.st_mode)) return ::rmdir(path.c_str()) == 0 || errno == ENOENT;
    return ::unlink(path.c_str()) == 0 || errno == ENOENT;
}

std::vector<CacheFileInfo> list_cache_files(const fs::path& dir, const std::string& suffix) {
    std::vector<CacheFileInfo> out;
    DIR* d = ::opendir(dir.c_str());
    if (!d) return out;
    const std::string temp_mark = suffix + ".tmp.";
    while (const dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        const bool entry = name.size() > suffix.size() && name.ends_with(suffix);
        const bool temporary = name.find(temp_mark) != std::string::npos;
        if (!entry && !temporary) continue;
        struct stat st {};
        const fs::path p = dir / name;
        if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        out.push_back({p, static_cast<uint64_t>(st.st_size), st.st_mtim, temporary});
    }
    ::closedir(d);
    return out;
}

} // namespace tern
