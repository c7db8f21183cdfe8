#pragma once
// GET /metrics: the engine's and the HTTP server's numbers in Prometheus' text exposition format
// (version 0.0.4): counters end in _total, histograms give cumulative buckets with le labels, _sum
// and _count, in seconds.
#include <cstdint>
#include <map>
#include <string>

#include "engine/batch/batch_engine.h"

namespace tern::app {

struct HttpCounters {
    std::map<int, uint64_t> responses;   // by status code
    uint64_t connections_refused = 0;    // answered 503 at once: every worker busy and the backlog full
    int64_t requests_in_flight = 0;      // generation requests being answered
};

std::string prometheus_text(const BatchStats& engine, const HttpCounters& http);

} // namespace tern::app
