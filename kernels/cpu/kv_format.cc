#include "kernels/cpu/kv_format.h"

#include <cmath>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/model/dequant_kernels.h"

namespace cleave::cpu {

const char* kvTypeName(KvType type) {
  switch (type) {
    case KvType::kF32: return "f32";
    case KvType::kBf16: return "bf16";
    case KvType::kFp8E4M3: return "fp8";
  }
  return "?";
}

absl::StatusOr<KvType> parseKvType(std::string_view name) {
  if (name == "auto") return kDefaultKvType;
  if (name == "f32") return KvType::kF32;
  if (name == "bf16") return KvType::kBf16;
  if (name == "fp8" || name == "fp8_e4m3") return KvType::kFp8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV cache type '", std::string(name), "'; use f32, bf16, fp8 or auto"));
}

uint16_t floatToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // Stays a NaN.
  bits += 0x7FFF + ((bits >> 16) & 1);                                   // Nearest, ties even.
  return static_cast<uint16_t>(bits >> 16);
}

uint8_t floatToE4m3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (std::isnan(x)) return sign | 0x7F;
  if (a >= 448.0f) return sign | 0x7E;  // Saturated: there is no infinity.
  // Below 2^-6 the codes are subnormal: multiples of 2^-9.
  if (a < 0x1p-6f) return sign | static_cast<uint8_t>(std::nearbyint(a * 0x1p9f));
  int exponent = 0;
  const float fraction = std::frexp(a, &exponent);  // a = fraction * 2^exponent, [0.5, 1).
  // Three mantissa bits: a = (8 + m) * 2^(exponent - 4), rounded to nearest even.
  const int scaled = static_cast<int>(std::nearbyint(std::ldexp(fraction, 4)));  // 8..16
  int biased = exponent - 1 + 7;
  int mantissa = scaled - 8;
  if (scaled == 16) ++biased, mantissa = 0;  // Rounded up to the next power of two.
  const int code = (biased << 3) | mantissa;
  return sign | static_cast<uint8_t>(code > 0x7E ? 0x7E : code);
}

void encodeKv(KvType type, const float* x, int64_t n, float scale, void* out) {
  switch (type) {
    case KvType::kF32: std::memcpy(out, x, n * sizeof(float)); return;
    case KvType::kBf16: {
      auto* o = static_cast<uint16_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = floatToBf16(x[i]);
      return;
    }
    case KvType::kFp8E4M3: {
      auto* o = static_cast<uint8_t*>(out);
      for (int64_t i = 0; i < n; ++i) o[i] = floatToE4m3(x[i] / scale);
      return;
    }
  }
}

void decodeKv(KvType type, const void* in, int64_t n, float scale, float* out) {
  switch (type) {
    case KvType::kF32: std::memcpy(out, in, n * sizeof(float)); return;
    case KvType::kBf16: {
      const auto* b = static_cast<const uint16_t*>(in);
      for (int64_t i = 0; i < n; ++i) out[i] = model::dequant::bf16ToFloat(b[i]);
      return;
    }
    case KvType::kFp8E4M3: {
      const auto* b = static_cast<const uint8_t*>(in);
      for (int64_t i = 0; i < n; ++i) out[i] = model::dequant::fp8e4m3ToFloat(b[i]) * scale;
      return;
    }
  }
}

}  // namespace cleave::cpu
