#pragma once
// Whether a row of floats holds NaN, +inf, and any finite value (-inf, a masked logit, is none of these).
// A logit row of a 262144-token vocabulary is scanned every decode step (engine/logit_guard.h), so a sound
// row costs one vectorised pass, as long as a plain sum of it (about 70 us for 262144 floats on one core of
// a 2-core Xeon). IEEE semantics are required: not for a file built with -ffast-math.
#include <span>

namespace tern {

struct FloatScan {
    bool nan = false;
    bool pos_inf = false;
    bool finite = false; // at least one finite value
};

FloatScan scan_floats(std::span<const float> values);

} // namespace tern
