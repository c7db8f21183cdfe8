#pragma once
// The quantization plan: which format every tensor of a model gets for a requested file type, as a
// pure function of the tensor list (names, shapes, formats), a few model facts and the options.
// It follows llama-quantize's type mixtures (../shared/FORMATS.md §5) so that a tern file and a
// llama.cpp file of the same type hold the same tensor formats. No I/O here: `tern quantize` and
// its --dry-run, and the tests, all call make_quant_plan.
//
// tern's own choices (documented in models.md, "Quantization and perplexity"):
// * f8_e4m3: every quantizable tensor becomes F8_E4M3 except output.weight and token_embd.weight,
//   which become F16: the output is the most sensitive projection (llama's Q6_K/Q8_0 output rule),
//   and the embedding is a row lookup with no FP8 compute to gain (keeping it f16 halved the PPL
//   cost on babyllama). Widths that are not a multiple of 32 fall back to F16.
//   general.file_type = 1000 (outside llama.cpp's ids).
// * mxfp4_moe is llama-quantize's MXFP4_MOE (general.file_type 38): expert tensors (three dims, ne[2] > 1)
//   become MXFP4, every other quantizable tensor Q8_0 (the output too). A dense model has no expert tensors,
//   so tern adds mxfp4 (also file type 38, the same label for llama.cpp): MXFP4 for every FFN matrix
//   (ffn_up/gate/down, experts or not), Q8_0 for the rest. Widths that are not a multiple of 32 become F16.
// * --tensor-type PATTERN=TYPE: PATTERN is an ECMAScript regular expression searched anywhere in the
//   tensor name (std::regex_search, as llama-quantize does), so "attn_v" matches every
//   blk.N.attn_v.weight and "^output\.weight$" one tensor. The first matching override wins. It
//   applies only to tensors that would be quantized, also with --pure, and the width fallback below
//   still applies to the type it names.
// * The width fallback (§5.4) is applied to every chosen type, including under --pure and for
//   overrides. Q2_K/Q3_K fall back to Q4_0 as in llama-quantize 0c1e57098 (§5.4, from the
//   c392e5094 baseline, says IQ4_NL). A type §5.4 has no fallback for (the legacy types, Q8_0, IQ4_NL) becomes F16, as in
//   llama-quantize since 2025 (0c1e57098); the baseline c392e5094 stopped with "Unsupported tensor
//   size" instead. Every fallback is reported once per (type, width).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "quant/types.h"

namespace tern {

// A requested output type ("file type"): the names `tern quantize --type` accepts.
enum class QuantFtype {
    f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0,
    q2_k, q3_k_s, q3_k_m, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k,
    f8_e4m3, mxfp4_moe, mxfp4,
};

struct FtypeInfo {
    QuantFtype ftype;
    std::string_view name;   // "q4_k_m"
    uint32_t file_type;      // general.file_type (LLAMA_FTYPE ids; 1000 for f8_e4m3)
    GgmlType default_type;   // the bulk tensor format
};

const FtypeInfo& ftype_info(QuantFtype f);
std::optional<QuantFtype> ftype_from_name(std::string_view name);   // case-insensitive
std::vector<std::string_view> ftype_names();                        // for help and messages
// The ftype whose general.file_type id is `id`, when tern knows it.
const FtypeInfo* ftype_from_file_type(uint32_t id);

// The facts of a tensor the plan needs. `n_dims` counts the stored dims; trailing 1s are ignored.
struct PlanInput {
    std::string name;
    GgmlType type = GgmlType::F32;
    int n_dims = 1;
    int64_t ne[4] = {1, 1, 1, 1};
};

struct ModelFacts {
    std::string arch;          // general.architecture (the 70B rule looks at llama / qwen2)
    int64_t n_layer = 0;       // <arch>.block_count (n for ffn_down's counters)
    int64_t n_head = 0;        // first layer's head count (0 = unknown: GQA rules off)
    int64_t n_head_kv = 0;
    int64_t n_expert = 0;      // <arch>.expert_count (0: dense): llama-quantize's 8-expert rules, ffn_down's layer
};

struct TypeOverride {
    std::string pattern;   // regex, searched in the tensor name
    GgmlType type;
};

struct PlanOptions {
    QuantFtype ftype = QuantFtype::q8_0;
    bool pure = false;                      // the default type for every quantizable tensor
    std::vector<TypeOverride> overrides;    // --tensor-type, first match wins
};

struct PlannedTensor {
    size_t source_index = 0;   // index into the input list
    std::string name;
    GgmlType from = GgmlType::F32;
    GgmlType to = GgmlType::F32;
    int64_t ne[4] = {1, 1, 1, 1};
    int n_dims = 1;
    bool quantizable = false;   // a weight matrix the rules apply to (others are copied)
    std::string reason;         // why `to` differs from the ftype's default: "output rule", "more_bits", ...
    std::string fallback;       // "q4_K -> q5_0: width 320 is not a multiple of 256" when one applied

    bool converted() const { return from != to; }
    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    uint64_t n_bytes() const;   // in the target format
};

struct QuantPlan {
    QuantFtype ftype = QuantFtype::q8_0;
    std::vector<PlannedTensor> tensors;   // in output order (FORMATS.md §5.1 "Order and counters")
    // One line per distinct fallback (type, width), to report once rather than per tensor.
    std::vector<std::string> fallback_notes;

    uint64_t data_bytes() const;   // the sum of the target tensor sizes (unpadded)
};

// Is `name` (with `n_dims` dims, trailing 1s not counted) a tensor llama-quantize quantizes?
bool is_quantizable(std::string_view name, int n_dims_effective);
// more_bits(i, n) of FORMATS.md §5.1.
bool more_bits(int64_t i, int64_t n);
// The output order: (layer from "blk.N.", -1 without; then the name bytewise).
bool tensor_order_less(std::string_view a, std::string_view b);

// Throws UsageError for an override whose regex does not compile.
QuantPlan make_quant_plan(const std::vector<PlanInput>& tensors, const ModelFacts& facts, const PlanOptions& options);

} // namespace tern
