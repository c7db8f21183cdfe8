#include "engine/backend_factory.h"

#include <string>

#include "engine/cpu/backend_cpu.h"
#include "base/error.h"
#include "kernels/gpu_info.h"

namespace tern {
namespace {

std::string unavailable_message(const std::string& device, DeviceUnavailable::Reason reason) {
    if (reason == DeviceUnavailable::Reason::not_built)
        return "device " + device + ": tern was built without a CUDA backend yet (use cpu)";
    return "unknown device '" + device + "' (choices: auto, cpu, cuda)";
}

} // namespace

DeviceUnavailable::DeviceUnavailable(std::string device_, Reason reason_)
    : UsageError(unavailable_message(device_, reason_)), device(std::move(device_)), reason(reason_) {}

std::optional<DeviceChoice> parse_device(std::string_view device) {
    if (device == "auto") return DeviceChoice{true, DeviceKind::cpu};
    if (device == "cpu") return DeviceChoice{false, DeviceKind::cpu};
    if (device == "cuda" || device.starts_with("cuda:")) return DeviceChoice{false, DeviceKind::cuda};
    return std::nullopt;
}

std::unique_ptr<Backend> make_backend(std::string_view device, const CpuOptions& cpu, std::string* note) {
    if (note) note->clear();
    const std::optional<DeviceChoice> choice = parse_device(device);
    if (!choice) throw DeviceUnavailable(std::string(device), DeviceUnavailable::Reason::unknown);
    if (choice->automatic) {
        // Only worth a word when a GPU is there to be disappointed about.
        if (note && cuda_compiled()) {
            const size_t n_gpus = list_cuda_devices(nullptr).size();
            if (n_gpus > 0)
                *note = "device auto: " + std::to_string(n_gpus) +
                        " CUDA GPU(s) found but tern has no CUDA backend yet; running on the cpu";
        }
        return std::make_unique<CpuBackend>(cpu);
    }
    switch (choice->kind) {
    case DeviceKind::cpu: return std::make_unique<CpuBackend>(cpu);
    case DeviceKind::cuda: break;
    }
    throw DeviceUnavailable(std::string(device), DeviceUnavailable::Reason::not_built);
}

} // namespace tern
