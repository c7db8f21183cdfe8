#include "engine/model_identity.h"

#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <string>

#include "engine/model.h"
#include "kernels/cpu_features.h"

namespace tern {
namespace {

// Bytes of each tensor's data folded in: enough to tell apart files with equal tables.
constexpr size_t kTensorSampleBytes = 256;

struct Hasher {
    std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state{XXH3_createState(), &XXH3_freeState};
    Hasher() { XXH3_64bits_reset(state.get()); }
    void bytes(const void* p, size_t n) { XXH3_64bits_update(state.get(), p, n); }
    template <typename T>
    void value(T v) { bytes(&v, sizeof v); }
    void text(std::string_view s) {
        value<uint64_t>(s.size());
        bytes(s.data(), s.size());
    }
    uint64_t digest() const { return XXH3_64bits_digest(state.get()); }
};

} // namespace

uint64_t model_identity(const Model& model, const KvProducer& producer) {
    Hasher h;
    h.value<uint32_t>(kKvNumericsVersion);
    const GgufFile& f = model.file;
    const std::span<const uint8_t> all = f.bytes();
    h.value<uint64_t>(all.size());
    const size_t header = static_cast<size_t>(std::min<uint64_t>(f.data_offset(), all.size()));
    h.bytes(all.data(), header);
    for (const GgufTensor& t : f.tensors()) {
        const uint8_t* begin = all.data();
        const uint8_t* end = all.data() + all.size();
        if (t.data < begin || t.data >= end) continue;
        h.bytes(t.data, std::min<size_t>({kTensorSampleBytes, static_cast<size_t>(t.n_bytes), static_cast<size_t>(end - t.data)}));
    }

    const ModelConfig& c = model.config;
    h.value<int32_t>(c.n_rot);
    h.value<int32_t>(static_cast<int32_t>(c.rope_style));
    h.value<uint8_t>(c.rope_freq_factors);
    for (const LayerConfig& l : c.layers) {
        h.value<float>(l.rope_base);
        h.value<float>(l.rope_freq_scale);
    }

    if (producer.rope_long_factors) h.text("rope_factors_long");
    h.value<int32_t>(static_cast<int32_t>(producer.kv_type));
    h.value<uint8_t>(producer.exact_matmul);
    h.text(producer.device_name);
    if (producer.device == DeviceKind::cpu) h.text(cpu_features().describe());
    return h.digest();
}

} // namespace tern
