// The element types a paged KV cache can store, and the conversions between them and the
// float rows the model computes. The model encodes each new key and value row as it is
// written; attention (attention.h) decodes as it reads.
//
//   kF32      4 bytes, as computed.
//   kBf16     2 bytes, rounded to nearest even.
//   kFp8E4M3  1 byte, OCP E4M3 ("e4m3fn": no infinities, S.1111.111 is NaN), value =
//             code x scale with one scale per layer for the keys and one for the values;
//             encoding rounds to nearest even and saturates at +-448 (NaN stays NaN).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace cleave::cpu {

enum class KvType { kF32, kBf16, kFp8E4M3 };

constexpr int64_t kvElementBytes(KvType type) {
  return type == KvType::kF32 ? 4 : type == KvType::kBf16 ? 2 : 1;
}
// The cache type a worker stores unless told otherwise ("auto"): bf16 halves f32's bytes (twice
// the sequences in a KV budget, half the bytes decode attention reads) and is what the GPU
// stores, so CPU and GPU workers agree by default.
constexpr KvType kDefaultKvType = KvType::kBf16;

// "f32", "bf16", "fp8" (or "fp8_e4m3").
const char* kvTypeName(KvType type);
// Those names, and "auto" for kDefaultKvType; InvalidArgument naming the accepted names
// otherwise.
absl::StatusOr<KvType> parseKvType(std::string_view name);

// out[i] = encode(x[i] / scale) for n elements (scale is ignored unless kFp8E4M3).
void encodeKv(KvType type, const float* x, int64_t n, float scale, void* out);
// out[i] = decode(in[i]) * scale (scale is ignored unless kFp8E4M3).
void decodeKv(KvType type, const void* in, int64_t n, float scale, float* out);

uint16_t floatToBf16(float x);
uint8_t floatToE4m3(float x);

}  // namespace cleave::cpu
