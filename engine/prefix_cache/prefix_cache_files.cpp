#include "engine/prefix_cache/prefix_cache_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "formats/atomic_file.h"
#include "base/error.h"

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
    // The one safe writer (formats/atomic_file.h), without fsync: a lost entry is a miss, a torn one
    // fails its checksum. 0600: an entry holds a user's prompt tokens.
    AtomicFile::Options options;
    options.mode = 0600;
    options.durable = false;
    options.what = "cannot store the prompt-cache entry";
    try {
        AtomicFile out(path.string(), options);
        out.write(bytes.data(), bytes.size());
        out.commit();
        return true;
    } catch (const TernError& e) {
        *why = e.what();
        return false;
    }
}

bool create_private_directories(const fs::path& dir, std::error_code& ec) {
    ec.clear();
    fs::path at;
    for (const fs::path& part : dir) {
        at /= part;
        if (part.empty() || part == "/") continue;
        if (::mkdir(at.c_str(), 0700) == 0 || errno == EEXIST) continue;
        ec = std::error_code(errno, std::generic_category());
        return false;
    }
    return fs::is_directory(dir, ec);
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
