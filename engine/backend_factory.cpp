#include "engine/backend_factory.h"

#include <cstdlib>
#include <string>

#include "engine/cpu/backend_cpu.h"
#include "engine/split_backend.h"
#if defined(TERN_HAVE_CUDA)
#include "engine/cuda/backend_cuda.h"
#endif
#include "base/error.h"
#include "kernels/gpu_info.h"

namespace tern {
namespace {

std::string unavailable_message(const std::string& device, DeviceUnavailable::Reason reason) {
    if (reason == DeviceUnavailable::Reason::not_built)
        return "device " + device + ": tern was built without CUDA (use cpu)";
    return "unknown device '" + device + "' (choices: auto, cpu, cuda, cuda:N)";
}

} // namespace

DeviceUnavailable::DeviceUnavailable(std::string device_, Reason reason_)
    : UsageError(unavailable_message(device_, reason_)), device(std::move(device_)), reason(reason_) {}

GpuUnavailable::GpuUnavailable(std::string device_, std::string why_)
    : RuntimeFailure("device " + device_ + ": " + why_), device(std::move(device_)), why(std::move(why_)) {}

std::optional<DeviceChoice> parse_device(std::string_view device) {
    if (device == "auto") return DeviceChoice{true, DeviceKind::cpu, 0};
    if (device == "cpu") return DeviceChoice{false, DeviceKind::cpu, 0};
    if (device == "cuda") return DeviceChoice{false, DeviceKind::cuda, 0};
    if (device.starts_with("cuda:")) {
        const std::string_view digits = device.substr(5);
        if (digits.empty() || digits.size() > 3 || digits.find_first_not_of("0123456789") != std::string_view::npos)
            return std::nullopt;
        return DeviceChoice{false, DeviceKind::cuda, std::stoi(std::string(digits))};
    }
    return std::nullopt;
}

#if defined(TERN_HAVE_CUDA)
std::unique_ptr<Backend> gpu_backend(int index, const CpuOptions& cpu, int32_t gpu_layers) {
    CudaOptions options;
    options.device = index;
    // TERN_CUDA_GRAPHS=0 launches every kernel of a decode step instead of replaying its graph (to
    // measure what the graphs save, or to rule them out).
    const char* graphs = std::getenv("TERN_CUDA_GRAPHS");
    options.graphs = !(graphs && std::string_view(graphs) == "0");
    // TERN_CUDA_PREFILL=f16|int8|f32 forces the prefill GEMM (CudaOptions::prefill) where a weight's format
    // allows it, so a GPU run can time each path.
    if (const char* prefill = std::getenv("TERN_CUDA_PREFILL"); prefill && *prefill) {
        const std::string_view p(prefill);
        if (p == "f16") options.prefill = CudaOptions::Prefill::f16;
        else if (p == "int8") options.prefill = CudaOptions::Prefill::int8;
        else if (p == "f32") options.prefill = CudaOptions::Prefill::f32;
        else throw UsageError("TERN_CUDA_PREFILL=" + std::string(p) + ": expected f16, int8 or f32");
    }
    // TERN_CUDA_PDL=0 launches the forward's kernels without programmatic dependent launch (on by default
    // where the GPU has it, compute capability 9.0+: to measure what it saves, or to rule it out).
    const char* pdl = std::getenv("TERN_CUDA_PDL");
    options.programmatic_launches = !(pdl && std::string_view(pdl) == "0");
    // TERN_CUDA_GLU_Q8=0: decode quantizes the gated FFN's output for the down projection in a launch of its own
    // rather than in the FFN's launch (to measure what the fusion saves, or to rule it out).
    const char* glu_q8 = std::getenv("TERN_CUDA_GLU_Q8");
    options.glu_writes_q8 = !(glu_q8 && std::string_view(glu_q8) == "0");
    // TERN_CUDA_ATTN=old decodes with the previous attention kernel and split rule (kernels/cuda/attention.h
    // set_old_decode_attention), to time the streaming one against it.
    const char* attn = std::getenv("TERN_CUDA_ATTN");
    options.old_decode_attention = attn && std::string_view(attn) == "old";
    // TERN_CUDA_ATTN_PREFILL=f32|mma: prefill attention on the f32 kernel instead of the f16 tensor cores (mma,
    // the default; kernels/cuda/attention_mma.h), to measure what they save or to rule them out.
    if (const char* attn_prefill = std::getenv("TERN_CUDA_ATTN_PREFILL"); attn_prefill && *attn_prefill) {
        const std::string_view p(attn_prefill);
        if (p == "f32") options.prefill_attention = cuda::PrefillAttention::f32;
        else if (p == "mma") options.prefill_attention = cuda::PrefillAttention::mma;
        else throw UsageError("TERN_CUDA_ATTN_PREFILL=" + std::string(p) + ": expected f32 or mma");
    }
    auto gpu = std::make_unique<CudaBackend>(options);
    if (gpu_layers < 0) return gpu;
    return std::make_unique<SplitBackend>(std::make_unique<CpuBackend>(cpu), std::move(gpu), gpu_layers);
}
#endif

std::unique_ptr<Backend> make_backend(std::string_view device, const CpuOptions& cpu, std::string* note,
                                      int32_t gpu_layers) {
#if !defined(TERN_HAVE_CUDA)
    (void)gpu_layers;   // no GPU to put layers on
#endif
    if (note) note->clear();
    const std::optional<DeviceChoice> choice = parse_device(device);
    if (!choice) throw DeviceUnavailable(std::string(device), DeviceUnavailable::Reason::unknown);
    if (choice->automatic) {
#if defined(TERN_HAVE_CUDA)
        std::string why;
        const std::vector<GpuInfo> gpus = list_cuda_devices(&why);
        if (!gpus.empty()) return gpu_backend(gpus.front().index, cpu, gpu_layers);
        if (note) *note = "device auto: " + why + "; running on the cpu";
#endif
        return std::make_unique<CpuBackend>(cpu);
    }
    switch (choice->kind) {
    case DeviceKind::cpu: return std::make_unique<CpuBackend>(cpu);
    case DeviceKind::cuda: break;
    }
#if defined(TERN_HAVE_CUDA)
    std::string why;
    const std::vector<GpuInfo> gpus = list_cuda_devices(&why);
    if (gpus.empty()) throw GpuUnavailable(std::string(device), why);
    for (const GpuInfo& g : gpus)
        if (g.index == choice->index) return gpu_backend(g.index, cpu, gpu_layers);
    throw GpuUnavailable(std::string(device), "this machine has " + std::to_string(gpus.size()) + " CUDA GPU(s), " +
                                                  "numbered from 0");
#else
    throw DeviceUnavailable(std::string(device), DeviceUnavailable::Reason::not_built);
#endif
}

} // namespace tern
