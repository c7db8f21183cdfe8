#pragma once
// The decoder, written once for every backend: embed -> per layer {mixer block, FFN block} -> norm -> logits,
// as a program of coarse steps that each backend implements (DecoderSteps). Which mixer a layer has, which
// norms come before and after each block, how a block's output joins the residual stream, a dense or a routed
// FFN and what the logits go through are decided here, from the ModelConfig, once at load
// (decoder_program); a backend's steps only compute. A backend keeps its own fusions inside a step (the CUDA
// backend's fused norm + int8 quantization, q/k/v in one launch, a projection accumulated straight into the
// stream), and nothing in a backend loops over layers.
#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend.h"
#include "engine/rope_plan.h"
#include "engine/tensor_roles.h"

namespace tern {

struct ModelConfig;

// How a block's output joins the residual stream: x += scale * post_norm(out), post_norm optional.
struct ResidualPlan {
    bool post_norm = false;
    LayerRole norm = LayerRole::post_attn_norm;   // which, when post_norm
    float scale = 1.0f;
};

// The attention mixer's q/k treatment.
struct AttentionPlan {
    bool qk_norm = false;         // q_norm / k_norm before RoPE ...
    bool qk_norm_whole = false;   // ... over every head at once instead of each head (olmo2)
    RopePlan rope;
    bool v_norm = false;          // V RMS-normed per head, no weight (gemma4)
    // >= 0: the layer's K and V are not projected or cached; it attends over this layer's cache (the backend's
    // numbering, an earlier layer of the slice: gemma4's shared KV). -1: its own.
    int32_t kv_source = -1;
};

// A block's input: RMSNorm(x) * the layer's norm, or x itself (no pre-norm: olmo2).
struct BlockInput {
    bool norm = true;
    LayerRole weight = LayerRole::attn_norm;
    LayerRole reader = LayerRole::wq;   // the first projection that reads it (its format decides the input's form)
};

enum class MixerKind : uint8_t { attention };
enum class FfnKind : uint8_t { dense, experts };

struct LayerPlan {
    MixerKind mixer = MixerKind::attention;
    BlockInput mixer_input;
    AttentionPlan attention;
    ResidualPlan mixer_residual;
    FfnKind ffn = FfnKind::dense;
    // With FfnKind::experts: a shared experts' FFN too (GatedFfn::shared_experts), its output added to the stream
    // beside the routed experts' (both through ffn_residual, which therefore has no post-norm).
    bool shared_experts = false;
    BlockInput ffn_input;
    ResidualPlan ffn_residual;
    // After the FFN: x += post_norm(proj(gelu(inp_gate x) * this layer's per-layer input)) (gemma4 E2B/E4B).
    bool per_layer_input = false;
    // Then x *= the layer's layer_output_scale.weight, where the file has it (gemma4).
    bool output_scale = false;
};

struct LogitsPlan {
    float softcap = 0.0f;       // logits -> c * tanh(l / c) when > 0
    float multiplier = 1.0f;    // then logits *= multiplier (1 / granite's logit_scale)
};

struct DecoderProgram {
    float embed_scale = 1.0f;
    std::vector<LayerPlan> layers;   // by the backend's own numbering (a slice of a split model: its layers)
    int32_t first_layer = 0;         // the model's index of layers[0], for observers
    LogitsPlan logits;
    // The per-layer inputs of every token are computed once, right after the embedding (gemma4).
    bool per_layer_inputs = false;
};

// The program for a config (a slice's config when the model is split; first_layer its model index).
DecoderProgram decoder_program(const ModelConfig& config, int32_t first_layer = 0);

// A run of consecutive rows of the batch: the rows whose logits a forward keeps are such runs, one per span
// (its last token, or all of them), in span order.
struct RowRun {
    int64_t first = 0, count = 0;
};
std::vector<RowRun> kept_rows(const ForwardBatch& batch);

// Rows of f32 on the host (an observer's view of a projection input), valid until the next step.
struct HostRows {
    const float* data = nullptr;
    int64_t rows = 0, width = 0;
};

// What a backend implements. The activations live in the backend: the residual stream x (n rows of dim),
// the block input xn, the attention's output, the FFN's hidden activation, the logits.
class DecoderSteps {
public:
    virtual ~DecoderSteps() = default;
    // x = the batch's tokens' embedding rows times `scale`.
    virtual void embed(float scale) = 0;
    // x = ForwardBatch::hidden_in: a later slice of a split model starts from the stream the one before computed.
    virtual void stream_in() = 0;
    // xn = the block's input (BlockInput), ready for its reader's projections.
    virtual void block_input(int32_t layer, const BlockInput& input) = 0;
    // q, k, v = the projections of xn (+ biases), q/k normed, rotated at each token's position, q scaled by
    // the attention temperature; k and v written to the layer's KV cache.
    virtual void attention_qkv(int32_t layer, const AttentionPlan& plan) = 0;
    // The attention's output: q over the layer's cache, each token over its own sequence.
    virtual void attend(int32_t layer) = 0;
    // x += the output projection of the attention's output (+ bias), as `residual` says.
    virtual void attention_output(int32_t layer, const ResidualPlan& residual) = 0;
    // The FFN's hidden activation = act(W_gate xn + b) * (W_up xn + b), of the dense FFN or the shared experts'
    // (ffn_roles(which)).
    virtual void ffn_gate_up(int32_t layer, GatedFfn which) = 0;
    // x += the down projection of the hidden activation (+ bias), as `residual` says.
    virtual void ffn_down(int32_t layer, GatedFfn which, const ResidualPlan& residual) = 0;
    // x += the routed experts' FFN of xn, as `residual` says. xn is the block input even when a shared experts'
    // FFN ran since block_input (its projections may have replaced the backend's quantized form of it).
    virtual void ffn_experts(int32_t layer, const ResidualPlan& residual) = 0;
    // gemma4: each token's per-layer inputs (ModelConfig::per_layer_dim) from its embedding x and its row of
    // per_layer_token_embd, kept for the layers' per_layer_block steps.
    virtual void per_layer_inputs();
    // x += post_norm(proj(gelu(inp_gate x) * the layer's per-layer input)).
    virtual void per_layer_block(int32_t layer);
    // x *= the layer's output scale (nothing when the layer has none).
    virtual void layer_output_scale(int32_t layer);
    // ForwardBatch::hidden_out = x: a slice before the last hands the stream on (no logits kept).
    virtual void stream_out() = 0;
    // xn = RMSNorm(the kept rows of x) * output_norm, gathered in order.
    virtual void final_norm(std::span<const RowRun> kept) = 0;
    // The kept logits = the output matrix times xn's kept rows, then softcap and multiplier.
    virtual void lm_head(int64_t rows, const LogitsPlan& plan) = 0;
    // Whether the slice holds the embedding / the output matrix.
    virtual bool has_embedding() const = 0;
    virtual bool has_output() const = 0;
    // The f32 input of a projection group as host rows (a GPU copies it back), for the observer.
    virtual HostRows projection_input(ProjectionInput which) = 0;
};

// One forward of `batch` through `steps`. observer (null: none) sees every projection group's input.
void run_decoder(const DecoderProgram& program, const ForwardBatch& batch, DecoderSteps& steps,
                 ForwardObserver* observer);

} // namespace tern
