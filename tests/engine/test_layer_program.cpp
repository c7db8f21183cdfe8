// The layer program (engine/layer_program.h) and the tensor-role table (engine/tensor_roles.h): the steps a
// forward takes for each kind of family, in order, recorded by a fake backend; the kept rows of a batch; the
// table's rows (one per LayerWeights member, names unique, required where the config says).
#include <doctest/doctest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/layer_program.h"
#include "engine/model_config.h"
#include "engine/tensor_roles.h"

namespace tern {
namespace {

ModelConfig config(int32_t n_layers) {
    ModelConfig c;
    c.n_layers = n_layers;
    c.dim = 32;
    c.vocab = 16;
    c.head_dim = c.head_dim_v = c.n_rot = 8;
    for (int32_t l = 0; l < n_layers; ++l) {
        LayerConfig lc;
        lc.n_heads = 4;
        lc.n_kv_heads = 2;
        lc.ffn_dim = 64;
        c.layers.push_back(lc);
    }
    return c;
}

// Records each step as a word, with what it was asked for.
class RecordingSteps final : public DecoderSteps {
public:
    bool embedding = true, output = true;
    std::vector<std::string> log;

    void embed(float scale) override { log.push_back("embed*" + std::to_string(scale)); }
    void stream_in() override { log.push_back("stream_in"); }
    void block_input(int32_t l, const BlockInput& in) override {
        log.push_back("input" + std::to_string(l) + (in.norm ? ":" + std::string(layer_tensor(in.weight).name) : ":none") +
                      ">" + layer_tensor(in.reader).name);
    }
    void attention_qkv(int32_t l, const AttentionPlan& p) override {
        log.push_back("qkv" + std::to_string(l) + (p.qk_norm ? (p.qk_norm_whole ? "+whole_norm" : "+head_norm") : "") +
                      (p.v_norm ? "+v_norm" : "") + " rot" + std::to_string(p.rope.n_rot) +
                      (p.kv_source >= 0 ? " kv_of" + std::to_string(p.kv_source) : ""));
    }
    void per_layer_inputs() override { log.push_back("per_layer_inputs"); }
    void per_layer_block(int32_t l) override { log.push_back("per_layer" + std::to_string(l)); }
    void layer_output_scale(int32_t l) override { log.push_back("out_scale" + std::to_string(l)); }
    void attend(int32_t l) override { log.push_back("attend" + std::to_string(l)); }
    void attention_output(int32_t l, const ResidualPlan& r) override { log.push_back("wo" + std::to_string(l) + res(r)); }
    void ffn_gate_up(int32_t l, GatedFfn f) override {
        log.push_back("gate_up" + std::to_string(l) + (f == GatedFfn::shared_experts ? "+shexp" : ""));
    }
    void ffn_down(int32_t l, GatedFfn f, const ResidualPlan& r) override {
        log.push_back("down" + std::to_string(l) + (f == GatedFfn::shared_experts ? "+shexp" : "") + res(r));
    }
    void ffn_experts(int32_t l, const ResidualPlan& r) override { log.push_back("experts" + std::to_string(l) + res(r)); }
    void stream_out() override { log.push_back("stream_out"); }
    void final_norm(std::span<const RowRun> kept) override {
        std::string s = "final_norm";
        for (const RowRun& r : kept) s += " " + std::to_string(r.first) + "+" + std::to_string(r.count);
        log.push_back(s);
    }
    void lm_head(int64_t rows, const LogitsPlan& p) override {
        log.push_back("lm_head " + std::to_string(rows) + (p.softcap > 0 ? " softcap" : "") +
                      (p.multiplier != 1.0f ? " *" + std::to_string(p.multiplier) : ""));
    }
    bool has_embedding() const override { return embedding; }
    bool has_output() const override { return output; }
    HostRows projection_input(ProjectionInput which) override {
        log.push_back("observe" + std::to_string(static_cast<int>(which)));
        return {nullptr, 0, 0};
    }

private:
    static std::string res(const ResidualPlan& r) {
        return (r.post_norm ? std::string(" post:") + layer_tensor(r.norm).name : std::string()) +
               (r.scale != 1.0f ? " *" + std::to_string(r.scale) : "");
    }
};

struct CountingObserver final : ForwardObserver {
    std::vector<std::pair<int32_t, ProjectionInput>> seen;
    void matmul_input(int32_t layer, ProjectionInput which, const float*, int64_t, int64_t) override {
        seen.emplace_back(layer, which);
    }
};

std::vector<std::string> run(const ModelConfig& c, RecordingSteps& steps, const ForwardBatch& batch,
                             ForwardObserver* observer = nullptr, int32_t first_layer = 0) {
    run_decoder(decoder_program(c, first_layer), batch, steps, observer);
    return steps.log;
}

const int32_t kTokens[3] = {1, 2, 3};

TEST_CASE("a llama layer: pre-norms, q/k/v with rope, attention, output and the dense FFN, each added to the stream") {
    RecordingSteps s;
    ForwardBatch b;
    b.tokens = kTokens;
    const std::vector<std::string> want = {"embed*1.000000",
                                           "input0:attn_norm.weight>attn_q.weight",
                                           "qkv0 rot8",
                                           "attend0",
                                           "wo0",
                                           "input0:ffn_norm.weight>ffn_gate.weight",
                                           "gate_up0",
                                           "down0",
                                           "final_norm 2+1",
                                           "lm_head 1"};
    CHECK(run(config(1), s, b) == want);
}

TEST_CASE("gemma: scaled embedding, per-head q/k norms, post-norms before each residual add, a logit softcap") {
    ModelConfig c = config(1);
    c.embed_scale = 2.0f;
    c.qk_norm = c.post_norms = true;
    c.final_softcap = 30.0f;
    RecordingSteps s;
    ForwardBatch b;
    b.tokens = kTokens;
    b.wanted = LogitsWanted::all;
    const std::vector<std::string> want = {"embed*2.000000",
                                           "input0:attn_norm.weight>attn_q.weight",
                                           "qkv0+head_norm rot8",
                                           "attend0",
                                           "wo0 post:post_attention_norm.weight",
                                           "input0:ffn_norm.weight>ffn_gate.weight",
                                           "gate_up0",
                                           "down0 post:post_ffw_norm.weight",
                                           "final_norm 0+3",
                                           "lm_head 3 softcap"};
    CHECK(run(c, s, b) == want);
}

TEST_CASE("olmo2 and granite are data: no pre-norms and whole-width q/k norms; residual and logit scales") {
    ModelConfig olmo = config(1);
    olmo.pre_norms = false;
    olmo.post_norms = olmo.qk_norm = olmo.qk_norm_whole = true;
    RecordingSteps s;
    ForwardBatch b;
    b.tokens = kTokens;
    const std::vector<std::string> log = run(olmo, s, b);
    CHECK(log[1] == "input0:none>attn_q.weight");
    CHECK(log[2] == "qkv0+whole_norm rot8");
    CHECK(log[5] == "input0:none>ffn_gate.weight");

    ModelConfig granite = config(1);
    granite.residual_scale = 0.25f;
    granite.logit_scale = 8.0f;
    RecordingSteps g;
    const std::vector<std::string> glog = run(granite, g, b);
    CHECK(glog[4] == "wo0 *0.250000");
    CHECK(glog[7] == "down0 *0.250000");
    CHECK(glog.back() == "lm_head 1 *0.125000");
}

TEST_CASE("a mixture of experts reads its block input for the router and runs the experts' step") {
    ModelConfig c = config(2);
    c.n_expert = 4;
    c.n_expert_used = 2;
    c.expert_ffn_dim = 16;
    for (LayerConfig& l : c.layers) l.moe = true;
    RecordingSteps s;
    ForwardBatch b;
    b.tokens = kTokens;
    const std::vector<std::string> log = run(c, s, b);
    CHECK(log[5] == "input0:ffn_norm.weight>ffn_gate_inp.weight");
    CHECK(log[6] == "experts0");
    CHECK(log[12] == "experts1");
}

TEST_CASE("a slice of a split model starts from the stream in and hands the stream out; NoPE layers rotate nothing") {
    ModelConfig c = config(2);
    c.layers[1].no_rope = true;
    RecordingSteps s;
    s.embedding = s.output = false;
    std::vector<float> in(3 * 32), out(3 * 32);
    ForwardBatch b;
    b.tokens = kTokens;
    b.hidden_in = in.data();
    b.hidden_out = out.data();
    const std::vector<std::string> log = run(c, s, b);
    CHECK(log.front() == "stream_in");
    CHECK(log[9] == "qkv1 rot0");
    CHECK(log.back() == "stream_out");

    RecordingSteps missing;
    missing.embedding = false;
    ForwardBatch no_in;
    no_in.tokens = kTokens;
    CHECK_THROWS_AS(run(c, missing, no_in), UsageError);
}

TEST_CASE("gemma4: per-layer inputs once after the embedding, each layer's block and output scale after its FFN, "
          "the shared layers on an earlier layer's KV, their own rotated dims") {
    ModelConfig c = config(4);
    c.arch = Arch::gemma4;
    c.qk_norm = c.post_norms = c.v_norm = true;
    c.per_layer_dim = 8;
    c.layers[0].n_rot = 4;   // a local layer of another head size
    c.layers[2].kv_source = 0;
    c.layers[3].kv_source = 1;
    RecordingSteps s;
    ForwardBatch b;
    b.tokens = kTokens;
    const std::vector<std::string> log = run(c, s, b);
    CHECK(log[0] == "embed*1.000000");
    CHECK(log[1] == "per_layer_inputs");
    CHECK(log[3] == "qkv0+head_norm+v_norm rot4");
    CHECK(log[9] == "per_layer0");
    CHECK(log[10] == "out_scale0");
    CHECK(log[12] == "qkv1+head_norm+v_norm rot8");
    CHECK(log[21] == "qkv2+head_norm+v_norm rot8 kv_of0");
    CHECK(log[30] == "qkv3+head_norm+v_norm rot8 kv_of1");
    CHECK(log[log.size() - 3] == "out_scale3");

    // A later slice of a split model: without the embedding there are no per-layer inputs, and a shared layer must
    // find its KV in its own slice; both are refused in one line.
    CHECK_THROWS_WITH_AS(decoder_program(c, 2), doctest::Contains("per-layer token embeddings"), UsageError);
    c.per_layer_dim = 0;
    ModelConfig back = c;
    back.layers.erase(back.layers.begin(), back.layers.begin() + 2);
    back.n_layers = 2;
    CHECK_THROWS_WITH_AS(decoder_program(back, 2), doctest::Contains("on another device"), UsageError);
}

TEST_CASE("the observer sees every projection group by the model's layer numbers, lm_head as layer -1") {
    RecordingSteps s;
    CountingObserver o;
    ForwardBatch b;
    b.tokens = kTokens;
    run(config(2), s, b, &o, 5);
    const std::vector<std::pair<int32_t, ProjectionInput>> want = {
        {5, ProjectionInput::attn_qkv}, {5, ProjectionInput::attn_output}, {5, ProjectionInput::ffn_gate_up},
        {5, ProjectionInput::ffn_down}, {6, ProjectionInput::attn_qkv},    {6, ProjectionInput::attn_output},
        {6, ProjectionInput::ffn_gate_up}, {6, ProjectionInput::ffn_down}, {-1, ProjectionInput::lm_head}};
    CHECK(o.seen == want);
}

TEST_CASE("kept rows: the last or every token of a plain batch; per span, in span order") {
    ForwardBatch b;
    const int32_t tokens[7] = {};
    b.tokens = tokens;
    CHECK(kept_rows(b).size() == 1);
    CHECK(kept_rows(b)[0].first == 6);
    CHECK(kept_rows(b)[0].count == 1);
    const SequenceSpan spans[3] = {{0, 2, LogitsWanted::last}, {3, 4, LogitsWanted::all}, {1, 1, LogitsWanted::last}};
    b.spans = spans;
    const std::vector<RowRun> runs = kept_rows(b);
    REQUIRE(runs.size() == 3);
    CHECK((runs[0].first == 1 && runs[0].count == 1));
    CHECK((runs[1].first == 2 && runs[1].count == 4));
    CHECK((runs[2].first == 6 && runs[2].count == 1));
}

TEST_CASE("the tensor-role table: one row per LayerWeights member, names unique, needs follow the config") {
    std::set<std::string> names;
    std::set<size_t> members;   // each member's offset in LayerWeights
    const LayerWeights probe;
    for (const LayerTensor& t : layer_tensors()) {
        CAPTURE(t.name);
        CHECK(&layer_tensor(t.role) == &t);
        CHECK(names.insert(t.name).second);
        CHECK(members.insert(static_cast<size_t>(reinterpret_cast<const char*>(&(probe.*t.member)) -
                                                 reinterpret_cast<const char*>(&probe)))
                  .second);
    }
    CHECK(sizeof(LayerWeights) == members.size() * sizeof(WeightRef));   // no member left out of the table

    ModelConfig c = config(1);
    CHECK(layer_tensor(LayerRole::attn_norm).need(c, c.layers[0]) == TensorNeed::required);
    CHECK(layer_tensor(LayerRole::q_norm).need(c, c.layers[0]) == TensorNeed::absent);
    CHECK(layer_tensor(LayerRole::bq).need(c, c.layers[0]) == TensorNeed::optional);
    CHECK(layer_tensor(LayerRole::gate_exps).need(c, c.layers[0]) == TensorNeed::absent);
    c.pre_norms = false;
    c.qk_norm = c.qk_norm_whole = c.qkv_bias = true;
    CHECK(layer_tensor(LayerRole::attn_norm).need(c, c.layers[0]) == TensorNeed::absent);
    CHECK(layer_tensor(LayerRole::bq).need(c, c.layers[0]) == TensorNeed::required);
    CHECK(layer_tensor(LayerRole::q_norm).shape(c, c.layers[0]).n_in == 4 * 8);   // every head's width
    c.ffn_norm_post_attention = true;
    CHECK(layer_tensor_name(layer_tensor(LayerRole::ffn_norm), c, 3) == "blk.3.post_attention_norm.weight");

    // Per layer: a leading dense layer, a layer of experts with shared experts and a selection bias, a
    // next-token-prediction layer.
    c.n_expert = 4;
    c.n_expert_used = 2;
    c.expert_ffn_dim = 8;
    c.n_expert_shared = 1;
    c.expert_shared_ffn_dim = 8;
    c.expert_probs_bias = true;
    LayerConfig dense = c.layers[0], experts = dense, nextn = dense;
    experts.moe = nextn.moe = nextn.nextn = true;
    for (LayerRole r : {LayerRole::w_gate, LayerRole::w_up, LayerRole::w_down}) {
        CHECK(layer_tensor(r).need(c, dense) == TensorNeed::required);
        CHECK(layer_tensor(r).need(c, experts) == TensorNeed::absent);
    }
    for (LayerRole r : {LayerRole::gate_exps, LayerRole::exp_probs_b, LayerRole::gate_shexp, LayerRole::down_shexp}) {
        CHECK(layer_tensor(r).need(c, dense) == TensorNeed::absent);
        CHECK(layer_tensor(r).need(c, experts) == TensorNeed::required);
    }
    CHECK(layer_tensor(LayerRole::down_shexp).shape(c, experts).n_in == 8);
    CHECK(layer_tensor(LayerRole::nextn_eh_proj).need(c, experts) == TensorNeed::absent);
    CHECK(layer_tensor(LayerRole::nextn_eh_proj).need(c, nextn) == TensorNeed::required);
    CHECK(layer_tensor(LayerRole::nextn_embed_tokens).need(c, nextn) == TensorNeed::optional);
    c.n_expert_shared = 0;
    CHECK(layer_tensor(LayerRole::up_shexp).need(c, experts) == TensorNeed::absent);
}

TEST_CASE("a layer of experts with shared experts runs them as a gated FFN before the routed ones") {
    ModelConfig c = config(2);
    c.n_expert = 4;
    c.n_expert_used = 2;
    c.expert_ffn_dim = 8;
    c.n_expert_shared = 1;
    c.expert_shared_ffn_dim = 8;
    c.layers[1].moe = true;   // layer 0 stays dense (leading_dense_block_count 1)
    RecordingSteps s;
    ForwardBatch b;
    b.tokens = kTokens;
    run(c, s, b);
    const std::vector<std::string>& log = s.log;
    const auto at = [&](const std::string& e) { return std::find(log.begin(), log.end(), e) - log.begin(); };
    CHECK(at("gate_up0") < at("down0"));
    CHECK(at("experts0") == static_cast<long>(log.size()));
    CHECK(at("input1:ffn_norm.weight>ffn_gate_inp.weight") < at("gate_up1+shexp"));
    CHECK(at("gate_up1+shexp") < at("down1+shexp"));
    CHECK(at("down1+shexp") < at("experts1"));
    CHECK(at("gate_up1") == static_cast<long>(log.size()));
}

} // namespace
} // namespace tern
