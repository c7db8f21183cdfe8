// Byte-exact requantization: quantizing every tensor of an F32 model with quant/reference.cpp must
// reproduce, byte for byte, the files llama-quantize (llama.cpp c392e5094, no imatrix) wrote from it
// (../shared/models/synth/README.md). Also checks that dequantizing the F16/BF16 files gives the F32
// values back exactly (the synth generator made every weight representable in both).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "formats/gguf.h"
#include "quant/reference.h"
#include "quant/types.h"
#include "tests/test_support.h"

using namespace tern;

namespace {

struct Result {
    int tensors = 0;
    int matched = 0;
    std::string first_failure;
};

// Quantizes each tensor of `f32_path` to the type its namesake has in `quant_path` and compares.
Result requantize_and_compare(const std::string& f32_path, const std::string& quant_path) {
    const GgufFile src = GgufFile::open(f32_path);
    const GgufFile dst = GgufFile::open(quant_path);
    Result r;
    REQUIRE_MESSAGE(src.tensors().size() == dst.tensors().size(), quant_path << ": tensor count differs from F32 file");
    for (const GgufTensor& qt : dst.tensors()) {
        ++r.tensors;
        const GgufTensor* st = src.find_tensor(qt.name);
        REQUIRE_MESSAGE(st != nullptr, quant_path << ": " << qt.name << " missing from " << f32_path);
        REQUIRE(st->type == GgmlType::F32);
        for (int i = 0; i < 4; ++i) REQUIRE(st->ne[i] == qt.ne[i]);
        const int64_t k = qt.ne[0];
        const size_t row = qt.row_size();
        REQUIRE(row * static_cast<size_t>(qt.n_rows()) == qt.n_bytes);
        std::vector<uint8_t> out(qt.n_bytes);
        for (int64_t rr = 0; rr < qt.n_rows(); ++rr) {
            // The F32 data is 32-byte aligned in the mapping, so it can be read as floats directly.
            const auto* x = reinterpret_cast<const float*>(st->data) + rr * k;
            quantize_row(qt.type, x, out.data() + static_cast<size_t>(rr) * row, k);
        }
        if (std::memcmp(out.data(), qt.data, qt.n_bytes) == 0) {
            ++r.matched;
        } else if (r.first_failure.empty()) {
            size_t at = 0;
            while (out[at] == qt.data[at]) ++at;
            const size_t bb = block_bytes(qt.type);
            r.first_failure = qt.name + " (" + std::string(type_name(qt.type)) + "): first difference at byte " +
                              std::to_string(at) + " (block " + std::to_string(at / bb) + ", byte " +
                              std::to_string(at % bb) + " of the block)";
        }
    }
    return r;
}

// Loose per-type bounds on rms(dequantized - f32) / rms(f32) for one tensor: the gaussian-data
// measurements of test_quant.cpp times ~1.5 (the synth weights are gaussian, but 128-row tensors give
// noisier estimates than 64 Ki samples). A wrong bit layout gives errors near or above 100%.
double max_rel_error(GgmlType t) {
    switch (t) {
    case GgmlType::F32: return 0.0;
    case GgmlType::F16:
    case GgmlType::BF16: return 0.0;   // the synth values are exactly representable
    case GgmlType::Q8_0: return 0.008;
    case GgmlType::Q6_K: return 0.027;
    case GgmlType::Q5_0:
    case GgmlType::Q5_1:
    case GgmlType::Q5_K: return 0.065;
    case GgmlType::Q4_0:
    case GgmlType::Q4_1:
    case GgmlType::Q4_K: return 0.13;
    case GgmlType::Q3_K: return 0.23;
    case GgmlType::Q2_K: return 0.45;
    default: return 1.0;
    }
}

// Dequantizes every tensor of a synth file and compares it with the F32 original.
void check_dequantized_error(const std::string& f32_path, const std::string& quant_path) {
    const GgufFile src = GgufFile::open(f32_path);
    const GgufFile q = GgufFile::open(quant_path);
    for (const GgufTensor& t : q.tensors()) {
        INFO(quant_path << " " << t.name << " (" << type_name(t.type) << ")");
        const GgufTensor& s = src.tensor(t.name);
        std::vector<float> y(static_cast<size_t>(t.n_elements()));
        for (int64_t r = 0; r < t.n_rows(); ++r)
            dequantize_row(t.type, t.data + static_cast<size_t>(r) * t.row_size(), y.data() + r * t.ne[0], t.ne[0]);
        const auto* x = reinterpret_cast<const float*>(s.data);
        double err2 = 0, ref2 = 0;
        for (size_t i = 0; i < y.size(); ++i) {
            err2 += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
            ref2 += static_cast<double>(x[i]) * x[i];
        }
        CHECK(std::sqrt(err2 / ref2) <= max_rel_error(t.type));
    }
}

void check_family(const std::string& dir, const std::string& base, const std::vector<std::string>& variants) {
    const std::string f32 = test::shared_path(dir + "/" + base + "-f32.gguf").string();
    for (const std::string& v : variants) {
        const std::string q = test::shared_path(dir + "/" + base + "-" + v + ".gguf").string();
        INFO(q);
        const Result r = requantize_and_compare(f32, q);
        MESSAGE(base << "-" << v << ": " << r.matched << "/" << r.tensors << " tensors byte-identical"
                     << (r.first_failure.empty() ? "" : "; " + r.first_failure));
        CHECK(r.tensors > 0);
        CHECK_MESSAGE(r.matched == r.tensors, r.first_failure);
    }
}

} // namespace

TEST_CASE("requantizing synth-k256-f32 reproduces every llama-quantize output byte for byte") {
    check_family("models/synth", "synth-k256",
                 {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_m", "q6_k", "f16",
                  "bf16"});
}

TEST_CASE("requantizing synth-k256-tied-f32 and synth-qwen2-k256-f32 reproduces their outputs") {
    check_family("models/synth", "synth-k256-tied", {"f16", "q4_0", "q4_k_m", "q8_0"});
    check_family("models/synth", "synth-qwen2-k256", {"f16", "q4_0", "q4_k_m", "q8_0"});
}

TEST_CASE("requantizing the small real models reproduces their llama-quantize outputs") {
    // Widths 64..192 make llama-quantize fall back from k-quants to q5_0 / q8_0 / f16 (FORMATS.md
    // §5.4), so these cover the fallback types on real (trained) weight distributions.
    check_family("models/gguf", "stories260K", {"f16", "q4_k_m", "q6_k"});
    check_family("models/gguf", "aidreams260K", {"f16", "q4_k_m", "q6_k"});
    check_family("models/gguf", "babyllama-tok105", {"f16", "q4_0", "q4_k_m", "q6_k", "q8_0"});
    check_family("models/gguf", "llama2xs-tok512", {"f16", "q4_0", "q4_k_m", "q6_k", "q8_0"});
}

TEST_CASE("dequantizing every synth-k256 file stays within each format's error of the F32 weights") {
    const std::string f32 = test::shared_path("models/synth/synth-k256-f32.gguf").string();
    for (const char* v : {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_m", "q6_k",
                          "f16", "bf16"})
        check_dequantized_error(f32, test::shared_path(std::string("models/synth/synth-k256-") + v + ".gguf").string());
}

TEST_CASE("dequantizing the synth F16/BF16 files gives the F32 values exactly") {
    const GgufFile src = GgufFile::open(test::shared_path("models/synth/synth-k256-f32.gguf").string());
    for (const char* v : {"f16", "bf16"}) {
        const GgufFile f = GgufFile::open(test::shared_path(std::string("models/synth/synth-k256-") + v + ".gguf").string());
        for (const GgufTensor& t : f.tensors()) {
            INFO(v << " " << t.name);
            const GgufTensor& s = src.tensor(t.name);
            std::vector<float> y(static_cast<size_t>(t.n_elements()));
            dequantize_row(t.type, t.data, y.data(), t.n_elements());
            CHECK(std::memcmp(y.data(), s.data, y.size() * sizeof(float)) == 0);
        }
    }
}
