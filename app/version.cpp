#include "app/version.h"

#include <omp.h>

#include "kernels/cpu_features.h"
#include "kernels/gpu_info.h"

namespace tern::app {

std::string version_string() {
    std::string s = std::string("tern ") + TERN_VERSION;
    s += " (backends: cpu";
    s += ", " + cpu_features().describe();
    s += ", " + std::to_string(cpu_features().physical_cores) + " cores";
    s += ", OpenMP " + std::to_string(_OPENMP);
    // Say what runs, not what was compiled: a CUDA toolkit at build time gives only the device
    // query today, and a user reading "CUDA on" would expect the GPU to be used.
    s += cuda_compiled() ? "; CUDA: device query only, no GPU backend yet" : "; CUDA: not built";
    s += ")";
    return s;
}

} // namespace tern::app
