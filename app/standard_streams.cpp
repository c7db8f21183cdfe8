#include "app/standard_streams.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>

#include "base/error.h"
#include "base/terminal_text.h"

namespace tern::app {
namespace {

bool is_closed(int fd) { return ::fcntl(fd, F_GETFD) == -1 && errno == EBADF; }

// The read end of stdout's pipe or socket is gone: writes fail with EPIPE (SIGPIPE is ignored).
bool reader_gone() {
    struct stat st {};
    if (::fstat(STDOUT_FILENO, &st) != 0 || !(S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) return false;
    pollfd p{STDOUT_FILENO, POLLOUT, 0};
    return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLERR | POLLHUP)) != 0;
}

// Not open for writing: the /dev/null placed by occupy_closed_standard_fds, or a read-only fd.
bool not_writable() {
    const int flags = ::fcntl(STDOUT_FILENO, F_GETFL);
    return flags == -1 || (flags & O_ACCMODE) == O_RDONLY;
}

} // namespace

void occupy_closed_standard_fds() {
    for (int fd = 0; fd <= 2; ++fd) {
        if (!is_closed(fd)) continue;
        // Lower fds are open now, so open() returns exactly `fd`.
        const int got = ::open("/dev/null", (fd == 2 ? O_WRONLY : O_RDONLY) | O_CLOEXEC);
        if (got >= 0 && got != fd) {
            ::dup2(got, fd);
            ::close(got);
        }
    }
}

int finish_stdout(int status) {
    // errno from either flush: after a failed one glibc may drop the buffer, and the second
    // then succeeds.
    errno = 0;
    std::cout.flush();
    const bool flushed = std::fflush(stdout) == 0;
    const int err = errno;
    if (flushed && !std::ferror(stdout) && !std::cout.bad()) return status;
    if (status != 0) return status;
    // The error may have happened in an earlier automatic flush, its errno long gone: ask the
    // descriptor itself what is wrong with it.
    if (err == EPIPE || reader_gone()) return status;
    std::cerr << "tern: " << stdout_write_error(err) << "\n";
    return static_cast<int>(ExitCode::runtime);
}

std::string stdout_write_error(int err) {
    std::string why;
    if (err == EBADF || (err == 0 && not_writable())) why = "stdout is closed (redirect it to a file or /dev/null)";
    else if (err == ENOSPC || err == EDQUOT) why = std::string(std::strerror(err)) + " (disk full?)";
    else why = err ? std::strerror(err) : "an earlier write failed (disk full?)";
    return "stdout: write failed: " + why;
}

bool write_stdout(std::string_view s) {
    if (s.empty()) return true;
    static const bool terminal = ::isatty(STDOUT_FILENO) == 1;
    std::string safe;
    if (terminal) s = safe = terminal_display(s);
    errno = 0;
    if (std::fwrite(s.data(), 1, s.size(), stdout) == s.size() && std::fflush(stdout) == 0) return true;
    if (errno == EPIPE) return false;
    throw RuntimeFailure(stdout_write_error(errno));
}

} // namespace tern::app
