#pragma once
// Options only the CPU backend takes, given to it at construction (engine/backend_factory.h). Here,
// not in engine/cpu/, because whoever opens a model (engine/open_model.h, app/) sets them;
// what every backend takes at load is RunOptions (engine/backend.h).
namespace tern {

struct CpuOptions {
    int n_threads = 0;   // 0 = physical cores (kernels/cpu_features.h resolve_threads)
    // Dequantize weights and multiply in f32 (slow; the twin-reference check and quantize --calibrate use
    // it; over an f32 KV cache the attention is then the plain softmax too). The default
    // quantizes the activations as ggml does (Q8_0/Q8_1/Q8_K, f16/bf16 for 16-bit weights) and runs the
    // SIMD dot kernels of kernels/cpu/matmul_quant.h, which tracks llama.cpp's own numbers.
    bool exact_matmul = false;
};

} // namespace tern
