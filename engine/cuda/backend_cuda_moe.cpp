// The CUDA backend's routed experts (a layer with LayerConfig::moe; shared experts are the dense FFN's steps), the
// CPU's (engine/cpu/backend_cpu_moe.cpp) on the device: the router's logits (a projection), each token's experts and
// weights (kernels/cuda/moe.h, the choice of engine/moe_router.h), the experts' FFNs, then each token's sum over its
// experts in rank order.
//
// Two ways to run the experts, both reading only the chosen experts' weights:
//   - by slot (decode, draft verification: fewer than kGemmMinColumns tokens): the expert matmuls of
//     kernels/cuda/matmul.h / matmul_q8.h take the ids from device memory, one pass per (token, rank) slot over
//     its expert's matrix. Nothing comes back to the host, so a decode step is captured in a graph like a dense
//     one. A batch of a few tokens may read an expert twice when two of its tokens chose it: cheaper than a
//     round trip at that size.
//   - grouped (prefill): the ids are copied back once per layer and the slots grouped by expert on the host
//     (a counting sort, the CPU's order); the inputs are gathered into one block of rows per expert, each expert
//     that any token chose runs the ordinary projections (GEMM paths included) over its rows, reading its
//     matrices once per batch, and the outputs are scattered back to their slots. A device-side sort would
//     save the round trip, but the host must know each expert's row count anyway to size its launches, and at
//     prefill sizes the wait (tens of microseconds a layer) is small beside the layer's matmuls.
// gpt-oss's biases (ModelConfig::expert_bias): the router's is the router projection's bias; the experts' are rows of
// a stack, one per expert. Grouped, each expert's projections add their own row; by slot, the expert matmuls
// (which take no bias) are followed by add_expert_bias on each slot's rows, one addition each as a projection's bias
// is added, so gate and up run as two launches there and the activation after them.
//
// Batch invariance (a batch of several sequences): both ways take per-column kernels there (per_column_), whose
// column sums are the same bits in any pass, and quantize each column alone, so a token's bits do not depend on
// the batch.
#include <algorithm>
#include <string>

#include "base/error.h"
#include "engine/cuda/backend_cuda.h"
#include "engine/load_errors.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/matmul_q8.h"
#include "kernels/cuda/moe.h"

namespace tern {
inline namespace TERN_CUDA_ABI {
namespace {

// Batches of fewer tokens run their experts by slot (the decode projections' threshold in backend_cuda.cpp).
constexpr int64_t kGroupedMinTokens = 16;

cuda::GluActivation glu_of(FfnActivation a) {
    return a == FfnActivation::silu        ? cuda::GluActivation::silu
           : a == FfnActivation::gelu_tanh ? cuda::GluActivation::gelu_tanh
                                           : cuda::GluActivation::swiglu_oai;
}

} // namespace

void CudaBackend::check_moe_runs(const ModelConfig& c, const ModelWeights& w) const {
    auto refuse = [&](const std::string& what) {
        throw DeviceCannotRun(device_name(), "this mixture of experts has " + what + ", which its forward does not run");
    };
    // A family whose experts carry biases or another activation adds its ModelConfig / LayerWeights fields; until
    // this forward reads them, they belong in this list.
    if (c.n_expert > cuda::kMaxRouterExperts || c.n_expert_used < 1 || c.n_expert_used > cuda::kMaxRouterUsed ||
        c.n_expert_used > c.n_expert)
        refuse(std::to_string(c.n_expert_used) + " of " + std::to_string(c.n_expert) +
               " experts used per token (the router takes up to " + std::to_string(cuda::kMaxRouterUsed) + " of " +
               std::to_string(cuda::kMaxRouterExperts) + ")");
    for (size_t i = 0; i < w.layers.size(); ++i) {
        if (!c.layers[i].moe) continue;   // a leading dense layer
        const LayerWeights& l = w.layers[i];
        for (const WeightRef* m : {&l.gate_exps, &l.up_exps, &l.down_exps}) {
            if (!l.ffn_gate_inp.present() || !m->present()) refuse("a layer without a router or expert tensors");
            // The expert matmuls read each expert 16-byte aligned.
            if (m->row_size() * static_cast<size_t>(m->n_out()) % 16 != 0)
                refuse("experts of " + m->name + " that are not a multiple of 16 bytes");
        }
    }
}

void CudaBackend::moe_ffn(const DeviceLayer& d, const float* xn, int64_t n, float* out, bool new_input) {
    const ModelConfig& c = config_;
    const int64_t k = c.n_expert_used, dim = c.dim;
    const auto slots = static_cast<size_t>(n * k);
    float* logits = moe_logits_.floats(static_cast<size_t>(n * c.n_expert), "router logits");
    auto* ids = static_cast<int32_t*>(moe_ids_.reserve(slots * sizeof(int32_t), "expert ids"));
    float* weights = moe_weights_.floats(slots, "expert weights");
    float* expert_out = moe_out_.floats(slots * static_cast<size_t>(dim), "expert outputs");

    project(d[LayerRole::ffn_gate_inp], xn, n, d.vec(LayerRole::ffn_gate_inp_b), logits, new_input);
    cuda::RouterParams p;
    p.n_expert = c.n_expert;
    p.n_used = static_cast<int>(k);
    p.sigmoid = c.expert_gating == ExpertGating::sigmoid;
    p.softmax_weight = c.expert_gating == ExpertGating::softmax_weight;
    p.normalize = c.expert_weights_norm;
    p.scale = c.expert_weights_scale;
    p.selection_bias = d.vec(LayerRole::exp_probs_b);
    cuda::route_experts(logits, n, p, ids, weights, stream_);
    if (n < kGroupedMinTokens)
        moe_experts_by_slot(d, xn, n, ids, expert_out);
    else
        moe_experts_grouped(d, xn, n, ids, expert_out);
    cuda::moe_combine(expert_out, weights, n, k, dim, out, stream_);
}

// expert_out (n * k, dim): slot s = t * k + r holds expert ids[s]'s FFN of token t's input.
void CudaBackend::moe_experts_by_slot(const DeviceLayer& d, const float* xn, int64_t n, const int32_t* ids,
                                      float* expert_out) {
    const ModelConfig& c = config_;
    const int64_t k = c.n_expert_used, n_slots = n * k;
    const DeviceWeight &gate = d[LayerRole::gate_exps], &up = d[LayerRole::up_exps], &down = d[LayerRole::down_exps];
    const int64_t ffn = gate.n_out;
    // Gate and up read the token's column (k slots a column), down its slot's own.
    const cuda::ExpertSlots by_token{ids, n_slots, k}, by_slot{ids, n_slots, 1};
    auto run = [&](const DeviceWeight& w, const cuda::ExpertSlots& s, const float* x, int64_t n_cols, float* y) {
        if (uses_q8(w))
            cuda::matmul_q8_experts(w.type, w.data, w.n_in, w.n_out, s, q8_input(x, n_cols, w.n_in), y, stream_);
        else
            cuda::matmul_experts(w.type, w.data, w.n_in, w.n_out, s, x, y, stream_);
    };
    float* g = gate_.floats(static_cast<size_t>(n_slots * ffn), "activations");
    const bool biased = d.vec(LayerRole::gate_exps_b) || d.vec(LayerRole::up_exps_b);
    if (gate.type == up.type && !biased) {   // gate, up and the activation in one launch
        if (uses_q8(gate))
            cuda::matmul_q8_experts_glu(gate.type, gate.n_in, ffn, gate.data, up.data, glu_of(c.ffn_act), by_token,
                                        q8_input(xn, n, gate.n_in), g, stream_);
        else
            cuda::matmul_experts_glu(gate.type, gate.n_in, ffn, gate.data, up.data, glu_of(c.ffn_act), by_token, xn,
                                     g, stream_);
    } else {
        float* u = up_.floats(static_cast<size_t>(n_slots * ffn), "activations");
        run(gate, by_token, xn, n, g);
        run(up, by_token, xn, n, u);
        if (d.vec(LayerRole::gate_exps_b)) cuda::add_expert_bias(g, ids, d.vec(LayerRole::gate_exps_b), n_slots, ffn, stream_);
        if (d.vec(LayerRole::up_exps_b)) cuda::add_expert_bias(u, ids, d.vec(LayerRole::up_exps_b), n_slots, ffn, stream_);
        glu_activation(c.ffn_act, g, u, n_slots * ffn);
    }
    q8_of_ = nullptr;   // g is a new input (the same buffer as the last layer's)
    run(down, by_slot, g, n_slots, expert_out);
    if (d.vec(LayerRole::down_exps_b)) cuda::add_expert_bias(expert_out, ids, d.vec(LayerRole::down_exps_b), n_slots, down.n_out, stream_);
}

void CudaBackend::moe_experts_grouped(const DeviceLayer& d, const float* xn, int64_t n, const int32_t* ids,
                                      float* expert_out) {
    const ModelConfig& c = config_;
    const int64_t k = c.n_expert_used, n_slots = n * k, dim = c.dim, n_expert = c.n_expert;
    const auto us = static_cast<size_t>(n_slots);
    moe_host_ids_.resize(us);
    cuda_call(cudaMemcpyAsync(moe_host_ids_.data(), ids, us * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_),
              "copying the experts' ids to the host");
    cuda_call(cudaStreamSynchronize(stream_), "copying the experts' ids to the host");

    // The slots grouped by expert, tokens in batch order within an expert (the CPU's order): grouped row i is
    // slot order[i]; rows [0, n_slots) of the list name its token (the gather), rows [n_slots, 2 n_slots) its
    // slot (the scatter).
    std::vector<int64_t> first(static_cast<size_t>(n_expert + 1), 0);
    for (const int32_t e : moe_host_ids_) {
        if (e < 0 || e >= n_expert) throw RuntimeFailure("cuda: the router chose expert " + std::to_string(e));
        ++first[static_cast<size_t>(e) + 1];
    }
    for (int64_t e = 0; e < n_expert; ++e) first[static_cast<size_t>(e + 1)] += first[static_cast<size_t>(e)];
    moe_host_rows_.resize(2 * us);
    {
        std::vector<int64_t> next(first.begin(), first.end() - 1);
        for (int64_t s = 0; s < n_slots; ++s) {
            const auto row = static_cast<size_t>(next[static_cast<size_t>(moe_host_ids_[static_cast<size_t>(s)])]++);
            moe_host_rows_[row] = static_cast<int32_t>(s / k);
            moe_host_rows_[us + row] = static_cast<int32_t>(s);
        }
    }
    auto* rows = static_cast<int32_t*>(moe_rows_.reserve(2 * us * sizeof(int32_t), "expert row lists"));
    // Pageable memory: the call returns once the rows are staged, so the vector may change after it.
    cuda_call(cudaMemcpyAsync(rows, moe_host_rows_.data(), 2 * us * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "copying the expert row lists to the device");

    const DeviceWeight &gate = d[LayerRole::gate_exps], &up = d[LayerRole::up_exps], &down = d[LayerRole::down_exps];
    const int64_t ffn = gate.n_out;
    auto bias_row = [](const float* stack, int64_t e, int64_t width) { return stack ? stack + e * width : nullptr; };
    auto expert = [](const DeviceWeight& stack, int64_t e) {
        DeviceWeight m = stack;
        m.data = static_cast<const uint8_t*>(stack.data) +
                 static_cast<size_t>(e * stack.n_out) * row_bytes(stack.type, stack.n_in);
        return m;
    };
    float* grouped = moe_grouped_.floats(us * static_cast<size_t>(dim), "grouped expert rows");
    float* g = gate_.floats(us * static_cast<size_t>(ffn), "activations");
    float* u = up_.floats(us * static_cast<size_t>(ffn), "activations");
    cuda::copy_rows(xn, rows, grouped, nullptr, n_slots, dim, stream_);
    for (int64_t e = 0; e < n_expert; ++e) {
        const int64_t s0 = first[static_cast<size_t>(e)], m = first[static_cast<size_t>(e + 1)] - s0;
        if (m == 0) continue;
        project(expert(gate, e), grouped + s0 * dim, m, bias_row(d.vec(LayerRole::gate_exps_b), e, ffn), g + s0 * ffn);
        project(expert(up, e), grouped + s0 * dim, m, bias_row(d.vec(LayerRole::up_exps_b), e, ffn), u + s0 * ffn,
                false);   // one input for both
    }
    glu_activation(c.ffn_act, g, u, n_slots * ffn);
    for (int64_t e = 0; e < n_expert; ++e) {   // the grouped inputs are spent: the outputs take their rows
        const int64_t s0 = first[static_cast<size_t>(e)], m = first[static_cast<size_t>(e + 1)] - s0;
        if (m > 0) project(expert(down, e), g + s0 * ffn, m, bias_row(d.vec(LayerRole::down_exps_b), e, dim), grouped + s0 * dim);
    }
    cuda::copy_rows(grouped, nullptr, expert_out, rows + n_slots, n_slots, dim, stream_);
}

} // namespace TERN_CUDA_ABI
} // namespace tern
