#include "app/console.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace tern::app {

bool stderr_is_tty() { return isatty(STDERR_FILENO) == 1; }

bool color_enabled() {
    const char* no_color = std::getenv("NO_COLOR");
    return stderr_is_tty() && (no_color == nullptr || no_color[0] == '\0');
}

std::string format_bytes(uint64_t bytes) {
    char buf[32];
    const double b = static_cast<double>(bytes);
    if (bytes < 1024) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
    else if (b < 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "%.2f KiB", b / 1024.0);
    else if (b < 1024.0 * 1024.0 * 1024.0) std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1024.0 * 1024.0));
    else std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1024.0 * 1024.0 * 1024.0));
    return buf;
}

std::string format_duration(double s) {
    char buf[48];
    if (s < 1.0) std::snprintf(buf, sizeof buf, "%.0f ms", s * 1000.0);
    else if (s < 60.0) std::snprintf(buf, sizeof buf, "%.1f s", s);
    else std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s / 60.0), static_cast<int>(s) % 60);
    return buf;
}

ProgressBar::ProgressBar(std::string label, uint64_t total, bool enabled)
    : label_(std::move(label)), total_(total), enabled_(enabled), color_(enabled && color_enabled()),
      start_(std::chrono::steady_clock::now()), last_draw_(start_) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::set_label(std::string label) { label_ = std::move(label); }

void ProgressBar::update(uint64_t done) {
    done_ = std::min(done, total_);
    draw(false);
}

void ProgressBar::draw(bool force) {
    if (!enabled_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && drawn_ && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int width = 30;
    const double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
    const int filled = static_cast<int>(frac * width);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.append(static_cast<size_t>(width - filled), '.');
    const double secs = std::chrono::duration<double>(now - start_).count();
    // \r + clear-to-end-of-line keeps one line however long the label was before.
    std::fprintf(stderr, "\r\033[K%s [%s%s%s] %3d%%  %s", label_.c_str(), color_ ? "\033[32m" : "", bar.c_str(),
                 color_ ? "\033[0m" : "", static_cast<int>(frac * 100.0), format_duration(secs).c_str());
    std::fflush(stderr);
    drawn_ = true;
}

void ProgressBar::finish() {
    if (!enabled_ || !drawn_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
    drawn_ = false;
    enabled_ = false;
}

std::string format_number(const char* format, double value) {
    char buf[64];
    std::snprintf(buf, sizeof buf, format, value);
    return buf;
}

} // namespace tern::app
