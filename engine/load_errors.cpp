#include "engine/load_errors.h"

#include "engine/memory_budget.h"

namespace tern {
namespace {

// Built by appends: GCC 12 misreads some chains of `std::string + "short literal"` as overlapping
// copies (-Wrestrict).
std::string head_dims_message(KvType type, int64_t block, int64_t head_dim, int64_t head_dim_v) {
    std::string m = "KV type ";
    m += kv_type_name(type);
    m += " needs head dimensions that are multiples of ";
    m += std::to_string(block);
    m += ", this model has ";
    m += std::to_string(head_dim);
    m += " (K) and ";
    m += std::to_string(head_dim_v);
    m += " (V)";
    return m;
}

} // namespace

MemoryShortfallError::MemoryShortfallError(const MemoryShortfall& s)
    : RuntimeFailure(describe_memory_shortfall(s)), shortfall(s) {}

KvHeadDimsUnfit::KvHeadDimsUnfit(KvType type_, int64_t block_, int64_t head_dim_, int64_t head_dim_v_)
    : UsageError(head_dims_message(type_, block_, head_dim_, head_dim_v_)),
      type(type_), block(block_), head_dim(head_dim_), head_dim_v(head_dim_v_) {}

void require_kv_head_dims(KvType type, int64_t head_dim, int64_t head_dim_v) {
    const int64_t block = kv_block_elems(type);
    if (head_dim % block != 0 || head_dim_v % block != 0) throw KvHeadDimsUnfit(type, block, head_dim, head_dim_v);
}

DeviceCannotRun::DeviceCannotRun(std::string device_, std::string reason_)
    : InputError(device_ + " cannot run this model: " + reason_), device(std::move(device_)), reason(std::move(reason_)) {}

KvAllocationFailed::KvAllocationFailed(int32_t n_ctx_)
    : RuntimeFailure("out of memory allocating the KV cache for " + std::to_string(n_ctx_) + " positions"),
      n_ctx(n_ctx_) {}

KvPoolExhausted::KvPoolExhausted(int32_t needed_, int32_t free_)
    : RuntimeFailure("the KV cache has " + std::to_string(free_) + " free pages, " + std::to_string(needed_) +
                     " needed"),
      needed(needed_), free(free_) {}

} // namespace tern
