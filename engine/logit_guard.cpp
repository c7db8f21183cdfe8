#include "engine/logit_guard.h"

#include "base/finite.h"
#include "engine/backend.h"

namespace tern {

namespace {

std::string non_finite_message(const std::string& model, int32_t position, LogitFault fault) {
    const std::string who = model.empty() ? std::string("the model") : model;
    return who + ": the model produced non-finite logits at position " + std::to_string(position) + " (" +
           std::string(logit_fault_name(fault)) +
           "); the file's weights or metadata are damaged (`tern info --check` scans every tensor)";
}

} // namespace

std::string_view logit_fault_name(LogitFault fault) {
    switch (fault) {
    case LogitFault::nan:
        return "NaN";
    case LogitFault::pos_inf:
        return "+inf";
    case LogitFault::no_finite:
        return "no finite value";
    }
    return "unknown";
}

NonFiniteLogits::NonFiniteLogits(std::string model_, int32_t position_, LogitFault fault_)
    : RuntimeFailure(non_finite_message(model_, position_, fault_)), model(std::move(model_)), position(position_),
      fault(fault_) {}

void check_logit_row(Backend& backend, int row, int32_t position, std::string_view model) {
    const FloatScan s = backend.scan_logits(row);
    if (s.nan) throw NonFiniteLogits(std::string(model), position, LogitFault::nan);
    if (s.pos_inf) throw NonFiniteLogits(std::string(model), position, LogitFault::pos_inf);
    if (!s.finite) throw NonFiniteLogits(std::string(model), position, LogitFault::no_finite);
}

} // namespace tern
