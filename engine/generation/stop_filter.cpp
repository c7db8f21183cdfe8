#include "engine/generation/stop_filter.h"

#include <algorithm>
#include <utility>

namespace tern {

StopStringFilter::StopStringFilter(std::vector<std::string> stops) {
    for (std::string& s : stops)
        if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopStringFilter::push(std::string_view text) {
    if (matched_) return {};
    held_.append(text);
    if (stops_.empty()) return std::exchange(held_, {});

    size_t first = std::string::npos;
    for (const std::string& s : stops_) first = std::min(first, held_.find(s));
    if (first != std::string::npos) {
        matched_ = true;
        std::string out = held_.substr(0, first);
        held_.clear();
        return out;
    }

    // Keep the longest tail that some stop string starts with.
    size_t keep = 0;
    for (const std::string& s : stops_) {
        for (size_t k = std::min(s.size() - 1, held_.size()); k > keep; --k) {
            if (std::string_view(held_).substr(held_.size() - k) == std::string_view(s).substr(0, k)) {
                keep = k;
                break;
            }
        }
    }
    std::string out = held_.substr(0, held_.size() - keep);
    held_.erase(0, held_.size() - keep);
    return out;
}

std::string StopStringFilter::flush() {
    if (matched_) return {};
    return std::exchange(held_, {});
}

} // namespace tern
