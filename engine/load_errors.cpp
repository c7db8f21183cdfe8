#include "engine/load_errors.h"

#include "engine/memory_budget.h"

namespace tern {

MemoryShortfallError::MemoryShortfallError(const MemoryShortfall& s)
    : RuntimeFailure(describe_memory_shortfall(s)), shortfall(s) {}

KvHeadDimsUnfit::KvHeadDimsUnfit(KvType type_, int64_t block_, int64_t head_dim_, int64_t head_dim_v_)
    : UsageError("KV type " + std::string(kv_type_name(type_)) + " needs head dimensions that are multiples of " +
                 std::to_string(block_) + ", this model has " + std::to_string(head_dim_) + " (K) and " +
                 std::to_string(head_dim_v_) + " (V)"),
      type(type_), block(block_), head_dim(head_dim_), head_dim_v(head_dim_v_) {}

KvAllocationFailed::KvAllocationFailed(int32_t n_ctx_)
    : RuntimeFailure("out of memory allocating the KV cache for " + std::to_string(n_ctx_) + " positions"),
      n_ctx(n_ctx_) {}

} // namespace tern
