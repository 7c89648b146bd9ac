// The variants the attention kernels are compiled for — head sizes and KV-cache element
// types — and the one place runtime values become template arguments.
#pragma once

#include <string>
#include <type_traits>

#include "absl/status/status.h"

namespace cleave::cuda {

// Element type of a KV cache on the GPU.
enum class KvDtype {
  kBf16,
  kFp8E4M3,  // one byte, with a per-tensor scale for K and for V (value = stored x scale)
};

inline constexpr const char* kHeadDims = "16, 32, 64, 128";

// Calls fn(std::integral_constant<int, D>{}, std::bool_constant<fp8>{}) for head_dim D in
// kHeadDims and the cache type; InvalidArgument naming `op` for another head_dim.
template <typename Fn>
absl::Status withAttentionVariant(int head_dim, KvDtype kv, const char* op, Fn&& fn) {
  auto withKv = [&](auto d) {
    return kv == KvDtype::kFp8E4M3 ? fn(d, std::true_type{}) : fn(d, std::false_type{});
  };
  switch (head_dim) {
    case 16: return withKv(std::integral_constant<int, 16>{});
    case 32: return withKv(std::integral_constant<int, 32>{});
    case 64: return withKv(std::integral_constant<int, 64>{});
    case 128: return withKv(std::integral_constant<int, 128>{});
  }
  return absl::InvalidArgumentError(std::string(op) + ": head_dim " + std::to_string(head_dim) +
                                    " (supported: " + kHeadDims + ")");
}

}  // namespace cleave::cuda
