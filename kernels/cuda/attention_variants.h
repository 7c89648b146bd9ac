// The variants the attention kernels are compiled for — head sizes and KV-cache element
// types — and the one place runtime values become template arguments.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "absl/status/status.h"

namespace cleave::cuda {

// Element type of a KV cache on the GPU.
enum class KvDtype {
  kBf16,
  kFp8E4M3,  // one byte, with a per-tensor scale for K and for V (value = stored x scale)
};

inline constexpr const char* kHeadDims = "16, 32, 64, 128, 256";

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
    case 256: return withKv(std::integral_constant<int, 256>{});
  }
  return absl::InvalidArgumentError(std::string(op) + ": head_dim " + std::to_string(head_dim) +
                                    " (supported: " + kHeadDims + ")");
}

// The shape rules both attention kernels share: pages of a power-of-two size, query heads
// a multiple of the KV heads. InvalidArgument naming `op` and the field otherwise.
inline absl::Status checkHeadsAndPages(const char* op, int heads, int kv_heads, int block_size) {
  if (block_size < 1 || (block_size & (block_size - 1)) != 0)
    return absl::InvalidArgumentError(std::string(op) + ": block_size " +
                                      std::to_string(block_size) + " is not a power of two");
  if (kv_heads < 1 || heads < kv_heads || heads % kv_heads != 0)
    return absl::InvalidArgumentError(std::string(op) + ": heads " + std::to_string(heads) +
                                      " is not a multiple of kv_heads " + std::to_string(kv_heads));
  return absl::OkStatus();
}

// The attention kernels copy 16-byte chunks: q, its row stride (in bf16 elements) and the
// caches must be 16-byte aligned. InvalidArgument naming `op` otherwise.
inline absl::Status checkAlignment(const char* op, const void* q, int64_t q_stride,
                                   const void* k_cache, const void* v_cache) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!aligned(q) || q_stride % 8 != 0 || !aligned(k_cache) || !aligned(v_cache))
    return absl::InvalidArgumentError(
        std::string(op) +
        ": q, the caches and q_stride must be 16-byte aligned (stride a "
        "multiple of 8 elements)");
  return absl::OkStatus();
}

}  // namespace cleave::cuda
