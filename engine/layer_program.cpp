#include "engine/layer_program.h"

#include <string>

#include "base/error.h"
#include "engine/model_config.h"

namespace tern {

DecoderProgram decoder_program(const ModelConfig& c, int32_t first_layer) {
    DecoderProgram p;
    p.embed_scale = c.embed_scale;
    p.first_layer = first_layer;
    p.logits.softcap = c.final_softcap;
    p.logits.multiplier = c.logit_scale == 1.0f ? 1.0f : 1.0f / c.logit_scale;
    p.per_layer_inputs = c.per_layer_dim > 0;
    if (p.per_layer_inputs && first_layer > 0)
        throw UsageError("this model's per-layer token embeddings are computed with the embedding: its layers "
                         "cannot be split across devices yet");
    for (int32_t l = 0; l < c.n_layers; ++l) {
        const LayerConfig& lc = c.layers[static_cast<size_t>(l)];
        LayerPlan lp;
        lp.mixer = MixerKind::attention;
        lp.mixer_input = {c.pre_norms, LayerRole::attn_norm, LayerRole::wq};
        lp.attention = {c.qk_norm, c.qk_norm_whole, rope_plan(c, l)};
        lp.attention.v_norm = c.v_norm;
        if (const int32_t src = c.layers[static_cast<size_t>(l)].kv_source; src >= 0) {
            lp.attention.kv_source = src - first_layer;
            if (lp.attention.kv_source < 0 || lp.attention.kv_source >= l)
                throw UsageError("layer " + std::to_string(first_layer + l) + " reads the KV of layer " +
                                 std::to_string(src) + ", which is on another device: split this model so both are "
                                 "on one (a different -ngl)");
        }
        lp.per_layer_input = c.per_layer_dim > 0;
        lp.output_scale = c.arch == Arch::gemma4;
        lp.mixer_residual = {c.post_norms, LayerRole::post_attn_norm, c.residual_scale};
        lp.ffn = lc.moe ? FfnKind::experts : FfnKind::dense;
        lp.shared_experts = lc.moe && c.n_expert_shared > 0;
        lp.ffn_input = {c.pre_norms, LayerRole::ffn_norm, lc.moe ? LayerRole::ffn_gate_inp : LayerRole::w_gate};
        lp.ffn_residual = {c.post_norms, LayerRole::post_ffn_norm, c.residual_scale};
        // The shared and the routed experts join the stream one after the other: a post-norm would have to see
        // their sum.
        if (lp.shared_experts && lp.ffn_residual.post_norm)
            throw UsageError("decoder: shared experts with a post-FFN norm are not supported");
        p.layers.push_back(lp);
    }
    return p;
}

void DecoderSteps::per_layer_inputs() {
    throw UsageError("this backend does not compute per-layer token embeddings (gemma4) yet");
}

void DecoderSteps::per_layer_block(int32_t) {
    throw UsageError("this backend does not compute per-layer token embeddings (gemma4) yet");
}

void DecoderSteps::layer_output_scale(int32_t) {
    throw UsageError("this backend does not scale layer outputs (gemma4) yet");
}

std::vector<RowRun> kept_rows(const ForwardBatch& batch) {
    const auto n = static_cast<int64_t>(batch.tokens.size());
    if (batch.spans.empty()) {
        const int64_t keep = batch.wanted == LogitsWanted::all ? n : 1;
        return {{n - keep, keep}};
    }
    std::vector<RowRun> runs;
    int64_t first = 0;
    for (const SequenceSpan& s : batch.spans) {
        const int64_t keep = s.wanted == LogitsWanted::all ? s.n_tokens : 1;
        runs.push_back({first + s.n_tokens - keep, keep});
        first += s.n_tokens;
    }
    return runs;
}

namespace {

void observe(ForwardObserver* observer, DecoderSteps& steps, int32_t layer, ProjectionInput which) {
    if (!observer) return;
    const HostRows x = steps.projection_input(which);
    observer->matmul_input(layer, which, x.data, x.rows, x.width);
}

} // namespace

void run_decoder(const DecoderProgram& program, const ForwardBatch& batch, DecoderSteps& steps,
                 ForwardObserver* observer) {
    if (steps.has_embedding()) {
        steps.embed(program.embed_scale);
        if (program.per_layer_inputs) steps.per_layer_inputs();
    } else {
        if (!batch.hidden_in) throw UsageError("forward: a slice without the embedding needs the hidden state in");
        steps.stream_in();
    }
    for (size_t i = 0; i < program.layers.size(); ++i) {
        const LayerPlan& lp = program.layers[i];
        const auto l = static_cast<int32_t>(i);
        const int32_t model_layer = program.first_layer + l;

        // Mixer block (attention).
        steps.block_input(l, lp.mixer_input);
        observe(observer, steps, model_layer, ProjectionInput::attn_qkv);
        steps.attention_qkv(l, lp.attention);
        steps.attend(l);
        observe(observer, steps, model_layer, ProjectionInput::attn_output);
        steps.attention_output(l, lp.mixer_residual);

        // FFN block: dense or routed experts.
        steps.block_input(l, lp.ffn_input);
        if (lp.ffn == FfnKind::experts) {
            // The shared experts first (their inputs are not observed: the observer's groups are the dense
            // projections'), then the routed ones.
            if (lp.shared_experts) {
                steps.ffn_gate_up(l, GatedFfn::shared_experts);
                steps.ffn_down(l, GatedFfn::shared_experts, lp.ffn_residual);
            }
            steps.ffn_experts(l, lp.ffn_residual);
        } else {
            observe(observer, steps, model_layer, ProjectionInput::ffn_gate_up);
            steps.ffn_gate_up(l, GatedFfn::dense);
            observe(observer, steps, model_layer, ProjectionInput::ffn_down);
            steps.ffn_down(l, GatedFfn::dense, lp.ffn_residual);
        }
        if (lp.per_layer_input) steps.per_layer_block(l);
        if (lp.output_scale) steps.layer_output_scale(l);
    }
    if (!steps.has_output()) {
        if (!batch.hidden_out) throw UsageError("forward: a slice without the output matrix needs a hidden state out");
        steps.stream_out();
        return;
    }
    const std::vector<RowRun> kept = kept_rows(batch);
    int64_t rows = 0;
    for (const RowRun& r : kept) rows += r.count;
    steps.final_norm(kept);
    observe(observer, steps, -1, ProjectionInput::lm_head);
    steps.lm_head(rows, program.logits);
}

} // namespace tern
