#pragma once
#include <string>

namespace tern::app {
// "tern 0.1.0 (build: Release, CUDA on (sm 75 86 89 90 120), CPU: AVX2 FMA F16C, OpenMP 4.5)"
std::string version_string();
}
