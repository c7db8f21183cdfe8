#include "app/version.h"

#include <omp.h>

#include "kernels/cpu_features.h"
#include "kernels/gpu_info.h"

namespace tern::app {

std::string version_string() {
    std::string s = std::string("tern ") + TERN_VERSION;
    s += std::string(" (CUDA ") + (cuda_compiled() ? "on" : "off");
    s += ", CPU: " + cpu_features().describe();
    s += ", " + std::to_string(cpu_features().physical_cores) + " cores";
    s += ", OpenMP " + std::to_string(_OPENMP);
    s += ")";
    return s;
}

} // namespace tern::app
