// The head sizes the attention kernels are compiled for, and the one place a runtime
// head_dim becomes a template argument.
#pragma once

#include <string>
#include <type_traits>

#include "absl/status/status.h"

namespace cleave::cuda {

inline constexpr const char* kHeadDims = "16, 32, 64, 128";

// Calls fn(std::integral_constant<int, D>{}) for head_dim D in kHeadDims; InvalidArgument
// naming `op` otherwise.
template <typename Fn>
absl::Status withHeadDim(int head_dim, const char* op, Fn&& fn) {
  switch (head_dim) {
    case 16: return fn(std::integral_constant<int, 16>{});
    case 32: return fn(std::integral_constant<int, 32>{});
    case 64: return fn(std::integral_constant<int, 64>{});
    case 128: return fn(std::integral_constant<int, 128>{});
  }
  return absl::InvalidArgumentError(std::string(op) + ": head_dim " + std::to_string(head_dim) +
                                    " (supported: " + kHeadDims + ")");
}

}  // namespace cleave::cuda
