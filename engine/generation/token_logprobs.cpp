#include "engine/generation/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace tern {

TokenLogprobs token_logprobs(std::span<const float> row, int32_t token, size_t top_n) {
    if (token < 0 || static_cast<size_t>(token) >= row.size())
        throw std::invalid_argument("token_logprobs: token outside the logit row");
    const float max = *std::max_element(row.begin(), row.end());
    double sum = 0.0;
    for (float l : row) sum += std::exp(static_cast<double>(l) - max);
    const double lse = max + std::log(sum);

    TokenLogprobs out;
    out.token = token;
    out.logprob = static_cast<float>(row[static_cast<size_t>(token)] - lse);
    top_n = std::min(top_n, row.size());
    std::vector<int32_t> ids(row.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto more_likely = [&](int32_t a, int32_t b) {
        return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)] ||
               (row[static_cast<size_t>(a)] == row[static_cast<size_t>(b)] && a < b);
    };
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(top_n), ids.end(), more_likely);
    out.top.reserve(top_n);
    for (size_t i = 0; i < top_n; ++i)
        out.top.push_back({ids[i], static_cast<float>(row[static_cast<size_t>(ids[i])] - lse)});
    return out;
}

} // namespace tern
