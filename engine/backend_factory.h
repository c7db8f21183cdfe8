#pragma once
// Picks a Backend for a --device value: "auto" (the GPU when one is usable, else the CPU), "cpu",
// "cuda".
#include <memory>
#include <string>
#include <string_view>

#include "engine/backend.h"

namespace tern {

// Throws UsageError for an unknown device or one this build cannot use. When `note` is not null it
// receives a one-line explanation of an automatic choice (empty when there is nothing to say), for
// the app to print on stderr.
std::unique_ptr<Backend> make_backend(std::string_view device, std::string* note = nullptr);

} // namespace tern
