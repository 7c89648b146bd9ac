#include "common/model/tensor_type.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/model/dequant_kernels.h"

namespace cleave::model {
namespace {

using Kernel = void (*)(const uint8_t*, float*, size_t);

struct Entry {
  TensorTypeTraits traits;
  Kernel kernel;  // Block formats; plain types are handled in dequantize().
};

constexpr Entry kTypes[] = {
    {{TensorType::kF32, "F32", 1, 4, true}, nullptr},
    {{TensorType::kF16, "F16", 1, 2, true}, nullptr},
    {{TensorType::kBF16, "BF16", 1, 2, true}, nullptr},
    {{TensorType::kF64, "F64", 1, 8, true}, nullptr},
    {{TensorType::kQ4_0, "Q4_0", 32, 18, true}, dequant::q4_0},
    {{TensorType::kQ4_1, "Q4_1", 32, 20, true}, dequant::q4_1},
    {{TensorType::kQ5_0, "Q5_0", 32, 22, true}, dequant::q5_0},
    {{TensorType::kQ5_1, "Q5_1", 32, 24, true}, dequant::q5_1},
    {{TensorType::kQ8_0, "Q8_0", 32, 34, true}, dequant::q8_0},
    {{TensorType::kQ8_1, "Q8_1", 32, 36, false}, nullptr},
    {{TensorType::kQ2_K, "Q2_K", 256, 84, false}, nullptr},
    {{TensorType::kQ3_K, "Q3_K", 256, 110, false}, nullptr},
    {{TensorType::kQ4_K, "Q4_K", 256, 144, true}, dequant::q4_K},
    {{TensorType::kQ5_K, "Q5_K", 256, 176, true}, dequant::q5_K},
    {{TensorType::kQ6_K, "Q6_K", 256, 210, true}, dequant::q6_K},
    {{TensorType::kQ8_K, "Q8_K", 256, 292, true}, dequant::q8_K},
    {{TensorType::kMXFP4, "MXFP4", 32, 17, true}, dequant::mxfp4},
    {{TensorType::kNVFP4, "NVFP4", 64, 36, true}, dequant::nvfp4},
    {{TensorType::kI8, "I8", 1, 1, true}, nullptr},
    {{TensorType::kI16, "I16", 1, 2, true}, nullptr},
    {{TensorType::kI32, "I32", 1, 4, true}, nullptr},
    {{TensorType::kI64, "I64", 1, 8, true}, nullptr},
    {{TensorType::kF8E4M3, "F8_E4M3", 1, 1, true}, nullptr},
    {{TensorType::kF8E5M2, "F8_E5M2", 1, 1, true}, nullptr},
    {{TensorType::kU8, "U8", 1, 1, true}, nullptr},
    {{TensorType::kBool, "BOOL", 1, 1, true}, nullptr},
    {{TensorType::kE2M1, "E2M1", 2, 1, true}, dequant::e2m1},
    {{TensorType::kI4, "I4", 2, 1, true}, dequant::i4},
};

const Entry* findEntry(TensorType type) {
  for (const Entry& entry : kTypes) {
    if (entry.traits.type == type) return &entry;
  }
  return nullptr;
}

template <typename T>
void convert(const uint8_t* src, uint64_t n, float* dst, float (*one)(T)) {
  for (uint64_t i = 0; i < n; ++i) {
    T value;
    std::memcpy(&value, src + i * sizeof(T), sizeof(T));
    dst[i] = one(value);
  }
}

template <typename T>
void widen(const uint8_t* src, uint64_t n, float* dst) {
  convert<T>(src, n, dst, [](T v) { return static_cast<float>(v); });
}

}  // namespace

std::optional<TensorTypeTraits> tensorTypeTraits(TensorType type) {
  const Entry* entry = findEntry(type);
  if (entry == nullptr) return std::nullopt;
  return entry->traits;
}

const char* tensorTypeName(TensorType type) {
  const Entry* entry = findEntry(type);
  return entry ? entry->traits.name : "unknown";
}

std::optional<uint64_t> tensorBytes(TensorType type, uint64_t num_elements) {
  const Entry* entry = findEntry(type);
  if (entry == nullptr || num_elements % entry->traits.block_elements != 0) return std::nullopt;
  uint64_t blocks = num_elements / entry->traits.block_elements;
  if (blocks > UINT64_MAX / entry->traits.block_bytes) return std::nullopt;
  return blocks * entry->traits.block_bytes;
}

void nvfp4AsE2M1(const uint8_t* blocks, uint64_t values, uint8_t* codes, uint8_t* scales) {
  for (uint64_t b = 0; b < values / 64; ++b, blocks += 36) {
    for (int s = 0; s < 4; ++s) {
      *scales++ = blocks[s];
      // Sub-block s: element j (< 8) in the low nibble of qs[j], 8 + j in its high nibble.
      const uint8_t* qs = blocks + 4 + 8 * s;
      auto code = [&](int e) { return e < 8 ? qs[e] & 0x0f : qs[e - 8] >> 4; };
      for (int k = 0; k < 8; ++k)
        *codes++ = static_cast<uint8_t>(code(2 * k) | code(2 * k + 1) << 4);
    }
  }
}

absl::Status dequantize(TensorType type, const uint8_t* src, uint64_t n, float* dst) {
  const Entry* entry = findEntry(type);
  if (entry == nullptr || !entry->traits.dequantizable) {
    return absl::UnimplementedError(
        absl::StrCat("dequantization of ", tensorTypeName(type), " is not supported"));
  }
  if (n % entry->traits.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(n, " elements is not a whole number of ",
                                                   entry->traits.name, " blocks of ",
                                                   entry->traits.block_elements));
  }
  if (entry->kernel != nullptr) {
    entry->kernel(src, dst, n / entry->traits.block_elements);
    return absl::OkStatus();
  }
  switch (type) {
    case TensorType::kF32: std::memcpy(dst, src, n * 4); break;
    case TensorType::kF16: convert<uint16_t>(src, n, dst, dequant::halfToFloat); break;
    case TensorType::kBF16: convert<uint16_t>(src, n, dst, dequant::bf16ToFloat); break;
    case TensorType::kF64: widen<double>(src, n, dst); break;
    case TensorType::kF8E4M3: convert<uint8_t>(src, n, dst, dequant::fp8e4m3ToFloat); break;
    case TensorType::kF8E5M2: convert<uint8_t>(src, n, dst, dequant::fp8e5m2ToFloat); break;
    case TensorType::kI8: widen<int8_t>(src, n, dst); break;
    case TensorType::kI16: widen<int16_t>(src, n, dst); break;
    case TensorType::kI32: widen<int32_t>(src, n, dst); break;
    case TensorType::kI64: widen<int64_t>(src, n, dst); break;
    case TensorType::kU8:
    case TensorType::kBool: widen<uint8_t>(src, n, dst); break;
    default: return absl::InternalError(absl::StrCat("no conversion for ", entry->traits.name));
  }
  return absl::OkStatus();
}

}  // namespace cleave::model
