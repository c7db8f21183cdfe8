#pragma once
// Terminal helpers for the app layer: whether stderr is a terminal, whether colour is allowed
// (NO_COLOR, https://no-color.org), a progress bar that draws only on a terminal, and number
// formatting for summaries. Progress and statistics always go to stderr (../shared/CLI.md).
#include <chrono>
#include <cstdint>
#include <string>

namespace tern::app {

bool stderr_is_tty();
// True when stderr is a terminal and NO_COLOR is unset or empty.
bool color_enabled();

// "1.14 MiB", "512 B".
std::string format_bytes(uint64_t bytes);
// "850 ms", "12.3 s", "4 min 05 s".
std::string format_duration(double seconds);
// One number through a printf format that takes a double: format_number(" (%.1f tok/s)", 12.34).
std::string format_number(const char* format, double value);

// A one-line bar redrawn in place with '\r': "label [#######.......]  45%  3.1 s". It draws only
// when enabled (by default: when stderr is a terminal), at most ~10 times a second, and clears its
// line when finished or destroyed, so the summary that follows starts on a clean line. Not
// thread-safe: update it from one thread.
class ProgressBar {
public:
    ProgressBar(std::string label, uint64_t total, bool enabled = stderr_is_tty());
    ~ProgressBar();
    ProgressBar(const ProgressBar&) = delete;
    ProgressBar& operator=(const ProgressBar&) = delete;

    void set_label(std::string label);
    void update(uint64_t done);   // absolute progress, 0..total
    void finish();                // clears the line (idempotent)
    bool enabled() const { return enabled_; }

private:
    void draw(bool force);

    std::string label_;
    uint64_t total_ = 0;
    uint64_t done_ = 0;
    bool enabled_ = false;
    bool drawn_ = false;
    bool color_ = false;
    std::chrono::steady_clock::time_point start_;
    std::chrono::steady_clock::time_point last_draw_;
};

} // namespace tern::app
