#include "kernels/cpu_features.h"

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tern {
namespace {

// Physical cores from /proc/cpuinfo's (physical id, core id) pairs; logical count otherwise.
int count_physical_cores(int logical) {
    std::ifstream f("/proc/cpuinfo");
    std::set<std::pair<int, int>> cores;
    std::string line;
    int physical_id = 0;
    while (std::getline(f, line)) {
        auto value = [&]() { return std::stoi(line.substr(line.find(':') + 1)); };
        if (line.rfind("physical id", 0) == 0) physical_id = value();
        else if (line.rfind("core id", 0) == 0) cores.insert({physical_id, value()});
    }
    return cores.empty() ? logical : static_cast<int>(cores.size());
}

CpuFeatures detect() {
    CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        f.fma = c & bit_FMA;
        f.f16c = c & bit_F16C;
        const bool osxsave = c & bit_OSXSAVE;
        unsigned long long xcr0 = 0;
        if (osxsave) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            xcr0 = (static_cast<unsigned long long>(hi) << 32) | lo;
        }
        const bool os_avx = (xcr0 & 0x6) == 0x6;
        const bool os_avx512 = (xcr0 & 0xe6) == 0xe6;
        if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
            f.avx2 = os_avx && (b & bit_AVX2);
            f.avx512f = os_avx512 && (b & bit_AVX512F);
            f.avx512bw = os_avx512 && (b & bit_AVX512BW);
            f.avx512vl = os_avx512 && (b & bit_AVX512VL);
            f.avx512vnni = os_avx512 && (c & bit_AVX512VNNI);
        }
        if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = os_avx512 && (a & (1u << 5));
        f.fma = f.fma && os_avx;
        f.f16c = f.f16c && os_avx;
    }
#elif defined(__aarch64__)
    f.neon = true;
#if defined(__linux__)
    f.neon_dotprod = getauxval(AT_HWCAP) & HWCAP_ASIMDDP;
#endif
#endif
    f.logical_cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    f.physical_cores = count_physical_cores(f.logical_cores);
    return f;
}

} // namespace

std::string CpuFeatures::describe() const {
    std::string s;
    auto add = [&](bool on, const char* name) {
        if (!on) return;
        if (!s.empty()) s += ' ';
        s += name;
    };
    add(avx2, "AVX2");
    add(fma, "FMA");
    add(f16c, "F16C");
    add(avx512f, "AVX512F");
    add(avx512bw, "AVX512BW");
    add(avx512vl, "AVX512VL");
    add(avx512vnni, "AVX512VNNI");
    add(avx512bf16, "AVX512BF16");
    add(neon, "NEON");
    add(neon_dotprod, "DOTPROD");
    return s.empty() ? "scalar" : s;
}

const CpuFeatures& cpu_features() {
    static const CpuFeatures features = detect();
    return features;
}

int resolve_threads(int requested) {
    return requested > 0 ? requested : std::max(1, cpu_features().physical_cores);
}

} // namespace tern
