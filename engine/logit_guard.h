#pragma once
// The one check every logit row passes before it is sampled or scored (Session's decode, the batching
// engine's steps, perplexity, bench): a row holding NaN, +inf, or no finite value at all comes from
// damaged weights or metadata (a softcap of +inf, a NaN scale or sink, a NaN KV cache), and sampling it
// would pick token 0 forever. -inf alone is legitimate: a masked token's logit.
#include <cstdint>
#include <string>
#include <string_view>

#include "base/error.h"

namespace tern {

class Backend;

// What made a row unusable, the first of these it holds.
enum class LogitFault { nan, pos_inf, no_finite };
// "NaN", "+inf", "no finite value".
std::string_view logit_fault_name(LogitFault fault);

// Exit 3: "MODEL: the model produced non-finite logits at position N (NaN); ...".
struct NonFiniteLogits : RuntimeFailure {
    NonFiniteLogits(std::string model, int32_t position, LogitFault fault);
    std::string model;
    int32_t position;
    LogitFault fault;
};

// Throws NonFiniteLogits when row `row` of the backend's last forward (the token at KV position
// `position`) holds NaN or +inf or no finite value. `model` names the file in the message ("" when
// there is none: tests' fakes).
void check_logit_row(Backend& backend, int row, int32_t position, std::string_view model);

} // namespace tern
