#pragma once
// A latency histogram with fixed bucket bounds, in seconds, as Prometheus histograms count them:
// each observation lands in the first bucket whose upper bound it does not exceed (the last bucket,
// +Inf, takes the rest), and the sum and count of all observations are kept beside. Not thread-safe:
// the owner guards it (BatchEngine's stats lock).
#include <cstdint>
#include <span>
#include <vector>

namespace tern {

class LatencyHistogram {
public:
    // `bounds`: increasing upper bounds in seconds, without +Inf.
    explicit LatencyHistogram(std::vector<double> bounds = default_bounds());

    void observe(double seconds);

    std::span<const double> bounds() const { return bounds_; }
    // Observations per bucket, bounds().size() + 1 of them (the last is +Inf), not cumulative.
    std::span<const uint64_t> counts() const { return counts_; }
    uint64_t count() const { return count_; }
    double sum() const { return sum_; }

    // 1 ms .. 120 s, roughly x2.5 apart: from one decode step of a small model to a long reply on a
    // large one.
    static std::vector<double> default_bounds();

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;
    uint64_t count_ = 0;
    double sum_ = 0.0;
};

} // namespace tern
