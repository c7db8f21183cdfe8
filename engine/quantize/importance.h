#pragma once
// The importance statistics of `tern quantize --calibrate`: for every weight matrix, the mean squared
// activation of each input column (an "importance matrix"), and optionally the input's second moments.
// The quantizers of quant/imatrix.h and quant/compensated.h use them to weight their error.
// ImportanceObserver collects them from a backend's forward (engine/backend.h ForwardObserver).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/backend.h"

namespace tern {

struct ModelWeights;

struct ImportanceMatrix {
    std::map<std::string, std::vector<float>> columns;   // tensor name -> mean x_c^2 per input column
    int64_t tokens = 0;                                   // activations averaged over
    // With second_moments: tensor name -> mean x x^T (width x width, row-major). The diagonal
    // approximation above ignores how columns move together; the held-out check must not.
    // Only inputs up to kMaxMomentWidth wide get one (width^2 floats and width^2 multiply-adds per token:
    // 8192-wide inputs would cost 256 MB and hours each); matrices that read the same input (attn_k/v,
    // ffn_up) are not stored again but named in moment_owner.
    std::map<std::string, std::vector<float>> moments;
    std::map<std::string, std::string> moment_owner;      // tensor name -> the name its moments are under
    const std::vector<float>* moments_of(const std::string& tensor) const;
};

inline constexpr int64_t kMaxMomentWidth = 2048;

// Sums the squares (and with second_moments the outer products) of every projection input a forward
// reports, under the name of the first matrix that reads it (attn_q, attn_output, ffn_gate, ffn_down,
// output; the output is token_embd when tied). Tokens are counted at the lm_head, so the forwards must
// keep every row's logits (LogitsWanted::all). The sums run in the order the forwards report, so the
// result does not depend on the thread count.
class ImportanceObserver final : public ForwardObserver {
public:
    // weights must outlive the observer: only tensor names are read from it.
    ImportanceObserver(const ModelWeights& weights, bool second_moments);
    void matmul_input(int32_t layer, ProjectionInput which, const float* x, int64_t n_rows, int64_t width) override;
    // The means: attn_k/v and ffn_up get the columns of the matrix whose input they share (and name it
    // in moment_owner). The observer is spent afterwards.
    ImportanceMatrix finish();

private:
    const std::string& tensor_name(int32_t layer, ProjectionInput which) const;

    const ModelWeights& weights_;
    bool second_moments_ = false;
    ImportanceMatrix sums_;
};

} // namespace tern
