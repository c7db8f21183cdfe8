#pragma once
// Host-side pieces the decode matmuls (kernels/cuda/matmul.cu, matmul_q8.cu) share: their refusals of bad
// arguments, and how n_cols activation columns are shared out over launches.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/runtime.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {
namespace column_passes {

inline constexpr int64_t kMaxGridY = 65535;        // passes one launch holds (grid dimension y)
inline constexpr int64_t kIntMax = 2147483647;     // the kernels' offsets are 32-bit

[[noreturn]] inline void refuse(const std::string& what) { throw std::invalid_argument("tern::cuda::" + what); }

inline void check_aligned(const char* fn, const void* p, const char* name) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) refuse(std::string(fn) + ": " + name + " is not 16-byte aligned");
}

// Calls launch(std::integral_constant<int, NC>{}, first column, passes) to cover n_cols columns: passes of
// kMaxColumns columns, at most kMaxGridY a launch, then one pass of the n_cols % kMaxColumns left over.
template <int kMaxColumns, class Launch> void for_each_launch(int64_t n_cols, Launch&& launch) {
    const int64_t full = n_cols / kMaxColumns;
    for (int64_t done = 0; done < full;) {
        const int64_t passes = full - done < kMaxGridY ? full - done : kMaxGridY;
        launch(std::integral_constant<int, kMaxColumns>{}, done * kMaxColumns, static_cast<unsigned>(passes));
        done += passes;
    }
    const int64_t first = full * kMaxColumns;
    const int rest = static_cast<int>(n_cols % kMaxColumns);
    [&]<int... NC>(std::integer_sequence<int, NC...>) {
        ((rest == NC + 1 ? launch(std::integral_constant<int, NC + 1>{}, first, 1u) : void()), ...);
    }(std::make_integer_sequence<int, kMaxColumns - 1>{});
}

} // namespace column_passes
} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
