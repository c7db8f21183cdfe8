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
#include "engine/memory_need.h"
#include "base/error.h"

namespace tern {

// Why a device value cannot be used, for the app to word (it names the flag that gave it).
struct DeviceUnavailable : UsageError {
    enum class Reason { unknown, not_built };
    DeviceUnavailable(std::string device, Reason reason);
    std::string device;
    Reason reason;
};

// A CUDA device asked for by name (--device cuda, cuda:N) that this machine cannot give: no driver, no
// GPU, no GPU of that index. A runtime failure (exit 3), worded by the app with the flag.
struct GpuUnavailable : RuntimeFailure {
    GpuUnavailable(std::string device, std::string why);
    std::string device, why;
};

// A device value read once: "auto" (automatic: the GPU when one is usable, else the CPU), "cpu",
// "cuda" or "cuda:N" (index not yet used). nullopt for anything else.
struct DeviceChoice {
    bool automatic = false;
    DeviceKind kind = DeviceKind::cpu;
    int index = 0;   // cuda:N
};
std::optional<DeviceChoice> parse_device(std::string_view device);

// Throws DeviceUnavailable for an unknown device or one this build cannot use, GpuUnavailable for a
// CUDA device this machine does not have. "auto" takes the first usable GPU of a build with CUDA, else
// the CPU; when `note` is not null it then receives one line saying why no GPU was taken (empty when
// there is nothing to say: a GPU was taken, or tern was built without CUDA), for the app to print.
// gpu_layers (-ngl) >= 0 puts only that many of the last layers on a GPU that was chosen and the rest on
// the CPU (engine/split_backend.h); -1, the default, puts all of them there.
std::unique_ptr<Backend> make_backend(std::string_view device, const CpuOptions& cpu = {}, std::string* note = nullptr,
                                      int32_t gpu_layers = -1);

} // namespace tern
