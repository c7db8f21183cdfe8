#pragma once
// The weight formats a family of kernels is instantiated for, named once as a type: the launchers turn the
// run-time GgmlType into the kernel template's argument through it, and their *_supports answer from it, so
// the two cannot disagree.
#include <type_traits>

#include "kernels/cuda/runtime.h"
#include "quant/types.h"

namespace tern::cuda {
inline namespace TERN_CUDA_ABI {

template <GgmlType T> using FormatTag = std::integral_constant<GgmlType, T>;

template <GgmlType... Formats> struct FormatList {
    static constexpr bool contains(GgmlType type) { return ((type == Formats) || ...); }

    // Calls f(FormatTag<type>{}) when type is listed (true); false for the others.
    template <class F> static bool visit(GgmlType type, F&& f) {
        return ((type == Formats ? (f(FormatTag<Formats>{}), true) : false) || ...);
    }
};

} // namespace TERN_CUDA_ABI
} // namespace tern::cuda
