#pragma once
// A GGUF file copied with edits, and the one-line error of loading one: what the family suites (test_moe,
// test_gpt_oss, test_smollm3_phi3) build their malformed and variant files with.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/error.h"
#include "engine/model.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "quant/reference.h"
#include "tests/test_support.h"

namespace tern::test {

// Adds what stands in for tensor `t` to `w` (or nothing, to leave it out) and returns true; false keeps `t`.
using TensorReplace = std::function<bool(GgufWriter& w, const GgufTensor& t)>;

// `src` rewritten to dir/name: its metadata changed by `edit_meta`, each tensor kept or replaced by `replace`.
inline std::string rewrite_gguf(const TempDir& dir, const std::string& src, const std::string& name,
                                const std::function<void(GgufWriter&)>& edit_meta, const TensorReplace& replace = {}) {
    const GgufFile in = GgufFile::open(src);
    GgufWriter w;
    w.copy_metadata_from(in);
    edit_meta(w);
    for (const GgufTensor& t : in.tensors()) {
        if (replace && replace(w, t)) continue;
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)),
                     std::span<const uint8_t>(t.data, t.n_bytes));
    }
    const std::string path = (dir / name).string();
    w.write(path);
    return path;
}

// rewrite_gguf with the tensors named by `zero` replaced by F32 zeros of their shape and those named by `drop` left
// out.
inline std::string rewrite_zeroing(const TempDir& dir, const std::string& src, const std::string& name,
                                   const std::function<void(GgufWriter&)>& edit_meta,
                                   const std::function<bool(const std::string&)>& zero = {},
                                   const std::function<bool(const std::string&)>& drop = {}) {
    return rewrite_gguf(dir, src, name, edit_meta, [&](GgufWriter& w, const GgufTensor& t) {
        if (drop && drop(t.name)) return true;
        if (!zero || !zero(t.name)) return false;
        static const std::vector<uint8_t> zeros(8 << 20, 0);   // outlives the write, as add_tensor's spans must
        w.add_tensor(t.name, GgmlType::F32, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)),
                     std::span<const uint8_t>(zeros.data(), size_t(t.n_elements()) * sizeof(float)));
        return true;
    });
}

// rewrite_gguf with the tensors named by `fill` replaced by F32 tensors of their shape holding `value` in every
// element (NaN, infinity: the damaged weights the logit guard meets).
inline std::string rewrite_filled(const TempDir& dir, const std::string& src, const std::string& name,
                                  const std::function<bool(const std::string&)>& fill, float value) {
    std::vector<std::vector<float>> kept;   // outlive the write, as add_tensor's spans must
    return rewrite_gguf(dir, src, name, [](GgufWriter&) {}, [&](GgufWriter& w, const GgufTensor& t) {
        if (!fill(t.name)) return false;
        const std::vector<float>& v = kept.emplace_back(static_cast<size_t>(t.n_elements()), value);
        w.add_tensor(t.name, GgmlType::F32, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)),
                     std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)));
        return true;
    });
}

// rewrite_gguf with tensor `tensor`'s values decoded, element `index` set to `value`, and stored as `type` (a
// float format: f32, f16 or bf16 keep a NaN or an inf as such).
inline std::string rewrite_with_value(const TempDir& dir, const std::string& src, const std::string& name,
                                      const std::string& tensor, int64_t index, float value,
                                      GgmlType type = GgmlType::F32) {
    std::vector<uint8_t> bytes; // outlives the write, as add_tensor's spans must
    return rewrite_gguf(
        dir, src, name, [](GgufWriter&) {},
        [&](GgufWriter& w, const GgufTensor& t) {
            if (t.name != tensor) return false;
            std::vector<float> values(static_cast<size_t>(t.n_elements()));
            dequantize_row(t.type, t.data, values.data(), t.n_elements());
            values.at(static_cast<size_t>(index)) = value;
            bytes.resize(row_bytes(type, t.n_elements()));
            quantize_row(type, values.data(), bytes.data(), t.n_elements());
            w.add_tensor(t.name, type, std::vector<int64_t>(t.ne, t.ne + std::max(1, t.n_dims)), bytes);
            return true;
        });
}

// The InputError loading `path` gives, or "" when it loads.
inline std::string load_error(const std::string& path) {
    try {
        load_model(path);
    } catch (const InputError& e) {
        return e.what();
    }
    return "";
}

} // namespace tern::test
