#include "app/version.h"

#include <omp.h>

#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/gpu_info.h"

namespace tern::app {

std::string version_string() {
    std::string s = std::string("tern ") + TERN_VERSION;
    s += " (backends: cpu";
    s += ", " + cpu_features().describe();
    s += ", " + std::to_string(cpu_features().physical_cores) + " cores";
    s += ", OpenMP " + std::to_string(_OPENMP);
    // Say what runs, not only what was compiled: the GPUs --device auto would take, or why none.
    if (cuda_compiled()) {
        std::string why;
        const std::vector<GpuInfo> gpus = list_cuda_devices(&why);
        s += "; CUDA: ";
        if (gpus.empty())
            s += "built, " + why;
        else
            for (size_t i = 0; i < gpus.size(); ++i)
                s += (i ? ", cuda:" : "cuda:") + std::to_string(gpus[i].index) + " " + gpus[i].name + " (sm_" +
                     std::to_string(gpus[i].sm_major) + std::to_string(gpus[i].sm_minor) + ")";
    } else {
        s += "; CUDA: not built";
    }
    s += ")";
    return s;
}

} // namespace tern::app
