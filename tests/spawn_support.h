#pragma once
// A tern process started in the background, for tests that act on it while it runs: send it
// signals, race two of them, or stop one that would hang (a FIFO). stdout and stderr go to files in
// a temporary directory; stdin is a pipe the test writes to (closed by close_stdin) or /dev/null.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_support.h"

namespace tern::test {

class Spawned {
public:
    // `cwd`: the directory the process runs in (empty: the test's own).
    explicit Spawned(const std::vector<std::string>& args, bool with_stdin = false, const std::string& cwd = "") {
        int in[2] = {-1, -1};
        if (with_stdin && ::pipe(in) != 0) throw std::runtime_error("pipe");
        const std::string out = (dir_ / "stdout").string(), err = (dir_ / "stderr").string();
        const std::string cache = "XDG_CACHE_HOME=" + (dir_ / "cache").string();
        pid_ = ::fork();
        if (pid_ < 0) throw std::runtime_error("fork");
        if (pid_ == 0) {
            if (with_stdin) {
                ::dup2(in[0], 0);
                ::close(in[0]);
                ::close(in[1]);
            } else {
                const int null = ::open("/dev/null", O_RDONLY);
                ::dup2(null, 0);
            }
            ::dup2(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), 1);
            ::dup2(::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600), 2);
            if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) _exit(126);
            ::putenv(const_cast<char*>(cache.c_str()));
            std::vector<char*> argv;
            argv.push_back(const_cast<char*>(TERN_BIN));
            for (const std::string& a : args)
                argv.push_back(const_cast<char*>(a.c_str()));
            argv.push_back(nullptr);
            // The signals' default actions, whatever the test runner set.
            for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE})
                ::signal(sig, SIG_DFL);
            ::execv(TERN_BIN, argv.data());
            _exit(127);
        }
        if (with_stdin) {
            ::close(in[0]);
            stdin_ = in[1];
            // A child that exits before reading all its stdin must not kill the test with SIGPIPE:
            // the write fails with EPIPE instead (write_stdin stops there).
            ::signal(SIGPIPE, SIG_IGN);
        }
    }
    ~Spawned() {
        close_stdin();
        if (!done_) {
            ::kill(pid_, SIGKILL);
            ::waitpid(pid_, &status_, 0);
        }
    }
    Spawned(const Spawned&) = delete;
    Spawned& operator=(const Spawned&) = delete;

    void write_stdin(const std::string& text) {
        size_t done = 0;
        while (done < text.size()) {
            const ssize_t n = ::write(stdin_, text.data() + done, text.size() - done);
            if (n <= 0) return;
            done += static_cast<size_t>(n);
        }
    }
    void close_stdin() {
        if (stdin_ >= 0) ::close(stdin_);
        stdin_ = -1;
    }
    void signal(int sig) { ::kill(pid_, sig); }
    bool running() {
        if (done_) return false;
        if (::waitpid(pid_, &status_, WNOHANG) == pid_) done_ = true;
        return !done_;
    }
    // Waits up to `seconds`; a process still running then is killed (SIGKILL) and false returned.
    bool wait(double seconds) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (running()) {
            if (std::chrono::steady_clock::now() > end) {
                ::kill(pid_, SIGKILL);
                ::waitpid(pid_, &status_, 0);
                done_ = true;
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        return true;
    }
    // Polls `ready` every millisecond while the process runs; true once it holds.
    bool wait_until(const std::function<bool()>& ready, double seconds) {
        const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
        while (std::chrono::steady_clock::now() < end) {
            if (ready()) return true;
            if (!running()) return ready();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return false;
    }
    bool exited() const { return done_ && WIFEXITED(status_); }
    int exit_code() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : -1; }
    int term_signal() const { return WIFSIGNALED(status_) ? WTERMSIG(status_) : 0; }
    std::string out() const { return read_file(dir_ / "stdout"); }
    std::string err() const { return read_file(dir_ / "stderr"); }

private:
    TempDir dir_;
    pid_t pid_ = -1;
    int stdin_ = -1;
    int status_ = 0;
    bool done_ = false;
};

// The names in `dir`, sorted.
inline std::vector<std::string> names_in(const std::filesystem::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir))
        names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

// True when `dir` holds a file whose name contains ".tmp." (a writer's temporary file).
inline bool has_temporary(const std::filesystem::path& dir) {
    for (const std::string& n : names_in(dir))
        if (n.find(".tmp.") != std::string::npos) return true;
    return false;
}

} // namespace tern::test
