#include "engine/weights.h"

#include <array>
#include <cstring>
#include <new>
#include <optional>
#include <string>

#include "base/error.h"
#include "base/finite.h"
#include "engine/model_config.h"
#include "engine/tensor_roles.h"
#include "formats/gguf.h"
#include "quant/reference.h"
#include "quant/value_check.h"

namespace tern {
namespace {

enum class Need { required, optional };

// Which dimension disagrees, in words: "ne[1] is 256, the metadata says 512".
std::string describe(const GgufTensor& t, int64_t n0, int64_t n1, int64_t n2) {
    if (t.ne[0] != n0) return "ne[0] is " + std::to_string(t.ne[0]) + ", the metadata says " + std::to_string(n0);
    if (t.ne[1] != n1) return "ne[1] is " + std::to_string(t.ne[1]) + ", the metadata says " + std::to_string(n1);
    if (t.ne[2] != n2) return "ne[2] is " + std::to_string(t.ne[2]) + ", the metadata says " + std::to_string(n2);
    return std::to_string(t.n_dims) + " dimensions where at most " + (n2 > 1 ? "3" : "2") + " are used";
}

// The tensor's bytes where kernels can read them: in place when aligned, else an aligned copy kept
// in `store`. GGUF allows general.alignment = 1; reading such a file's f32 norms or f16 rows or
// quant blocks through typed pointers in place would be misaligned access (undefined behaviour,
// reported by UBSan, a fault on strict-alignment CPUs) in every kernel that touches them.
const uint8_t* aligned_bytes(const GgufTensor& t, std::vector<std::shared_ptr<const uint8_t>>& store) {
    if (reinterpret_cast<uintptr_t>(t.data) % kWeightAlignment == 0) return t.data;
    const std::align_val_t align{kWeightAlignment};
    auto* copy = static_cast<uint8_t*>(::operator new(t.n_bytes == 0 ? 1 : t.n_bytes, align));
    std::memcpy(copy, t.data, t.n_bytes);
    store.emplace_back(copy, [align](const uint8_t* p) { ::operator delete(const_cast<uint8_t*>(p), align); });
    return copy;
}

class Binder {
public:
    Binder(const GgufFile& file, std::vector<std::shared_ptr<const uint8_t>>& store) : file_(file), store_(store) {}

    // A matrix of n_out rows by n_in columns, stored as ne = {n_in, n_out}. `dims` names the
    // expected shape for messages, e.g. "[dim, n_heads*head_dim]".
    WeightRef matrix(const std::string& name, int64_t n_in, int64_t n_out, const char* dims,
                     Need need = Need::required) const {
        return bind(name, n_in, n_out, 2, dims, need);
    }
    WeightRef vector(const std::string& name, int64_t n, const char* dims, Need need = Need::required) const {
        return bind(name, n, 1, 1, dims, need);
    }
    // n_mats matrices of n_out rows by n_in, stored as ne = {n_in, n_out, n_mats} (the expert tensors).
    WeightRef stack(const std::string& name, int64_t n_in, int64_t n_out, int64_t n_mats, const char* dims) const {
        return bind(name, n_in, n_out, 3, dims, Need::required, n_mats);
    }

    // Rows [first, first + n) of a bound matrix as a matrix of its own: the parts of a fused tensor (phi3's
    // attn_qkv and ffn_up). In place when the slice starts on kWeightAlignment, else an aligned copy.
    WeightRef rows(const WeightRef& m, int64_t first, int64_t n, const std::string& part) const {
        WeightRef w = m;
        w.name = m.name + " (" + part + ")";
        w.ne[1] = n;
        const uint8_t* start = m.row(first);
        if (reinterpret_cast<uintptr_t>(start) % kWeightAlignment == 0) {
            w.data = start;
            return w;
        }
        GgufTensor t;
        t.data = start;
        t.n_bytes = static_cast<size_t>(n) * m.row_size();
        w.data = aligned_bytes(t, store_);
        return w;
    }

    bool has(const std::string& name) const { return file_.find_tensor(name) != nullptr; }

private:
    WeightRef bind(const std::string& name, int64_t n0, int64_t n1, int n_dims, const char* dims, Need need,
                   int64_t n2 = 1) const {
        // Appended piece by piece: GCC 12 misreads "[" + std::to_string(..) as an overlapping copy (-Wrestrict).
        std::string expected = "[";
        expected += std::to_string(n0);
        if (n_dims >= 2) expected += ", " + std::to_string(n1);
        if (n_dims == 3) expected += ", " + std::to_string(n2);
        expected += "]";
        const GgufTensor* t = file_.find_tensor(name);
        if (!t) {
            if (need == Need::optional) return WeightRef{name};
            throw InputError(file_.path() + ": tensor " + name + " is missing (expected shape " + expected + " " +
                             dims + "; an incomplete conversion or a damaged file?)");
        }
        // Trailing dimensions of size 1 are allowed: some writers store vectors as [n, 1].
        const bool shape_ok = t->ne[0] == n0 && t->ne[1] == n1 && t->ne[2] == n2 && t->ne[3] == 1 && t->n_dims >= 1;
        if (!shape_ok)
            throw InputError(file_.path() + ": tensor " + name + " has shape " + t->shape_string() + " but expected " +
                             expected + " " + dims + " from the metadata (" + describe(*t, n0, n1, n2) +
                             "; a damaged file or mismatched metadata?)");
        const TypeInfo& ti = type_info(t->type);
        if (!ti.can_dequantize)
            throw InputError(file_.path() + ": tensor " + name + " has format " + std::string(ti.name) +
                             ", which tern cannot compute with yet (quantize the source model to another type)");
        WeightRef w;
        w.name = name;
        w.type = t->type;
        w.ne[0] = n0;
        w.ne[1] = n1;
        w.n_mats = n2;
        w.data = aligned_bytes(*t, store_);
        return w;
    }

    const GgufFile& file_;
    std::vector<std::shared_ptr<const uint8_t>>& store_;
};

// The tensors a forward reads whole for every token: norms, biases, attention sinks, the router and rope factors.
// One NaN or inf in any of them reaches every logit (a norm's weight multiplies every row), so their values are
// checked when the model loads; they are a few MB at most even in the largest models, against gigabytes of
// matrices (those `tern info --check` scans).
std::vector<const WeightRef*> small_tensors(const ModelWeights& w) {
    std::vector<const WeightRef*> t = {&w.output_norm, &w.rope_freqs, &w.rope_factors_long, &w.rope_factors_short,
                                       &w.per_layer_proj_norm};
    for (const std::vector<LayerWeights>* layers : {&w.layers, &w.nextn_layers})
      for (const LayerWeights& l : *layers)
        for (const LayerTensor& r : layer_tensors())
            if (r.kind == TensorKind::vector || r.kind == TensorKind::vector_rows || r.role == LayerRole::ffn_gate_inp)
                t.push_back(&(l.*r.member));
    return t;
}

void check_small_tensor_values(const GgufFile& file, const ModelWeights& w) {
    for (const WeightRef* t : small_tensors(w)) {
        if (!t->present()) continue;
        const int64_t n = t->ne[0] * t->ne[1] * t->n_mats;
        if (const std::optional<BadValue> bad = find_bad_value(t->type, t->data, n))
            throw InputError(file.path() + ": tensor " + t->name + ": " + bad->what +
                             " (a norm, bias, sink, router or rope factor must hold finite values: a damaged or "
                             "wrongly converted file)");
    }
    // Rope factors divide the rope angles: a zero or a negative one is no frequency.
    for (const WeightRef* t : {&w.rope_freqs, &w.rope_factors_long, &w.rope_factors_short}) {
        if (!t->present()) continue;
        std::vector<float> f(static_cast<size_t>(t->ne[0]));
        dequantize_row(t->type, t->data, f.data(), t->ne[0]);
        for (size_t i = 0; i < f.size(); ++i)
            if (!(f[i] > 0.0f))
                throw InputError(file.path() + ": tensor " + t->name + ": element " + std::to_string(i) + " is " +
                                 float_text(f[i]) +
                                 ", but rope factors divide the rope angles and must be > 0 (a "
                                 "damaged or wrongly converted file)");
    }
}

} // namespace

ModelWeights model_weights_from_gguf(const GgufFile& file, const ModelConfig& c) {
    ModelWeights w;
    const Binder b(file, w.realigned);
    w.token_embd = b.matrix("token_embd.weight", c.dim, c.vocab, "[dim, vocab]");
    w.output_norm = b.vector("output_norm.weight", c.dim, "[dim]");
    w.output = c.tied_output ? w.token_embd : b.matrix("output.weight", c.dim, c.vocab, "[dim, vocab]");
    if (c.rope_freq_factors) w.rope_freqs = b.vector("rope_freqs.weight", c.n_rot / 2, "[n_rot/2]");
    if (c.rope_longrope) {   // each optional, as llama.cpp loads them (absent: that context runs without factors)
        if (file.find_tensor("rope_factors_long.weight"))
            w.rope_factors_long = b.vector("rope_factors_long.weight", c.n_rot / 2, "[n_rot/2]");
        if (file.find_tensor("rope_factors_short.weight"))
            w.rope_factors_short = b.vector("rope_factors_short.weight", c.n_rot / 2, "[n_rot/2]");
    }
    if (c.per_layer_dim > 0) {
        const int64_t width = int64_t{c.n_layers} * c.per_layer_dim;
        w.per_layer_token_embd =
            b.matrix("per_layer_token_embd.weight", width, c.vocab, "[n_layers*per_layer_dim, vocab]");
        w.per_layer_model_proj =
            b.matrix("per_layer_model_proj.weight", c.dim, width, "[dim, n_layers*per_layer_dim]");
        w.per_layer_proj_norm = b.vector("per_layer_proj_norm.weight", c.per_layer_dim, "[per_layer_dim]");
    }

    // The decoder's layers, then the next-token-prediction layers after them (blk.n_layers ...). A file whose
    // metadata counts such layers but holds none of their tensors (the decoder's part of a split conversion) loads
    // without them, as llama.cpp's does.
    const bool nextn_present =
        !c.nextn_layers.empty() && b.has("blk." + std::to_string(c.n_layers) + ".nextn.eh_proj.weight");
    const auto n_all = static_cast<int32_t>(c.layers.size() + (nextn_present ? c.nextn_layers.size() : 0));
    w.layers.resize(c.layers.size());
    w.nextn_layers.resize(nextn_present ? c.nextn_layers.size() : 0);
    for (int32_t l = 0; l < n_all; ++l) {
        const bool nextn = l >= c.n_layers;
        const auto i = static_cast<size_t>(nextn ? l - c.n_layers : l);
        const LayerConfig& lc = nextn ? c.nextn_layers[i] : c.layers[i];
        LayerWeights& lw = nextn ? w.nextn_layers[i] : w.layers[i];
        const std::string p = "blk." + std::to_string(l) + ".";
        std::array<bool, kLayerRoles> bound{};   // roles already bound as parts of a fused tensor
        for (const LayerTensor& t : layer_tensors()) {
            const TensorNeed need = t.need(c, lc);
            if (need == TensorNeed::absent || bound[static_cast<size_t>(t.role)]) continue;
            const TensorShape s = t.shape(c, lc);
            if (t.role == LayerRole::wq && b.has(p + "attn_qkv.weight")) {
                // One fused tensor, the rows of q, then k, then v (phi3; llama.cpp accepts it for any architecture).
                const int64_t q_dim = s.n_out, k_dim = layer_tensor(LayerRole::wk).shape(c, lc).n_out,
                              v_dim = layer_tensor(LayerRole::wv).shape(c, lc).n_out;
                const WeightRef qkv = b.matrix(p + "attn_qkv.weight", c.dim, q_dim + k_dim + v_dim,
                                               "[dim, n_heads*head_dim + n_kv_heads*(head_dim + head_dim_v)]");
                if (b.has(p + "attn_qkv.bias"))
                    throw InputError(file.path() + ": tensor " + p +
                                     "attn_qkv.bias: a fused q/k/v bias is not supported");
                lw.wq = b.rows(qkv, 0, q_dim, "q");
                lw.wk = b.rows(qkv, q_dim, k_dim, "k");
                lw.wv = b.rows(qkv, q_dim + k_dim, v_dim, "v");
                bound[static_cast<size_t>(LayerRole::wk)] = bound[static_cast<size_t>(LayerRole::wv)] = true;
                continue;
            }
            if (t.role == LayerRole::w_gate && c.ffn_gate_up_fused) {
                // phi3: ffn_up holds 2*ffn_dim rows, the gate's first, then the up projection's.
                const WeightRef gate_up =
                    b.matrix(p + "ffn_up.weight", c.dim, 2 * int64_t{lc.ffn_dim}, "[dim, 2*ffn_dim]");
                lw.w_gate = b.rows(gate_up, 0, lc.ffn_dim, "gate");
                lw.w_up = b.rows(gate_up, lc.ffn_dim, lc.ffn_dim, "up");
                bound[static_cast<size_t>(LayerRole::w_up)] = true;
                continue;
            }
            const std::string name = layer_tensor_name(t, c, l);
            const Need n = need == TensorNeed::required ? Need::required : Need::optional;
            WeightRef& dst = lw.*t.member;
            switch (t.kind) {
            case TensorKind::matrix:
            case TensorKind::vector_rows: dst = b.matrix(name, s.n_in, s.n_out, t.dims, n); break;
            case TensorKind::vector: dst = b.vector(name, s.n_in, t.dims, n); break;
            case TensorKind::stack: dst = b.stack(name, s.n_in, s.n_out, s.n_mats, t.dims); break;
            }
        }
    }
    // A layer with its own KV needs its K (optional in the table only for gemma4's layers on shared KV).
    for (int32_t l = 0; l < c.n_layers; ++l) {
        const LayerWeights& lw = w.layers[static_cast<size_t>(l)];
        if (!c.layers[static_cast<size_t>(l)].has_kv()) continue;
        for (const LayerRole r : {LayerRole::wk, LayerRole::k_norm})
            if (layer_tensor(r).need(c, c.layers[static_cast<size_t>(l)]) != TensorNeed::absent &&
                !weight_of(lw, r).present())
                throw InputError(file.path() + ": tensor '" + layer_tensor_name(layer_tensor(r), c, l) +
                                 "' is missing (layer " + std::to_string(l) + " has its own KV)");
    }
    check_small_tensor_values(file, w);
    return w;
}

const WeightRef& rope_factors_for(const ModelWeights& w, const ModelConfig& config, int32_t n_ctx) {
    if (!config.rope_longrope) return w.rope_freqs;
    return config.rope_long_factors(n_ctx) ? w.rope_factors_long : w.rope_factors_short;
}

} // namespace tern
