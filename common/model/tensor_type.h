// Element and block formats of stored weights, shared by GGUF and safetensors, and their
// exact dequantization to float.
//
// GGUF block formats pack `blockElements()` consecutive values of a row into
// `blockBytes()` bytes; a row's length must be a multiple of the block size.
#pragma once

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cleave::model {

// Values of the GGUF ggml_type ids are the enum values; safetensors-only types come after.
enum class TensorType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kBF16 = 30,
  // MXFP4: per 32 elements an E8M0 exponent byte e, then 16 bytes of E2M1 codes (element j in
  // the low nibble of byte j, element 16 + j in its high nibble); value = 2 x e2m1 x
  // 2^(e - 128) (llama.cpp's block_mxfp4).
  kMXFP4 = 39,
  // NVFP4: per 64 elements four UE4M3 scale bytes (one per 16 elements), then 32 bytes of
  // E2M1 codes: sub-block s in bytes 8s..8s+7, element j (< 8) in the low nibble of byte j
  // and element 8 + j in its high nibble; value = 2 x e2m1 x ue4m3(d[s]) / 2 (llama.cpp's
  // block_nvfp4; a per-tensor scale, where a model has one, is not part of the blocks).
  kNVFP4 = 40,
  // Not GGUF types (safetensors dtypes).
  kF8E4M3 = 1000,
  kF8E5M2 = 1001,
  kU8 = 1002,
  kBool = 1003,
  // FP4 E2M1 codes, two per byte, element 2k in the low nibble (NVFP4 weights; the block
  // scales travel separately). A "block" is one byte of two elements.
  kE2M1 = 1004,
  // Signed 4-bit integers stored as value + 8, two per byte, element 2k in the low nibble
  // (compressed-tensors' pack-quantized int32 words read as bytes; the group scales travel
  // separately). A "block" is one byte of two elements.
  kI4 = 1005,
};

struct TensorTypeTraits {
  TensorType type;
  const char* name;         // "Q4_K", "BF16", ...
  uint32_t block_elements;  // 1 for plain element types.
  uint32_t block_bytes;     // Bytes of one block (element size for plain types).
  bool dequantizable;       // dequantize() supports it.
};

// nullopt for an id this build does not know (e.g. an unknown ggml_type in a file).
std::optional<TensorTypeTraits> tensorTypeTraits(TensorType type);
const char* tensorTypeName(TensorType type);

// Bytes needed for `num_elements` values; nullopt if not a whole number of blocks.
std::optional<uint64_t> tensorBytes(TensorType type, uint64_t num_elements);

// Dequantizes `num_elements` values (a whole number of blocks) from `src` into `dst`.
// Exact: equal bit for bit to the reference definitions of each format.
absl::Status dequantize(TensorType type, const uint8_t* src, uint64_t num_elements, float* dst);

// `values` (a multiple of 64) NVFP4 values in GGUF blocks as safetensors checkpoints store
// NVFP4: `codes` gets their E2M1 codes two per byte, element 2k in the low nibble
// (values / 2 bytes), `scales` each 16 values' scale byte as the blocks hold it, unsigned
// e4m3 (values / 16 bytes). The same values: e2m1(code) x ue4m3(scale).
void nvfp4AsE2M1(const uint8_t* blocks, uint64_t values, uint8_t* codes, uint8_t* scales);

}  // namespace cleave::model
