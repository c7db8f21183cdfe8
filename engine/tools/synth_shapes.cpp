#include "engine/tools/synth_shapes.h"

namespace tern {

namespace {

// Values from the models' published configs (config.json); head_dim is explicit where it is not
// dim / n_heads (qwen3, gemma3). The "tiny" shapes are no real models: small shapes whose widths are
// all multiples of 256 (every k-quant applies without a width fallback), one per architecture, for
// tests (tiny-qwen3moe: 8 experts of width 256, 2 used); tiny-gemma3 has 6 layers so that it holds a global layer after its 5 sliding-window ones;
// tiny-gemma2 alternates local and global layers, 4 of them.
SynthShape make(std::string_view name, std::string_view arch, std::string_view model, int32_t dim, int32_t n_layers,
                int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t ffn_dim, int32_t vocab,
                int32_t n_ctx_train, float rope_base, float rms_eps) {
    SynthShape s;
    s.name = name;
    s.arch = arch;
    s.model = model;
    s.dim = dim;
    s.n_layers = n_layers;
    s.n_heads = n_heads;
    s.n_kv_heads = n_kv_heads;
    s.head_dim = head_dim;
    s.ffn_dim = ffn_dim;
    s.vocab = vocab;
    s.n_ctx_train = n_ctx_train;
    s.rope_base = rope_base;
    s.rms_eps = rms_eps;
    return s;
}

SynthShape tied(SynthShape s) {
    s.tied_output = true;
    return s;
}

SynthShape qwen2(SynthShape s) {
    s.qkv_bias = true;
    return s;
}

SynthShape qwen3(SynthShape s) {
    s.qk_norm = true;
    return s;
}

// Qwen3 MoE: qwen3's attention, n_expert routed experts of width expert_ffn_dim, n_used per token.
SynthShape qwen3moe(SynthShape s, int32_t n_expert, int32_t n_used, int32_t expert_ffn_dim) {
    s.qk_norm = true;
    s.n_expert = n_expert;
    s.n_expert_used = n_used;
    s.expert_ffn_dim = expert_ffn_dim;
    return s;
}

// Gemma 2: post norms, tied embeddings, a sliding window on every other layer (the even ones), and the logit
// softcaps its files carry (synth.cpp writes them).
SynthShape gemma2(SynthShape s, int32_t window) {
    s.tied_output = true;
    s.post_norms = true;
    s.sliding_window = window;
    return s;
}

// Gemma 3: q/k norms, post norms, tied embeddings, 512-token windows on 5 of every 6 layers.
SynthShape gemma3(SynthShape s) {
    s.tied_output = true;
    s.qk_norm = true;
    s.post_norms = true;
    s.sliding_window = 512;
    return s;
}

// Gemma 4: gemma3's layers with a global layer every `period` (V its K's projection, no attn_v), the local ones of
// head size head_dim_swa and rope base 10000, per-layer token embeddings of width per_layer_dim (0: none), the last
// `shared` layers on earlier KV.
SynthShape gemma4(SynthShape s, int32_t window, int32_t period, int32_t head_dim_swa, int32_t per_layer_dim,
                  int32_t shared) {
    s = gemma3(s);
    s.sliding_window = window;
    s.swa_period = period;
    s.head_dim_swa = head_dim_swa;
    s.per_layer_dim = per_layer_dim;
    s.shared_kv_layers = shared;
    s.rope_base_swa = 10000.0f;
    s.global_k_eq_v = true;
    return s;
}

// Every layer with its attn_v (Gemma 4 E2B/E4B).
SynthShape with_v(SynthShape s) {
    s.global_k_eq_v = false;
    return s;
}

// gpt-oss: n_expert experts of width expert_ffn_dim, n_used per token, a window on every even layer.
SynthShape gpt_oss(SynthShape s, int32_t n_expert, int32_t n_used, int32_t expert_ffn_dim, int32_t window) {
    s.gpt_oss = true;
    s.n_expert = n_expert;
    s.n_expert_used = n_used;
    s.expert_ffn_dim = expert_ffn_dim;
    s.sliding_window = window;
    return s;
}

// Mixtral: a llama whose every FFN is n_expert routed experts of the dense width (llama.cpp sizes them by
// feed_forward_length), n_used per token.
SynthShape mixtral(SynthShape s, int32_t n_expert, int32_t n_used) {
    s.n_expert = n_expert;
    s.n_expert_used = n_used;
    s.expert_ffn_dim = s.ffn_dim;
    return s;
}

// Phi-3 / Phi-4 (synth.cpp writes phi3's fused attn_qkv and gate/up tensors): n_rot rotated dims per head, 0 for
// all of them.
SynthShape phi3(SynthShape s, int32_t n_rot) {
    s.n_rot = n_rot;
    return s;
}

// YaRN rope scaling by `factor` over an original context of n_ctx_orig tokens (Qwen3's published long-context
// setting: factor 4 over 32768).
SynthShape yarn(SynthShape s, float factor, int32_t n_ctx_orig) {
    s.yarn_factor = factor;
    s.yarn_n_ctx_orig = n_ctx_orig;
    return s;
}

// LongRoPE as Phi-3's converted files carry it: long and short factor tensors, the original context, and the
// attention factor sqrt(1 + ln(n_ctx_train / n_ctx_orig) / ln(n_ctx_orig)) (synth.cpp writes them).
SynthShape longrope(SynthShape s, int32_t n_ctx_orig) {
    s.longrope_n_ctx_orig = n_ctx_orig;
    return s;
}

// Ministral 3 (mistral3): llama's layers, tied embeddings, YaRN with its betas and yarn_log_multiplier 1
// (mscale_all_dim), and the Llama 4 attention temperature beta 0.1 over the original context.
SynthShape mistral3(SynthShape s, float factor, int32_t n_ctx_orig) {
    s = tied(yarn(s, factor, n_ctx_orig));
    s.yarn_beta_fast = 32.0f;
    s.yarn_beta_slow = 1.0f;
    s.yarn_log_mul = 1.0f;
    s.attn_temp_scale = 0.1f;
    return s;
}

// Granite 3.x: llama's layers with its four multipliers (the embedding's, the residual branches', q.k's and the
// logits' divisor), as its configs give them (embedding_multiplier 12, residual_multiplier 0.22,
// attention_multiplier 0.0078125, logits_scaling 8).
SynthShape granite(SynthShape s) {
    s.embedding_scale = 12.0f;
    s.residual_scale = 0.22f;
    s.attention_scale = 0.0078125f;
    s.logit_scale = 8.0f;
    return s;
}

// OLMo 2: no pre-norms, each block's output normed before its residual add (post norms), q and k normed over
// their whole width.
SynthShape olmo2(SynthShape s) {
    s.pre_norms = false;
    s.post_norms = true;
    s.qk_norm = true;
    s.qk_norm_whole = true;
    return s;
}

// GLM-4.5 (glm4moe): q/k/v biases, half of each head rotated, one leading dense layer, n_expert routed experts of
// width expert_ffn_dim (n_used per token, sigmoid plus a selection bias, weights normalised and times `scale`), one
// shared expert, and one next-token-prediction layer after the decoder's (n_layers counts it, as block_count does).
SynthShape glm4moe(SynthShape s, int32_t n_expert, int32_t n_used, int32_t expert_ffn_dim, float scale) {
    s.qkv_bias = true;
    s.n_rot = s.head_dim / 2;
    s.n_expert = n_expert;
    s.n_expert_used = n_used;
    s.expert_ffn_dim = expert_ffn_dim;
    s.n_dense_lead = 1;
    s.n_expert_shared = 1;
    s.expert_weights_scale = scale;
    s.n_nextn = 1;
    return s;
}

const SynthShape kShapes[] = {
    tied(make("tiny", "llama", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048, 10000.0f, 1e-5f)),
    qwen2(make("tiny-qwen2", "qwen2", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048, 1000000.0f, 1e-6f)),
    tied(qwen3(make("tiny-qwen3", "qwen3", "tern tiny test model", 256, 2, 4, 2, 128, 768, 512, 2048, 1000000.0f,
                    1e-6f))),
    // tiny-qwen3 with YaRN: factor 4 over a 512-token original context puts the ramp on pairs 4..21 of 64.
    yarn(tied(qwen3(make("tiny-qwen3-yarn", "qwen3", "tern tiny test model", 256, 2, 4, 2, 128, 768, 512, 2048,
                         1000000.0f, 1e-6f))),
         4.0f, 512),
    // A llama with LongRoPE over a 64-token original context: any run context (512 in the comparisons) takes the
    // long factors.
    longrope(make("tiny-longrope", "llama", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048, 10000.0f, 1e-5f),
             64),
    // A 32-token original context: the comparisons' 32 greedy tokens cross it, so q's temperature changes there.
    mistral3(make("tiny-mistral3", "mistral3", "tern tiny test model", 256, 2, 4, 2, 128, 768, 512, 2048, 1000000.0f,
                  1e-5f),
             16.0f, 32),
    qwen3moe(make("tiny-qwen3moe", "qwen3moe", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048, 1000000.0f,
                  1e-6f),
             8, 2, 256),
    gemma3(make("tiny-gemma3", "gemma3", "tern tiny test model", 256, 6, 4, 1, 128, 768, 512, 2048, 1000000.0f,
                1e-6f)),
    // 8 layers, every 4th global (head size 128, no attn_v: V is K's projection; the local ones 64), the last 4 on
    // the KV of layers 2 (local) and 3 (global), per-layer embeddings of width 64, a 16-token window that a 32-token
    // test run leaves.
    gemma4(make("tiny-gemma4", "gemma4", "tern tiny test model", 256, 8, 4, 2, 128, 768, 512, 2048, 1000000.0f, 1e-6f),
           16, 4, 64, 64, 4),
    // A 16-token window, so that a 32-token test run leaves it on the local layers.
    gemma2(make("tiny-gemma2", "gemma2", "tern tiny test model", 256, 4, 4, 2, 64, 768, 512, 2048, 10000.0f, 1e-6f),
           16),
    // 8 experts of width 256, 4 used; a 16-token window on layers 0 and 2, so a 32-token test run leaves it.
    // YaRN as in gpt-oss (factor 32), over a 64-token original context so that the 2048 trained ones are 32 times it.
    yarn(gpt_oss(make("tiny-gpt-oss", "gpt-oss", "tern tiny test model", 256, 4, 4, 2, 64, 256, 512, 2048, 150000.0f,
                      1e-5f),
                 8, 4, 256, 16),
         32.0f, 64),
    tied(make("llama-1b", "llama", "Llama 3.2 1B", 2048, 16, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f)),
    tied(make("llama-3b", "llama", "Llama 3.2 3B", 3072, 28, 24, 8, 128, 8192, 128256, 131072, 500000.0f, 1e-5f)),
    make("llama-8b", "llama", "Llama 3.1 8B", 4096, 32, 32, 8, 128, 14336, 128256, 131072, 500000.0f, 1e-5f),
    qwen2(make("qwen2-7b", "qwen2", "Qwen2.5 7B", 3584, 28, 28, 4, 128, 18944, 152064, 32768, 1000000.0f, 1e-6f)),
    tied(qwen3(make("qwen3-0.6b", "qwen3", "Qwen3 0.6B", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f,
                    1e-6f))),
    gemma3(make("gemma3-270m", "gemma3", "Gemma 3 270M", 640, 18, 4, 1, 256, 2048, 262144, 32768, 1000000.0f,
                1e-6f)),
    gemma3(make("gemma3-1b", "gemma3", "Gemma 3 1B", 1152, 26, 4, 1, 256, 6912, 262144, 32768, 1000000.0f, 1e-6f)),
    // Gemma 4 E4B as llama.cpp reads it (42 layers): 5 local : 1 global, heads of 256 and 512, per-layer embeddings
    // of width 256, a 512-token window; the 18 layers on shared KV are Gemma 3n's proportion, not checked against
    // the released file (a benchmark shape: its byte counts matter, not its exact config).
    with_v(gemma4(make("gemma4-e4b", "gemma4", "Gemma 4 E4B", 2560, 42, 8, 2, 512, 10240, 262144, 131072, 1000000.0f,
                       1e-6f),
                  512, 6, 256, 256, 18)),
    gemma2(make("gemma2-2b", "gemma2", "Gemma 2 2B", 2304, 26, 8, 4, 256, 9216, 256000, 8192, 10000.0f, 1e-6f), 4096),
    mistral3(make("ministral3-3b", "mistral3", "Ministral 3 3B", 3072, 26, 32, 8, 128, 9216, 131072, 262144, 1000000.0f,
                  1e-5f),
             16.0f, 16384),
    // Every layer's FFN is 128 experts of width 768, 8 used: 30.5B parameters, 3.3B active per token.
    qwen3moe(make("qwen3moe-30b-a3b", "qwen3moe", "Qwen3 30B-A3B", 2048, 48, 32, 4, 128, 6144, 151936, 40960,
                  1000000.0f, 1e-6f),
             128, 8, 768),
    // 32 experts of width 2880, 4 used: 20.9B parameters, 3.6B active per token. 2880 is no multiple of 256, so
    // the k-quant types fall back to 32-blocks on the 2880-wide inputs (as llama-quantize does).
    yarn(gpt_oss(make("gpt-oss-20b", "gpt-oss", "gpt-oss 20B", 2880, 24, 64, 8, 64, 2880, 201088, 131072, 150000.0f,
                      1e-5f),
                 32, 4, 2880, 128),
         32.0f, 4096),
    mixtral(make("tiny-mixtral", "llama", "tern tiny test model", 256, 2, 4, 2, 64, 256, 512, 2048, 1000000.0f, 1e-5f),
            8, 2),
    // 8 experts of width 14336, 2 used: 46.7B parameters, 12.9B active per token.
    mixtral(make("mixtral-8x7b", "llama", "Mixtral 8x7B", 4096, 32, 32, 8, 128, 14336, 32000, 32768, 1000000.0f,
                 1e-5f),
            8, 2),
    // Every 4th layer without RoPE: 4 layers hold one.
    tied(make("tiny-smollm3", "smollm3", "tern tiny test model", 256, 4, 4, 2, 64, 768, 512, 2048, 5000000.0f, 1e-6f)),
    tied(make("smollm3-3b", "smollm3", "SmolLM3 3B", 2048, 36, 16, 4, 128, 11008, 128256, 65536, 5000000.0f, 1e-6f)),
    // Phi-4-mini's traits without its LongRoPE: tied, GQA, 3/4 of each head rotated.
    tied(phi3(make("tiny-phi3", "phi3", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048, 10000.0f, 1e-5f),
              48)),
    // tiny-phi3 with LongRoPE over a 64-token original context, as Phi-4-mini's files carry it (no scaling type key,
    // a factor per rotated pair: 24 here): a 512-token run takes the long factors.
    longrope(tied(phi3(make("tiny-phi3-longrope", "phi3", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048,
                            10000.0f, 1e-5f),
                       48)),
             64),
    phi3(make("phi3-mini", "phi3", "Phi-3 mini 4k", 3072, 32, 32, 32, 96, 8192, 32064, 4096, 10000.0f, 1e-5f), 0),
    // Phi-4-mini: 3/4 of each 128-wide head rotated, LongRoPE from 4096 to 131072 positions, tied.
    longrope(tied(phi3(make("phi4-mini", "phi3", "Phi-4 mini", 3072, 32, 24, 8, 128, 8192, 200064, 131072, 10000.0f,
                            1e-5f),
                       96)),
             4096),
    phi3(make("phi4", "phi3", "Phi-4 14B", 5120, 40, 40, 10, 128, 17920, 100352, 16384, 250000.0f, 1e-5f), 0),
    // Untied (Granite 3.x ties its embedding; an untied lm_head keeps the random model's greedy text from repeating
    // the token just read, which the embedding multiplier would otherwise make win).
    granite(make("tiny-granite", "granite", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048, 10000000.0f,
                 1e-5f)),
    // GQA, so that k's norm is narrower than q's.
    olmo2(make("tiny-olmo2", "olmo2", "tern tiny test model", 256, 2, 4, 2, 64, 768, 512, 2048, 500000.0f, 1e-6f)),
    // 3 decoder layers (a dense one, then 2 of 8 experts of width 256, 2 used, and a shared one) and a
    // next-token-prediction layer; GLM-4.5's routed scale 2.5.
    glm4moe(make("tiny-glm4moe", "glm4moe", "tern tiny test model", 256, 4, 4, 2, 64, 768, 512, 2048, 1000000.0f,
                 1e-5f),
            8, 2, 256, 2.5f),
    // GLM-4.5-Air: 46 layers (the first dense, width 10944) of 128 experts of width 1408, 8 used, and a shared one,
    // plus its next-token-prediction layer: 109B parameters (1.2B of them in the embedding), 12.8B active per token.
    glm4moe(make("glm45-air", "glm4moe", "GLM-4.5-Air", 4096, 47, 96, 8, 128, 10944, 151552, 131072, 1000000.0f,
                 1e-5f),
            128, 8, 1408, 1.0f),
};

} // namespace

std::span<const SynthShape> synth_shapes() { return kShapes; }

const SynthShape* find_synth_shape(std::string_view name) {
    for (const SynthShape& s : kShapes)
        if (s.name == name) return &s;
    return nullptr;
}

} // namespace tern
