#pragma once
// Errors of opening a model that carry their numbers, so the app can word the remedy with the
// flags that set them (the engine names no flags). Each what() is a complete, flag-free line.
#include <cstdint>
#include <string>

#include "base/error.h"
#include "engine/memory_need.h"
#include "kernels/kv_format.h"

namespace tern {

// Model + context do not fit what the device can give (engine/memory_budget.h); exit 3.
struct MemoryShortfallError : RuntimeFailure {
    explicit MemoryShortfallError(const MemoryShortfall& s);
    MemoryShortfall shortfall;
};

// A block KV format (kernels/kv_format.h) and head dims that are not whole blocks; exit 1.
struct KvHeadDimsUnfit : UsageError {
    KvHeadDimsUnfit(KvType type, int64_t block, int64_t head_dim, int64_t head_dim_v);
    KvType type;
    int64_t block, head_dim, head_dim_v;
};
// Throws KvHeadDimsUnfit unless rows of head_dim and head_dim_v are whole blocks of the KV format: the one
// check every KV cache (CPU, CUDA) and the CUDA backend's load make.
void require_kv_head_dims(KvType type, int64_t head_dim, int64_t head_dim_v);

// The KV cache of n_ctx positions could not be allocated; exit 3.
struct KvAllocationFailed : RuntimeFailure {
    explicit KvAllocationFailed(int32_t n_ctx);
    int32_t n_ctx;
};

// Every page slot of a paged KV cache is taken (engine/kv_pages.h): a batching engine preempts a sequence,
// a single sequence has reached the context it was given. Runtime failure, exit 3 if it ever escapes.
struct KvPoolExhausted : RuntimeFailure {
    KvPoolExhausted(int32_t needed, int32_t free);
    int32_t needed, free;
};

// A model the chosen device's kernels cannot run: a weight format or a shape they lack (the CPU runs it).
// `--device auto` then runs on the CPU; an explicit device is an input error the app words with its flag.
struct DeviceCannotRun : InputError {
    DeviceCannotRun(std::string device, std::string reason);
    std::string device, reason;
};

} // namespace tern
