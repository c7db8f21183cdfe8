#include "engine/tools/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>
#include <string_view>
#include <utility>

#include "engine/tools/synth_shapes.h"
#include "engine/tools/synth_vocab.h"
#include "base/error.h"
#include "formats/gguf_writer.h"
#include "kernels/cpu_features.h"
#include "quant/plan.h"
#include "quant/reference.h"

namespace tern {

namespace {

// What a tensor holds decides its random distribution.
enum class Role {
    matrix,   // N(0, 1/n_in) (Irwin-Hall approximation): unit-variance outputs for unit-RMS inputs
    norm,     // 1 + N(0, 0.1^2): RMSNorm gains near 1, as in trained models (gemma's stored 1 + w too)
    bias,     // N(0, 0.1^2)
};

struct SynthTensor {
    std::string name;
    int64_t ne0 = 1, ne1 = 1;   // ne1 == 1: a vector
    Role role = Role::matrix;
    float gain = 1.0f;          // multiplies the values (the tied embedding and its output norm)
    int64_t ne2 = 1;            // a stack of ne2 matrices (the expert tensors)
};

// A tied embedding is also the lm_head, and with random weights (no training to cancel it) the
// token just read tends to win the argmax again: greedy text of a tied model repeats one token.
// Shrinking the embedding shrinks its share of the residual stream; the output norm's gains grow by
// the inverse, so the logits keep their scale (the first layer's input is normalized, unchanged).
// Gemma multiplies the embedding by sqrt(dim) in the forward, so it needs a smaller factor. Measured
// on the tiny tied shapes with a 32000-token vocabulary, greedy, 40 tokens, seeds 1-3 (equal
// consecutive tokens out of 39): llama 20 -> 11, qwen3 28 -> 2 at 0.1; gemma3 39 -> 3 at 0.03.
float tied_embedding_gain(const SynthShape& s) {
    if (!s.tied_output) return 1.0f;
    return s.arch == "gemma3" || s.arch == "gemma2" || s.arch == "gemma4" ? 0.03f : 0.1f;
}

// gemma4: a layer is local unless it is the last of its period.
bool gemma4_local(const SynthShape& s, int32_t l) {
    return s.swa_period > 0 && (l + 1) % s.swa_period != 0;
}

std::vector<SynthTensor> tensor_list(const SynthShape& s, int64_t vocab) {
    const float embd_gain = tied_embedding_gain(s);
    // A model that multiplies its embedding (granite) gets one as much smaller, as trained ones have; one that
    // divides its logits (granite's logit_scale) an output norm as much larger, so that its logits keep the scale
    // of the other families' (their top-2 margins well above the comparisons' noise).
    const float embd_scale = s.embedding_scale > 0.0f ? s.embedding_scale : 1.0f;
    const float logit_scale = s.logit_scale > 0.0f ? s.logit_scale : 1.0f;
    std::vector<SynthTensor> t = {{"token_embd.weight", s.dim, vocab, Role::matrix, embd_gain / embd_scale},
                                  {"output_norm.weight", s.dim, 1, Role::norm, logit_scale / embd_gain}};
    if (!s.tied_output) t.push_back({"output.weight", s.dim, vocab, Role::matrix});
    if (s.longrope_n_ctx_orig > 0) {   // positive factors: long ones around 4, short ones around 1
        const int64_t half = (s.n_rot > 0 ? s.n_rot : s.head_dim) / 2;   // a factor per rotated pair
        t.push_back({"rope_factors_long.weight", half, 1, Role::norm, 4.0f});
        t.push_back({"rope_factors_short.weight", half, 1, Role::norm, 1.0f});
    }
    if (s.swa_period > 0)   // gemma4's proportional rope of the global layers: factors near 1
        t.push_back({"rope_freqs.weight", s.head_dim / 2, 1, Role::norm});
    if (s.per_layer_dim > 0) {
        const int64_t width = int64_t{s.per_layer_dim} * s.n_layers;
        t.push_back({"per_layer_token_embd.weight", width, vocab, Role::matrix});
        t.push_back({"per_layer_model_proj.weight", s.dim, width, Role::matrix});
        t.push_back({"per_layer_proj_norm.weight", s.per_layer_dim, 1, Role::norm});
    }
    for (int32_t l = 0; l < s.n_layers; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        const int64_t head_dim = gemma4_local(s, l) ? s.head_dim_swa : s.head_dim;
        const int64_t q_dim = int64_t{s.n_heads} * head_dim, kv_dim = int64_t{s.n_kv_heads} * head_dim;
        if (s.pre_norms) t.push_back({p + "attn_norm.weight", s.dim, 1, Role::norm});
        if (s.arch == "phi3") {   // phi3 files fuse q, k and v into one tensor, their rows in that order
            t.push_back({p + "attn_qkv.weight", s.dim, q_dim + 2 * kv_dim, Role::matrix});
        } else {
            t.push_back({p + "attn_q.weight", s.dim, q_dim, Role::matrix});
            t.push_back({p + "attn_k.weight", s.dim, kv_dim, Role::matrix});
            if (!(s.global_k_eq_v && !gemma4_local(s, l))) t.push_back({p + "attn_v.weight", s.dim, kv_dim, Role::matrix});
        }
        if (s.qkv_bias || s.gpt_oss) {
            t.push_back({p + "attn_q.bias", q_dim, 1, Role::bias});
            t.push_back({p + "attn_k.bias", kv_dim, 1, Role::bias});
            t.push_back({p + "attn_v.bias", kv_dim, 1, Role::bias});
        }
        if (s.qk_norm) {
            t.push_back({p + "attn_q_norm.weight", s.qk_norm_whole ? q_dim : head_dim, 1, Role::norm});
            t.push_back({p + "attn_k_norm.weight", s.qk_norm_whole ? kv_dim : head_dim, 1, Role::norm});
        }
        t.push_back({p + "attn_output.weight", q_dim, s.dim, Role::matrix});
        if (s.gpt_oss) {
            t.push_back({p + "attn_output.bias", s.dim, 1, Role::bias});
            // Sinks near the scores' scale (a few units), so that they take a real share of each softmax.
            t.push_back({p + "attn_sinks.weight", s.n_heads, 1, Role::bias, 10.0f});
        }
        // gpt-oss and glm4moe keep the FFN's input norm as post_attention_norm.
        const bool glm = s.arch == "glm4moe";
        if (s.post_norms || s.gpt_oss || glm) t.push_back({p + "post_attention_norm.weight", s.dim, 1, Role::norm});
        if (!s.gpt_oss && !glm && s.pre_norms) t.push_back({p + "ffn_norm.weight", s.dim, 1, Role::norm});
        if (s.n_expert > 0 && l >= s.n_dense_lead) {
            t.push_back({p + "ffn_gate_inp.weight", s.dim, s.n_expert, Role::matrix});
            // A selection bias of the probabilities' own scale (sigmoids in 0..1), so it changes some choices.
            if (glm) t.push_back({p + "exp_probs_b.bias", s.n_expert, 1, Role::bias});
            t.push_back({p + "ffn_gate_exps.weight", s.dim, s.expert_ffn_dim, Role::matrix, 1.0f, s.n_expert});
            t.push_back({p + "ffn_up_exps.weight", s.dim, s.expert_ffn_dim, Role::matrix, 1.0f, s.n_expert});
            t.push_back({p + "ffn_down_exps.weight", s.expert_ffn_dim, s.dim, Role::matrix, 1.0f, s.n_expert});
            if (s.gpt_oss) {
                t.push_back({p + "ffn_gate_inp.bias", s.n_expert, 1, Role::bias});
                t.push_back({p + "ffn_gate_exps.bias", s.expert_ffn_dim, s.n_expert, Role::bias});
                t.push_back({p + "ffn_up_exps.bias", s.expert_ffn_dim, s.n_expert, Role::bias});
                t.push_back({p + "ffn_down_exps.bias", s.dim, s.n_expert, Role::bias});
            }
            if (s.n_expert_shared > 0) {
                const int64_t shared = int64_t{s.expert_ffn_dim} * s.n_expert_shared;
                t.push_back({p + "ffn_gate_shexp.weight", s.dim, shared, Role::matrix});
                t.push_back({p + "ffn_up_shexp.weight", s.dim, shared, Role::matrix});
                t.push_back({p + "ffn_down_shexp.weight", shared, s.dim, Role::matrix});
            }
        } else if (s.arch == "phi3") {   // and the gate's rows, then the up projection's, into ffn_up
            t.push_back({p + "ffn_up.weight", s.dim, 2 * int64_t{s.ffn_dim}, Role::matrix});
            t.push_back({p + "ffn_down.weight", s.ffn_dim, s.dim, Role::matrix});
        } else {
            t.push_back({p + "ffn_gate.weight", s.dim, s.ffn_dim, Role::matrix});
            t.push_back({p + "ffn_up.weight", s.dim, s.ffn_dim, Role::matrix});
            t.push_back({p + "ffn_down.weight", s.ffn_dim, s.dim, Role::matrix});
        }
        if (s.post_norms) t.push_back({p + "post_ffw_norm.weight", s.dim, 1, Role::norm});
        if (l >= s.n_layers - s.n_nextn) {   // a next-token-prediction layer's own tensors (GLM's converter's)
            t.push_back({p + "nextn.eh_proj.weight", 2 * int64_t{s.dim}, s.dim, Role::matrix});
            t.push_back({p + "nextn.enorm.weight", s.dim, 1, Role::norm});
            t.push_back({p + "nextn.hnorm.weight", s.dim, 1, Role::norm});
            t.push_back({p + "nextn.shared_head_norm.weight", s.dim, 1, Role::norm});
        }
        if (s.per_layer_dim > 0) {
            t.push_back({p + "inp_gate.weight", s.dim, s.per_layer_dim, Role::matrix});
            t.push_back({p + "proj.weight", s.per_layer_dim, s.dim, Role::matrix});
            t.push_back({p + "post_norm.weight", s.dim, 1, Role::norm});
        }
        if (s.swa_period > 0) t.push_back({p + "layer_output_scale.weight", 1, 1, Role::norm});
    }
    return t;
}

// The "<arch>.*" keys llama.cpp reads for these architectures (as in the converted real models).
std::vector<GgufKv> arch_keys(const SynthShape& s, int64_t vocab) {
    const std::string a = std::string(s.arch) + ".";
    std::vector<GgufKv> kv = {
        {a + "context_length", GgufValue::make_u32(static_cast<uint32_t>(s.n_ctx_train))},
        {a + "embedding_length", GgufValue::make_u32(static_cast<uint32_t>(s.dim))},
        {a + "block_count", GgufValue::make_u32(static_cast<uint32_t>(s.n_layers))},
        {a + "feed_forward_length", GgufValue::make_u32(static_cast<uint32_t>(s.ffn_dim))},
        {a + "attention.head_count", GgufValue::make_u32(static_cast<uint32_t>(s.n_heads))},
        {a + "attention.head_count_kv", GgufValue::make_u32(static_cast<uint32_t>(s.n_kv_heads))},
        {a + "attention.key_length", GgufValue::make_u32(static_cast<uint32_t>(s.head_dim))},
        {a + "attention.value_length", GgufValue::make_u32(static_cast<uint32_t>(s.head_dim))},
        {a + "attention.layer_norm_rms_epsilon", GgufValue::make_f32(s.rms_eps)},
        {a + "rope.freq_base", GgufValue::make_f32(s.rope_base)},
    };
    if (s.arch == "llama" || s.arch == "mistral3" || s.arch == "granite") {
        kv.push_back({a + "rope.dimension_count", GgufValue::make_u32(static_cast<uint32_t>(s.head_dim))});
        kv.push_back({a + "vocab_size", GgufValue::make_u32(static_cast<uint32_t>(vocab))});
    }
    if (s.n_rot > 0)
        kv.push_back({a + "rope.dimension_count", GgufValue::make_u32(static_cast<uint32_t>(s.n_rot))});
    if (s.n_expert > 0) {
        kv.push_back({a + "expert_count", GgufValue::make_u32(static_cast<uint32_t>(s.n_expert))});
        kv.push_back({a + "expert_used_count", GgufValue::make_u32(static_cast<uint32_t>(s.n_expert_used))});
        kv.push_back({a + "expert_feed_forward_length", GgufValue::make_u32(static_cast<uint32_t>(s.expert_ffn_dim))});
    }
    if (s.arch == "glm4moe") {   // as GLM's converter writes them
        kv.push_back({a + "expert_shared_count", GgufValue::make_u32(static_cast<uint32_t>(s.n_expert_shared))});
        kv.push_back({a + "leading_dense_block_count", GgufValue::make_u32(static_cast<uint32_t>(s.n_dense_lead))});
        kv.push_back({a + "expert_gating_func", GgufValue::make_u32(2)});   // sigmoid
        kv.push_back({a + "expert_weights_scale", GgufValue::make_f32(s.expert_weights_scale)});
        kv.push_back({a + "expert_weights_norm", GgufValue::make_bool(true)});
        kv.push_back({a + "nextn_predict_layers", GgufValue::make_u32(static_cast<uint32_t>(s.n_nextn))});
    }
    if (s.sliding_window > 0)
        kv.push_back({a + "attention.sliding_window", GgufValue::make_u32(static_cast<uint32_t>(s.sliding_window))});
    if (s.yarn_factor > 0.0f) {   // as the converter writes a config.json's rope_scaling of type yarn
        kv.push_back({a + "rope.scaling.type", GgufValue::make_string("yarn")});
        kv.push_back({a + "rope.scaling.factor", GgufValue::make_f32(s.yarn_factor)});
        kv.push_back({a + "rope.scaling.original_context_length",
                      GgufValue::make_u32(static_cast<uint32_t>(s.yarn_n_ctx_orig))});
        if (s.yarn_beta_fast > 0.0f)
            kv.push_back({a + "rope.scaling.yarn_beta_fast", GgufValue::make_f32(s.yarn_beta_fast)});
        if (s.yarn_beta_slow > 0.0f)
            kv.push_back({a + "rope.scaling.yarn_beta_slow", GgufValue::make_f32(s.yarn_beta_slow)});
        if (s.yarn_log_mul > 0.0f)
            kv.push_back({a + "rope.scaling.yarn_log_multiplier", GgufValue::make_f32(s.yarn_log_mul)});
    }
    if (s.attn_temp_scale > 0.0f)
        kv.push_back({a + "attention.temperature_scale", GgufValue::make_f32(s.attn_temp_scale)});
    if (s.longrope_n_ctx_orig > 0) {   // as the converter writes Phi-3's long-context rope
        const double scale = static_cast<double>(s.n_ctx_train) / s.longrope_n_ctx_orig;
        const double attn_factor = std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(s.longrope_n_ctx_orig)));
        // phi3's own converter writes no scaling type (the factor tensors say it); other architectures need it.
        if (s.arch != "phi3") kv.push_back({a + "rope.scaling.type", GgufValue::make_string("longrope")});
        kv.push_back({a + "rope.scaling.original_context_length",
                      GgufValue::make_u32(static_cast<uint32_t>(s.longrope_n_ctx_orig))});
        kv.push_back({a + "rope.scaling.attn_factor", GgufValue::make_f32(static_cast<float>(attn_factor))});
    }
    const std::pair<const char*, float> multipliers[] = {{"embedding_scale", s.embedding_scale},
                                                         {"residual_scale", s.residual_scale},
                                                         {"attention.scale", s.attention_scale},
                                                         {"logit_scale", s.logit_scale}};
    for (const auto& [key, value] : multipliers)
        if (value > 0.0f) kv.push_back({a + key, GgufValue::make_f32(value)});
    if (s.swa_period > 0) {   // gemma4: the pattern, the local layers' heads and rope, shared KV, per-layer inputs
        std::vector<GgufValue> pattern;
        for (int32_t l = 0; l < s.n_layers; ++l) pattern.push_back(GgufValue::make_bool(gemma4_local(s, l)));
        kv.push_back({a + "attention.sliding_window_pattern", GgufValue::make_array(GgufType::boolean, pattern)});
        kv.push_back({a + "attention.key_length_swa", GgufValue::make_u32(static_cast<uint32_t>(s.head_dim_swa))});
        kv.push_back({a + "attention.value_length_swa", GgufValue::make_u32(static_cast<uint32_t>(s.head_dim_swa))});
        kv.push_back({a + "rope.dimension_count", GgufValue::make_u32(static_cast<uint32_t>(s.head_dim))});
        kv.push_back({a + "rope.dimension_count_swa", GgufValue::make_u32(static_cast<uint32_t>(s.head_dim_swa))});
        kv.push_back({a + "rope.freq_base_swa", GgufValue::make_f32(s.rope_base_swa)});
        kv.push_back({a + "attention.shared_kv_layers", GgufValue::make_u32(static_cast<uint32_t>(s.shared_kv_layers))});
        if (s.per_layer_dim > 0)
            kv.push_back({a + "embedding_length_per_layer_input",
                          GgufValue::make_u32(static_cast<uint32_t>(s.per_layer_dim))});
        kv.push_back({a + "final_logit_softcapping", GgufValue::make_f32(30.0f)});
    }
    if (s.arch == "gemma2") {   // Gemma 2's configs: tanh caps on the attention scores and the logits
        kv.push_back({a + "attn_logit_softcapping", GgufValue::make_f32(50.0f)});
        kv.push_back({a + "final_logit_softcapping", GgufValue::make_f32(30.0f)});
    }
    return kv;
}

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t fnv1a(std::string_view s) {
    uint64_t h = 0xCBF29CE484222325ull;
    for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
    return h;
}

// Random values from their own stream (seed, tensor name, index), so they can be made in any order
// on any thread. Each value is the sum of four 16-bit uniforms (Irwin-Hall), scaled to unit
// variance: close enough to normal, bounded by +-3.5 (no outliers to blow up a quantization scale),
// and about one 64-bit hash per value.
void random_values(const SynthTensor& t, uint64_t tensor_seed, int64_t index, float* out, int64_t n) {
    uint64_t state = tensor_seed ^ (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull);
    splitmix64(state);
    float scale = 0.1f * t.gain, offset = 0.0f;
    if (t.role == Role::matrix) scale = t.gain / std::sqrt(static_cast<float>(t.ne0));
    if (t.role == Role::norm) offset = t.gain;
    // sqrt(3) / 2^16 turns a sum of four U(0, 65536) (variance 4 * 2^32 / 12) into unit variance.
    const float k = scale * 1.7320508f / 65536.0f;
    for (int64_t i = 0; i < n; ++i) {
        const uint64_t r = splitmix64(state);
        const int32_t sum = static_cast<int32_t>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
        out[i] = offset + k * static_cast<float>(sum - 2 * 65536);
    }
}

// Why a pool: quantizing 1.2 billion values with the reference k-quant searches takes about a
// CPU-minute per Llama-1B file (measured: 27 CPU-s for q4_0, whose Q6_K embedding dominates), too slow
// for benchmarks that regenerate their files. So each tensor quantizes a pool of kPoolChunks random
// chunks (256 values, or 32 where the width is no multiple of 256; always whole blocks of any
// format) once, and every chunk of every row is a copy of a pool chunk picked at random. Each row
// is still distinct (8 picks of 256 for a 2048-wide row), every block is a genuine quantization of
// N(0, sigma^2) values, and writing becomes a memcpy per chunk. A tensor of at most kPoolChunks
// chunks (norms, biases, the tiny shapes' small matrices) is its pool: every chunk unique.
constexpr int64_t kPoolChunks = 512;

int64_t chunk_elems(int64_t width) {
    if (width % 256 == 0) return 256;
    if (width % 32 == 0) return 32;
    return width;   // only float formats get such widths (the plan's fallback)
}

// Fills `out` (the tensor in format `type`) from the tensor's quantized pool.
void fill_tensor(const SynthTensor& t, GgmlType type, uint64_t tensor_seed, std::span<uint8_t> out, int n_threads) {
    const int64_t chunk = chunk_elems(t.ne0), chunks_per_row = t.ne0 / chunk;
    const int64_t n_rows = t.ne1 * t.ne2;
    const int64_t n_chunks = chunks_per_row * n_rows, pool_chunks = std::min(n_chunks, kPoolChunks);
    const size_t chunk_bytes = row_bytes(type, chunk);
    std::vector<uint8_t> pool(static_cast<size_t>(pool_chunks) * chunk_bytes);
    std::string error;
    // Small tensors stay on one thread: waking the team costs more than the work.
    const bool parallel = pool_chunks * chunk >= (int64_t{1} << 16);
#pragma omp parallel num_threads(n_threads) if (parallel)
    {
        std::vector<float> buf(static_cast<size_t>(chunk));
#pragma omp for schedule(dynamic, 8)
        for (int64_t c = 0; c < pool_chunks; ++c) {
            try {
                random_values(t, tensor_seed, c, buf.data(), chunk);
                quantize_row(type, buf.data(), pool.data() + static_cast<size_t>(c) * chunk_bytes, chunk);
            } catch (const std::exception& e) {
#pragma omp critical(tern_synth_error)
                if (error.empty()) error = t.name + ": " + e.what();
            }
        }
    }
    if (!error.empty()) throw RuntimeFailure("synth: " + error);
    if (n_chunks == pool_chunks) {
        std::memcpy(out.data(), pool.data(), pool.size());
        return;
    }
#pragma omp parallel for num_threads(n_threads) schedule(static) if (n_chunks >= (int64_t{1} << 14))
    for (int64_t r = 0; r < n_rows; ++r) {
        uint64_t state = ~tensor_seed ^ (static_cast<uint64_t>(r) * 0xD1B54A32D192ED03ull);
        uint8_t* dst = out.data() + static_cast<size_t>(r * chunks_per_row) * chunk_bytes;
        for (int64_t c = 0; c < chunks_per_row; ++c)
            std::memcpy(dst + static_cast<size_t>(c) * chunk_bytes,
                        pool.data() + static_cast<size_t>(splitmix64(state) % pool_chunks) * chunk_bytes, chunk_bytes);
    }
}

// general.name. llama.cpp gives the special tokens of a model whose name holds "phi3" or "phi-3" (any case) its
// Phi-3 whitespace rules, and fails to load one whose vocabulary lacks Phi-3's "<|endoftext|>" (the built-in
// one does): so the phi shapes are named "phi 3".
std::string model_name(const SynthShape& s) {
    std::string name = "tern synth " + std::string(s.name) + " (" + std::string(s.model) + " shape, random weights)";
    for (const std::string_view from : {"phi3", "Phi3", "phi-3", "Phi-3"})
        for (size_t at = name.find(from); at != std::string::npos; at = name.find(from, at))
            name.replace(at, from.size(), std::string(from.substr(0, 3)) + " 3");
    return name;
}

std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
}

} // namespace

std::vector<std::string> synth_shape_names() {
    std::vector<std::string> names;
    for (const SynthShape& s : synth_shapes()) names.emplace_back(s.name);
    return names;
}

void write_synth_model(const SynthOptions& options, const std::string& out_path) {
    const SynthShape* shape = find_synth_shape(options.shape);
    if (!shape)
        throw UsageError("unknown synthetic model shape '" + options.shape + "' (choices: " + join(synth_shape_names()) + ")");
    const std::optional<QuantFtype> ftype = ftype_from_name(options.type);
    if (!ftype) {
        std::vector<std::string> names;
        for (std::string_view n : ftype_names()) names.emplace_back(n);
        throw UsageError("unknown model type '" + options.type + "' (choices: " + join(names) + ")");
    }
    const int n_threads = resolve_threads(options.n_threads);

    SynthVocab vocab;
    if (options.vocab_from.empty()) {
        vocab = builtin_vocab(shape->vocab);
    } else {
        vocab = vocab_from_file(options.vocab_from);
        if (vocab.n_tokens != shape->vocab) {
            const std::string note = "synth: " + options.vocab_from + " has " + std::to_string(vocab.n_tokens) +
                                     " tokens, " + std::string(shape->name) + " has " + std::to_string(shape->vocab) +
                                     "; the model gets the file's vocabulary size";
            if (options.on_warning) options.on_warning(note);
        }
    }

    const std::vector<SynthTensor> tensors = tensor_list(*shape, vocab.n_tokens);
    std::vector<PlanInput> inputs;
    for (const SynthTensor& t : tensors) {
        PlanInput p;
        p.name = t.name;
        p.type = GgmlType::F32;
        p.n_dims = t.ne2 > 1 ? 3 : t.ne1 > 1 ? 2 : 1;
        p.ne[0] = t.ne0;
        p.ne[1] = t.ne1;
        p.ne[2] = t.ne2;
        inputs.push_back(std::move(p));
    }
    ModelFacts facts;
    facts.arch = std::string(shape->arch);
    facts.n_layer = shape->n_layers;
    facts.n_head = shape->n_heads;
    facts.n_head_kv = shape->n_kv_heads;
    facts.n_expert = shape->n_expert;
    PlanOptions po;
    po.ftype = *ftype;
    const QuantPlan plan = make_quant_plan(inputs, facts, po);

    GgufWriter writer;
    writer.set("general.architecture", GgufValue::make_string(std::string(shape->arch)));
    writer.set("general.name", GgufValue::make_string(model_name(*shape)));
    for (GgufKv& kv : arch_keys(*shape, vocab.n_tokens)) writer.set(kv.key, std::move(kv.value));
    for (GgufKv& kv : vocab.keys) writer.set(kv.key, std::move(kv.value));
    writer.set("general.quantization_version", GgufValue::make_u32(2));
    writer.set("general.file_type", GgufValue::make_u32(ftype_info(*ftype).file_type));
    for (const PlannedTensor& t : plan.tensors)
        writer.add_tensor(t.name, t.to, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)));

    const uint64_t total = plan.data_bytes();
    uint64_t done = 0;
    writer.write(out_path, [&](size_t i, std::span<uint8_t> out) {
        if (options.cancel && options.cancel->load())
            throw TernError(ExitCode::interrupted, "synth: interrupted; " + out_path +
                                                       " was not written and its temporary file was removed");
        const PlannedTensor& pt = plan.tensors[i];
        const SynthTensor& t = tensors[pt.source_index];
        const uint64_t tensor_seed = fnv1a(t.name) ^ (options.seed * 0x9E3779B97F4A7C15ull);
        fill_tensor(t, pt.to, tensor_seed, out, n_threads);
        done += out.size();
        if (options.on_progress) options.on_progress(done, total);
    });
}

} // namespace tern
