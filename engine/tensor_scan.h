#pragma once
// Every tensor's values decoded and checked (`tern info --check`): the NaN, inf and refused encodings that
// loading checks only in the small tensors (engine/weights.h), found in the big matrices too, before a run
// meets them as NaN logits. Reads the whole file once, on the CPU thread pool.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "quant/value_check.h"

namespace tern {

struct TensorScan {
    int64_t tensors_checked = 0;
    uint64_t bytes_checked = 0;
    // Tensors in formats tern cannot decode (IQ1/IQ2/IQ3, TQ, F64): "name (format)", in file order.
    std::vector<std::string> skipped;
    // The first bad block in file order (the tensor listed first, then its lowest block), when there is one.
    struct Bad {
        std::string tensor;
        BadValue value;
    };
    std::optional<Bad> bad;
    bool passed() const { return !bad.has_value(); }
};

// Scans every tensor of `file` on up to n_threads threads, stopping early once a bad block is known to come
// before everything still unread. `on_progress(done, total)` counts bytes of checkable tensors; calls are
// serialized (never two at once) but may come from any of the threads.
TensorScan scan_tensor_values(const GgufFile& file, int n_threads,
                              const std::function<void(uint64_t done, uint64_t total)>& on_progress = {});

// "<file>: tensor <name>: <what> (...)": the one error line of a failed scan.
std::string describe_bad_tensor(const GgufFile& file, const TensorScan::Bad& bad);

} // namespace tern
