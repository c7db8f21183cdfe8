#include "formats/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "formats/text.h"

namespace tern {
namespace {

struct Fd {
    int fd = -1;
    ~Fd() {
        if (fd >= 0) ::close(fd);
    }
};

const char* kind_of(mode_t mode) {
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

} // namespace

std::string describe_bytes(uint64_t bytes) {
    char buf[64];
    if (bytes >= (uint64_t{1} << 30) && bytes % (uint64_t{1} << 30) == 0)
        std::snprintf(buf, sizeof buf, "%llu GiB", static_cast<unsigned long long>(bytes >> 30));
    else if (bytes >= (uint64_t{1} << 20))
        std::snprintf(buf, sizeof buf, "%.0f MiB", static_cast<double>(bytes) / (1 << 20));
    else
        std::snprintf(buf, sizeof buf, "%llu bytes", static_cast<unsigned long long>(bytes));
    return buf;
}

std::string read_input_file(const std::string& path, const std::string& role, uint64_t max_bytes) {
    const std::string name = printable(path, 4096);
    const auto refuse = [&](const std::string& what) { throw InputError(name + ": " + what); };
    // O_NONBLOCK: a FIFO opens at once instead of waiting for a writer, and is refused below.
    Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
    if (f.fd < 0) refuse("cannot open " + role + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(f.fd, &st) != 0) refuse("cannot stat " + role + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        refuse(role + " is " + kind_of(st.st_mode) + ", not a regular file (give " +
               (S_ISDIR(st.st_mode) ? "a file inside it" : "a regular file") + ")");
    const auto too_large = [&](const std::string& size) {
        refuse(role + " is " + size + ", more than the " + describe_bytes(max_bytes) +
               " tern reads from such a file (give a smaller file)");
    };
    if (static_cast<uint64_t>(st.st_size) > max_bytes) too_large(describe_bytes(static_cast<uint64_t>(st.st_size)));
    std::string bytes(static_cast<size_t>(st.st_size), '\0');
    size_t got = 0;
    for (;;) {
        if (got == bytes.size()) {
            // At the size fstat gave: read on, in case the file grew, up to the cap.
            bytes.resize(std::min<uint64_t>(max_bytes + 1, bytes.size() + (uint64_t{1} << 16)));
        }
        const ssize_t n = ::read(f.fd, bytes.data() + got, bytes.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) refuse("cannot read " + role + ": " + std::strerror(errno));
        if (n == 0) break;
        got += static_cast<size_t>(n);
        if (got > max_bytes) too_large("larger than that while being read");
    }
    bytes.resize(got);
    return bytes;
}

std::string read_standard_input(const std::string& role, uint64_t max_bytes) {
    std::string bytes;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw InputError("stdin: cannot read " + role + ": " + std::strerror(errno));
        if (n == 0) return bytes;
        if (bytes.size() + static_cast<size_t>(n) > max_bytes)
            throw InputError("stdin: " + role + " is larger than the " + describe_bytes(max_bytes) +
                             " tern reads (give a smaller text)");
        bytes.append(buf, static_cast<size_t>(n));
    }
}

} // namespace tern
