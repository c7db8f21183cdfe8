#include "engine/batch/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tern {

LatencyHistogram::LatencyHistogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
    if (!std::is_sorted(bounds_.begin(), bounds_.end()) ||
        std::adjacent_find(bounds_.begin(), bounds_.end()) != bounds_.end())
        throw std::invalid_argument("LatencyHistogram: bucket bounds must increase");
    counts_.assign(bounds_.size() + 1, 0);
}

void LatencyHistogram::observe(double seconds) {
    if (!std::isfinite(seconds) || seconds < 0.0) seconds = 0.0;   // a clock that went back counts as 0
    const size_t bucket = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
    ++counts_[bucket];
    ++count_;
    sum_ += seconds;
}

std::vector<double> LatencyHistogram::default_bounds() {
    return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0};
}

} // namespace tern
