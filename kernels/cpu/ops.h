#pragma once
// Scalar CPU math of the decoder, as free functions on plain pointers. These are the straightforward
// versions (correct first; the SIMD issue replaces the hot ones and keeps these as their oracle).
//
// Determinism: every function computes each output element with one fixed order of operations,
// and the parallel ones split work over output rows (or heads) only, so results are bit-identical
// for any thread count.
#include <cstdint>

#include "quant/types.h"

namespace tern {

// y = x / sqrt(mean(x^2) + eps) * w over n elements. The sum of squares is accumulated in double
// (the variance of 4096 f32 squares loses ~1e-5 relative in f32). w may be nullptr (no weight).
void rmsnorm_f32(const float* x, const float* w, float* y, int64_t n, float eps);

// YaRN's change to RoPE (rope.scaling.type "yarn"; ext_factor 0 leaves RoPE as it was). Pair i's angle
// multiplier is not freq_scale alone: a ramp r_i = ext_factor * (1 - clamp((i - corr_low) / max(0.001,
// corr_high - corr_low), 0, 1)) (in float) mixes it with 1, m_i = freq_scale * (1 - r_i) + r_i, so the fast
// pairs below corr_low keep their unscaled angle and the slow pairs above corr_high are interpolated. The
// rotated values are also multiplied by mscale (cos and sin are), which scales q.k by mscale^2.
struct RopeYarn {
    float ext_factor = 0.0f;
    float corr_low = 0.0f, corr_high = 0.0f;
    float mscale = 1.0f;
    bool operator==(const RopeYarn&) const = default;
};

// m_i above (freq_scale exactly when YaRN is off), in double.
double rope_pair_scale(int64_t i, float freq_scale, const RopeYarn& yarn);

// The angle of pair i at position pos (in double: at pos 30000 an f32 angle is off by ~1e-3 rad);
// pos may be negative (kernels/cpu/rope_shift.h turns cached keys back by a number of positions).
// pos * rope_pair_scale * base^(-2i/n_rot), divided by freq_factors[i] when given.
double rope_theta(int64_t i, int64_t n_rot, int32_t pos, float base, float freq_scale, const float* freq_factors,
                  const RopeYarn& yarn = {});

// RoPE on one head of head_dim floats at position pos; only the first n_rot dims rotate.
// The angle of pair i (i < n_rot/2) is pos * freq_scale * base^(-2i/n_rot), divided by
// freq_factors[i] when freq_factors is not nullptr (Llama 3.1 "rope_freqs"); with YaRN the angle is
// rope_theta's and the rotated pair is multiplied by yarn.mscale (cos and sin rounded to float first, then
// times mscale in float, 1 leaving them as they were).
//   normal: pairs (2i, 2i+1)       (llama-arch GGUFs: the converter permuted Wq/Wk)
//   neox:   pairs (i, i + n_rot/2)  (qwen2, qwen3, gemma)
void rope_normal_f32(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale,
                     const float* freq_factors, const RopeYarn& yarn = {});
void rope_neox_f32(float* x, int64_t head_dim, int64_t n_rot, int32_t pos, float base, float freq_scale,
                   const float* freq_factors, const RopeYarn& yarn = {});

// The cos/sin table of rope_*_f32 at position pos: cos[i] and sin[i] (i < n_rot/2) are the floats those
// functions compute for pair i (the same rope_theta angle, the same double cos/sin rounded to float), so a
// rotation by the table is bit-identical to them. One table serves every head of a token: the angles
// depend on the position only, and recomputing pow/sin/cos per head cost ~3% of a prefill.
void rope_cos_sin(int64_t n_rot, int32_t pos, float base, float freq_scale, const float* freq_factors, float* cos,
                  float* sin, const RopeYarn& yarn = {});
// One head's first n_rot dims rotated by a rope_cos_sin table: pairs (i, i + n_rot/2) when neox, else (2i, 2i+1).
void rope_rotate_f32(float* x, bool neox, int64_t n_rot, const float* cos, const float* sin);

// In-place softmax over n floats (max-subtracted; the sum of exponentials in double).
void softmax_f32(float* x, int64_t n);

// x / (1 + exp(-x)) and the tanh approximation of GELU, elementwise.
float silu_f32(float x);
float gelu_tanh_f32(float x);
// y[i] = act(gate[i]) * up[i]: the gated FFN activation (SwiGLU / GeGLU). Elementwise, so the
// n_threads split (threads_for_elems: a prefill's n_tokens * ffn_dim, not decode's one row) changes no bit.
void swiglu_f32(const float* gate, const float* up, float* y, int64_t n, int n_threads = 1);
void geglu_tanh_f32(const float* gate, const float* up, float* y, int64_t n, int n_threads = 1);

// c * tanh(x / c) over n floats (gemma2 logit and attention soft-capping).
void softcap_f32(float* x, int64_t n, float cap);

// The id of the largest of n >= 1 floats, the lowest id among equal ones (+0 and -0 are equal); NaN never
// counts as larger, and a NaN at id 0 wins (what `if (x[t] > x[best]) best = t` from best = 0 gives, the
// rule every backend's argmax follows). Two passes the compiler vectorises: the largest value in 16
// independent lanes, then its first id.
int64_t argmax_f32(const float* x, int64_t n);

// Dot product of two f32 vectors with 16 independent partial sums combined in a fixed order:
// the compiler vectorises it without -ffast-math, and the result does not depend on threads.
float dot_f32(const float* a, const float* b, int64_t n);

// y = W x for n_cols activation columns, W of any dequantizable format:
//   w: (n_out, n_in) rows of `type` blocks, row r at w + r * row_bytes(type, n_in)
//   x: (n_cols, n_in) f32;  y: (n_cols, n_out) f32
// Each weight row is dequantized once into a thread-local f32 buffer and dotted with every column,
// so a batch reads the weights once. Output rows are shared out over n_threads threads (parallel_for.h).
void matmul_dequant(GgmlType type, const void* w, int64_t n_in, int64_t n_out, const float* x, int64_t n_cols, float* y,
                    int n_threads);

// The thread count worth using for `work` multiply-adds: 1 below ~1M (a fork/join plus the idle
// threads' spin-wait costs more than the ~0.5 ms of scalar work it would split), else n_threads.
int threads_for_work(int64_t work, int n_threads);

// The thread count worth using for a pass over `elems` independent floats (quantizing activations, SwiGLU):
// 1 below 64K elements (a decode step's row is a few microseconds of work, about one fork/join), else
// n_threads.
int threads_for_elems(int64_t elems, int n_threads);

// How the attention kernel reads the KV cache's elements.
enum class KvElem { f32, f16, bf16 };

// One query head attending over n_keys cached positions of one KV head:
//   q: head_dim f32;  k: (n_keys, head_dim) elem;  v: (n_keys, head_dim_v) elem (rows contiguous)
//   scores: n_keys f32 scratch;  out: head_dim_v f32
// score_j = (q . k_j) * scale, then c * tanh(score_j / c) when softcap > 0, softmax, out = sum_j p_j v_j.
// The caller chooses which positions are visible (causal mask, sliding window) by where k/v start
// and n_keys.
void attention_head(const float* q, const void* k, const void* v, KvElem elem, int64_t n_keys, int64_t head_dim,
                    int64_t head_dim_v, float scale, float softcap, float* scores, float* out);

} // namespace tern
