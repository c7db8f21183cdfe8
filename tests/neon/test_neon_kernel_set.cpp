// The NEON kernel set as it runs on aarch64 (under qemu-aarch64 via scripts/test_neon.sh): it is the set
// this process picks, every dot kernel in it is a NEON one, and the entries that still hold a scalar twin
// are named (today only the f32 "quantizer", a copy every set shares). tests/kernels/test_kernels_dot.cpp
// compares the kernels themselves with their scalar twins; that suite skips an ISA the CPU cannot run,
// which is why this one insists that NEON does run here.
#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/dispatch.h"
#include "quant/types.h"
#include "tests/kernel_test_data.h"

namespace tern {
namespace {

constexpr ActFormat kActFormats[] = {ActFormat::f32,  ActFormat::f16,  ActFormat::bf16,
                                     ActFormat::q8_0, ActFormat::q8_1, ActFormat::q8_k};

// Names of the entries of `k` that are the scalar twins rather than kernels of its own.
std::vector<std::string> scalar_entries(const CpuKernels& k, const CpuKernels& scalar) {
    std::vector<std::string> names;
    for (GgmlType t : test::kDotWeightTypes)
        if (k.dot(t) == scalar.dot(t)) names.push_back(std::string("dot ") + std::string(type_name(t)));
    for (ActFormat f : kActFormats)
        if (k.quantizer(f) == scalar.quantizer(f)) names.push_back(std::string("quantize ") + act_format_name(f));
    return names;
}

std::string joined(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v)
        s += (s.empty() ? "" : ", ") + x;
    return s.empty() ? "none" : s;
}

} // namespace

#if defined(__aarch64__)

TEST_CASE("aarch64: the NEON set loads and is the default") {
    const CpuKernels* neon = cpu_kernels_for(CpuIsa::neon);
    INFO("this CPU: no NEON dotprod (qemu-aarch64 must emulate a CPU with it: its default 'max' does)");
    REQUIRE(neon != nullptr);
    CHECK(neon->isa == CpuIsa::neon);
    const char* env = std::getenv("TERN_CPU_ISA");
    if (!env || !*env) CHECK(cpu_kernels().isa == CpuIsa::neon);
}

TEST_CASE("aarch64: every NEON entry is a NEON kernel except the documented scalar ones") {
    const CpuKernels* neon = cpu_kernels_for(CpuIsa::neon);
    const CpuKernels* scalar = cpu_kernels_for(CpuIsa::scalar);
    REQUIRE(neon);
    REQUIRE(scalar);
    const auto fallbacks = scalar_entries(*neon, *scalar);
    MESSAGE("NEON entries that run the scalar twin: " << joined(fallbacks));
    // f32 "quantization" is a copy (quantize_act_f32) that every set shares.
    CHECK(joined(fallbacks) == "quantize f32");
}

#endif

TEST_CASE("an entry the NEON file leaves empty keeps the scalar twin, and an empty table names its ISA") {
    CpuKernels neon_only;
    neon_only.isa = CpuIsa::neon;
    fill_cpu_kernels_neon(neon_only); // what dispatch.cpp does after fill_cpu_kernels_scalar, without it
    CpuKernels scalar;
    fill_cpu_kernels_scalar(scalar);
    CpuKernels layered = scalar; // dispatch.cpp's order: scalar first, then the NEON file
    fill_cpu_kernels_neon(layered);
    layered.isa = CpuIsa::neon;
    for (GgmlType t : test::kDotWeightTypes) {
        const std::string type(type_name(t));
        CAPTURE(type);
        VecDotFn own = nullptr;
        try {
            own = neon_only.dot(t);
        } catch (const std::invalid_argument& e) { // a missing entry is an error that names the set
            CHECK(std::string(e.what()).find("CPU kernels (neon)") != std::string::npos);
        }
        CHECK((layered.dot(t) == (own ? own : scalar.dot(t))));
    }
    for (ActFormat f : kActFormats) {
        const std::string act(act_format_name(f));
        CAPTURE(act);
        REQUIRE((layered.quantizer(f) != nullptr));
        CHECK((layered.quantizer(f) == (neon_only.quantizer(f) ? neon_only.quantizer(f) : scalar.quantizer(f))));
    }
    // A weight format no set has: the error names the set and the format.
    CHECK_THROWS_WITH_AS(layered.dot(GgmlType::IQ2_XS), doctest::Contains("CPU kernels (neon)"), std::invalid_argument);
    CHECK((neon_only.quantizer(ActFormat::f32) == nullptr)); // no NEON copy: the scalar one fills the gap
}

} // namespace tern
