#pragma once
// Which K/V a model run produces, as one 64-bit value: the on-disk prefix cache keys its entries
// with it, so K/V made by another file, KV format or kernel family are never restored.
#include <cstdint>
#include <string>

#include "engine/backend.h"

namespace tern {

struct Model;

// Bumped whenever a change to tern's forward changes K/V bytes: older entries then stop matching
// instead of being restored next to freshly computed positions.
inline constexpr uint32_t kKvNumericsVersion = 1;

// XXH3-64 of everything that decides a position's K/V bytes:
// - the GGUF header and tensor table (metadata, names, shapes, types, offsets), the file size and
//   the first bytes of every tensor's data (two files that differ only in weights, e.g. two
//   random-weight models of one shape, still differ there);
// - the derived rope parameters (per-layer base and scale, rotated dims, style);
// - the KV type, exact_matmul (CpuOptions), the device ("cpu", "cuda:0") and, on the CPU, the
//   instruction sets the kernels dispatch on (AVX2 and AVX-512 kernels round differently);
// - kKvNumericsVersion.
// Not the context size nor the thread count: the K/V of a position do not depend on them.
struct KvProducer {
    KvType kv_type = KvType::f16;
    bool exact_matmul = false;
    DeviceKind device = DeviceKind::cpu;
    std::string device_name = "cpu";   // Backend::device_name()
    // LongRoPE's long factors in use (ModelConfig::rope_long_factors of the context): keys made with the
    // short ones are another model's. Hashed only when set, so other models keep their identities.
    bool rope_long_factors = false;
};
uint64_t model_identity(const Model& model, const KvProducer& producer);

} // namespace tern
