#include "engine/backend_factory.h"

#include <string>

#include "engine/cpu/backend_cpu.h"
#include "base/error.h"
#include "kernels/gpu_info.h"

namespace tern {

std::unique_ptr<Backend> make_backend(std::string_view device, std::string* note) {
    if (note) note->clear();
    if (device == "cpu") return std::make_unique<CpuBackend>();
    if (device == "auto") {
        // Only worth a word when a GPU is there to be disappointed about.
        if (note && cuda_compiled()) {
            const size_t n_gpus = list_cuda_devices(nullptr).size();
            if (n_gpus > 0)
                *note = "device auto: " + std::to_string(n_gpus) +
                        " CUDA GPU(s) found but tern has no CUDA backend yet; running on the cpu";
        }
        return std::make_unique<CpuBackend>();
    }
    if (device == "cuda" || device.starts_with("cuda:"))
        throw UsageError("--device " + std::string(device) + ": tern was built without a CUDA backend yet (use cpu)");
    throw UsageError("unknown device '" + std::string(device) + "' (choices: auto, cpu, cuda)");
}

} // namespace tern
