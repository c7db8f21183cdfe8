// The gated delta rule's two algorithms (gated_delta.h) written once over a set of vector primitives V, included
// by gated_delta.cpp (scalar primitives: the twins) and gated_delta_avx2.cpp (AVX2 primitives). Everything here
// is in an unnamed namespace: each includer gets its own copy, compiled with its own flags.
//
// V provides, over n floats:
//   void  dot2(const float* s, const float* k, const float* q, int n, float& sk, float& sq)   s . k and s . q
//   void  scale_axpy(float* s, float c, float d, const float* k, int n)   s = c s + d k
//   float dot(const float* a, const float* b, int n)
//   void  axpy(float* y, float c, const float* x, int n)   y += c x
//   void  scale(float* y, float c, int n)                  y *= c
//
// The recurrent step reads a state row once before its update: with e = exp(g), the prediction is e (S_i . k) and
// the output e (S_i . q) + delta_i (k . q), the same as reading the updated row (S_i' = e S_i + delta_i k) with q.
#include <algorithm>
#include <cmath>
#include <vector>

namespace tern {
namespace {

inline int k_head_of(const GatedDeltaArgs& a, int h) {
    return a.grouped_k_heads ? h / (a.n_v_heads / a.n_k_heads) : h % a.n_k_heads;
}

template <class V> void recurrent_heads(const GatedDeltaArgs& a, int h_begin, int h_end) {
    const int dk = a.d_k, dv = a.d_v;
    for (int h = h_begin; h < h_end; ++h) {
        const int kh = k_head_of(a, h);
        float* S = a.state + static_cast<int64_t>(h) * dv * dk;
        for (int64_t t = 0; t < a.n_tokens; ++t) {
            const float* kt = a.k + t * a.k_stride + static_cast<int64_t>(kh) * dk;
            const float* qt = a.q + t * a.q_stride + static_cast<int64_t>(kh) * dk;
            const float* vt = a.v + t * a.v_stride + static_cast<int64_t>(h) * dv;
            float* ot = a.out + t * a.out_stride + static_cast<int64_t>(h) * dv;
            const float decay = static_cast<float>(std::exp(static_cast<double>(a.g[t * a.gb_stride + h])));
            const float beta = a.beta[t * a.gb_stride + h];
            const float kq = V::dot(kt, qt, dk);
            for (int i = 0; i < dv; ++i) {
                float* Si = S + static_cast<int64_t>(i) * dk;
                float sk, sq;
                V::dot2(Si, kt, qt, dk, sk, sq);
                const float delta = beta * (vt[i] - decay * sk);
                ot[i] = a.scale * (decay * sq + delta * kq);
                V::scale_axpy(Si, decay, delta, kt, dk);
            }
        }
    }
}

// Per-thread scratch of the chunked form.
struct ChunkScratch {
    std::vector<double> G;                  // [C] running sum of g within the chunk
    std::vector<float> gamma;               // [C] exp(G_t)
    std::vector<float> U;                   // [C][d_v] the deltas u_t
    std::vector<float> O;                   // [C][d_v] the outputs before the scale
    std::vector<float> L;                   // [C][C] beta_t E_ts (k_s . k_t), s < t
    std::vector<float> A;                   // [C][C] E_ts (k_s . q_t), s <= t
    std::vector<float> coef;                // [C] E_Cs for the state update
    void size(int C, int dv) {
        G.resize(C);
        gamma.resize(C);
        coef.resize(C);
        U.resize(static_cast<size_t>(C) * dv);
        O.resize(static_cast<size_t>(C) * dv);
        L.resize(static_cast<size_t>(C) * C);
        A.resize(static_cast<size_t>(C) * C);
    }
};

template <class V> void chunked_heads(const GatedDeltaArgs& a, int h_begin, int h_end) {
    const int dk = a.d_k, dv = a.d_v;
    const int C = std::max(1, a.chunk);
    thread_local ChunkScratch sc;
    sc.size(C, dv);
    for (int h = h_begin; h < h_end; ++h) {
        const int kh = k_head_of(a, h);
        float* S = a.state + static_cast<int64_t>(h) * dv * dk;
        for (int64_t t0 = 0; t0 < a.n_tokens; t0 += C) {
            const int n = static_cast<int>(std::min<int64_t>(C, a.n_tokens - t0));
            auto kp = [&](int t) { return a.k + (t0 + t) * a.k_stride + static_cast<int64_t>(kh) * dk; };
            auto qp = [&](int t) { return a.q + (t0 + t) * a.q_stride + static_cast<int64_t>(kh) * dk; };
            auto vp = [&](int t) { return a.v + (t0 + t) * a.v_stride + static_cast<int64_t>(h) * dv; };
            auto gb = [&](int t) { return (t0 + t) * a.gb_stride + h; };
            double run = 0.0;
            for (int t = 0; t < n; ++t) {
                run += static_cast<double>(a.g[gb(t)]);
                sc.G[t] = run;
                sc.gamma[t] = static_cast<float>(std::exp(run));
            }
            // One pass over S0's rows: the right-hand sides beta_t (v_t - gamma_t S0 k_t) and gamma_t S0 q_t.
            for (int i = 0; i < dv; ++i) {
                const float* Si = S + static_cast<int64_t>(i) * dk;
                for (int t = 0; t < n; ++t) {
                    const float beta = a.beta[gb(t)];
                    sc.U[static_cast<size_t>(t) * dv + i] = beta * (vp(t)[i] - sc.gamma[t] * V::dot(Si, kp(t), dk));
                    sc.O[static_cast<size_t>(t) * dv + i] = sc.gamma[t] * V::dot(Si, qp(t), dk);
                }
            }
            // The chunk's key-key and key-query products with their decays.
            for (int t = 0; t < n; ++t) {
                const float beta = a.beta[gb(t)];
                for (int s = 0; s <= t; ++s) {
                    const float e = static_cast<float>(std::exp(sc.G[t] - sc.G[s]));
                    if (s < t) sc.L[static_cast<size_t>(t) * C + s] = beta * e * V::dot(kp(s), kp(t), dk);
                    sc.A[static_cast<size_t>(t) * C + s] = e * V::dot(kp(s), qp(t), dk);
                }
            }
            // Forward substitution: u_t -= sum_{s<t} L_ts u_s.
            for (int t = 1; t < n; ++t) {
                float* ut = sc.U.data() + static_cast<size_t>(t) * dv;
                for (int s = 0; s < t; ++s)
                    V::axpy(ut, -sc.L[static_cast<size_t>(t) * C + s], sc.U.data() + static_cast<size_t>(s) * dv, dv);
            }
            // Outputs.
            for (int t = 0; t < n; ++t) {
                float* Ot = sc.O.data() + static_cast<size_t>(t) * dv;
                for (int s = 0; s <= t; ++s)
                    V::axpy(Ot, sc.A[static_cast<size_t>(t) * C + s], sc.U.data() + static_cast<size_t>(s) * dv, dv);
                float* ot = a.out + (t0 + t) * a.out_stride + static_cast<int64_t>(h) * dv;
                for (int i = 0; i < dv; ++i) ot[i] = a.scale * Ot[i];
            }
            // The state at the chunk's end.
            for (int s = 0; s < n; ++s) sc.coef[s] = static_cast<float>(std::exp(sc.G[n - 1] - sc.G[s]));
            const float gl = sc.gamma[n - 1];
            for (int i = 0; i < dv; ++i) {
                float* Si = S + static_cast<int64_t>(i) * dk;
                V::scale(Si, gl, dk);
                for (int s = 0; s < n; ++s) V::axpy(Si, sc.coef[s] * sc.U[static_cast<size_t>(s) * dv + i], kp(s), dk);
            }
        }
    }
}

} // namespace
} // namespace tern
