#pragma once
// Picks a Backend for a device value: "auto" (the GPU when one is usable, else the CPU), "cpu",
// "cuda". Each backend's own options travel here and reach only that backend (the CPU's threads
// and exact matmul: engine/cpu_options.h).
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "engine/backend.h"
#include "engine/cpu_options.h"
#include "base/error.h"

namespace tern {

// Why a device value cannot be used, for the app to word (it names the flag that gave it).
struct DeviceUnavailable : UsageError {
    enum class Reason { unknown, not_built };
    DeviceUnavailable(std::string device, Reason reason);
    std::string device;
    Reason reason;
};

// A device value read once: "auto" (automatic: the GPU when one is usable, else the CPU), "cpu",
// "cuda" or "cuda:N" (index not yet used). nullopt for anything else.
struct DeviceChoice {
    bool automatic = false;
    DeviceKind kind = DeviceKind::cpu;
};
std::optional<DeviceChoice> parse_device(std::string_view device);

// Throws DeviceUnavailable for an unknown device or one this build cannot use. When `note` is not
// null it receives a one-line explanation of an automatic choice (empty when there is nothing to
// say), for the app to print on stderr.
std::unique_ptr<Backend> make_backend(std::string_view device, const CpuOptions& cpu = {}, std::string* note = nullptr);

} // namespace tern
