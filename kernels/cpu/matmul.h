// Matrix products against stored weights: the linear layers of every model.
//
//   y[t][n] = sum_k W[n][k] * x[t][k]     for t < tokens, n < W.rows
//
// W has `rows` output features, each a row of `cols` input features. It arrives in its
// stored format (WeightMatrix: GGUF block formats Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K,
// Q6_K, MXFP4, NVFP4, or F32, F16, BF16, or FP8 E4M3 or FP4 E2M1 codes with their scales) and is
// turned once, at load, into a CpuMatrix for an int8 kernel where one fits: Q4_K is rewritten as
// Q4_1 blocks, and Q5_0, Q5_1, Q5_K and Q6_K are requantized to Q8_0 (but for Q6_K on
// AVX-512, whose kernel reads it as it is); Q4_0, Q4_1, Q8_0 and Q6_K are repacked
// row-interleaved for the AVX2 and AVX-512 kernels (packed_layout.h: the same codes and scales
// rearranged, nothing dequantized). NVFP4 (GGUF blocks, or E2M1 codes with a scale per 16
// elements of a row) is packed for every path, the portable one too. Other FP8 and E2M1
// are dequantized a row at a time; other cases use the stored bytes in place. Quantized weights
// multiply x quantized per 32-element block to int8. x is [tokens, cols] with row stride ldx; y is
// [tokens, rows] with row stride ldy. Rows are spread over the pool's threads; each weight
// byte is read once per call whatever the number of tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/tensor_type.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

namespace cleave::cpu {

// The scales of an FP8 or NVFP4 weight (model/quantization.h): element (r, c) is
//   (code(r, c) * data[((row_offset + r) / block_rows) * cols + (col_offset + c) / block_cols])
//   * global
// The offsets place a slice of a matrix (a tensor-parallel shard) in its whole matrix's
// scale grid of `cols` columns.
struct BlockScales {
  const float* data = nullptr;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  int64_t cols = 0;
  int64_t row_offset = 0;
  int64_t col_offset = 0;
  float global = 1.0f;
  // With block_rows 1 and col_offset a multiple of block_cols: the scale of the slice's row
  // `row`, columns [group * block_cols, (group + 1) * block_cols) (global not applied).
  float rowGroup(int64_t row, int64_t group) const {
    return data[(row_offset + row) * cols + col_offset / block_cols + group];
  }
};

struct WeightMatrix {
  model::TensorType type = model::TensorType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;  // rows * rowBytes() bytes.
  BlockScales scales;             // Set for (and only for) FP8 and E2M1 weights.
  int64_t rowBytes() const;
};

// Whether `w` is NVFP4 as checkpoints store it — E2M1 codes, a scale per 16 elements of a row
// — starting on a scale group and spanning whole 32-element blocks: what the int8 kernels
// pack as NVFP4 (and the GPU's NVFP4 kernels take).
bool isNvfp4Rows(const WeightMatrix& w);

// The backend's form of a weight matrix for one ISA. Threading: immutable after create().
class CpuMatrix {
 public:
  // Fails for formats matmul() does not take, a column count that is not a whole number of
  // blocks, or an ISA this CPU lacks. `source.data` must outlive this: packed or not, it is
  // what source() hands another backend (dequantizeRows) when it makes its own copy
  // (unless dropSource()).
  static absl::StatusOr<CpuMatrix> create(const WeightMatrix& source, Isa isa = bestIsa());
  // The same, for `source.data` held by `owner`: kept alive as long as this reads it.
  static absl::StatusOr<CpuMatrix> create(const WeightMatrix& source,
                                          std::shared_ptr<const void> owner, Isa isa = bestIsa());
  // The same checks, but kept as stored: not rewritten or packed for the int8 kernels (no
  // copy, no time spent), for a matrix another backend makes its own copy of. Its products
  // still run, slowly: quantized rows a row at a time, or dequantized.
  static absl::StatusOr<CpuMatrix> asStored(const WeightMatrix& source,
                                            std::shared_ptr<const void> owner);

  const WeightMatrix& source() const { return source_; }
  // For a packed matrix whose source no other backend will upload (one the loader made, not a
  // mapped file): releases the source (and its owner), so only the packed copy stays in
  // memory. source() then keeps its shape and type but no data, which dequantizeRows refuses.
  // Unpacked, nothing changes (the kernels read the source).
  void dropSource();
  model::TensorType type() const { return source_.type; }
  // What the kernels read: the source, or a rewrite of it in a format they run faster (Q4_K
  // as Q4_1 blocks, the same codes with each sub-block's scale and offset in half). Packed
  // (AVX2, AVX-512), the kernels read packedData(), and a rewrite's data is gone (null).
  const WeightMatrix& kernelSource() const { return kernel_; }
  model::TensorType kernelType() const { return kernel_.type; }
  int64_t rows() const { return source_.rows; }
  int64_t cols() const { return source_.cols; }
  Isa isa() const { return isa_; }
  bool packed() const { return packed_ != nullptr; }
  const uint8_t* packedData() const { return packed_.get(); }
  // Bytes one product streams from memory.
  int64_t bytes() const;
  // Whether products multiply activations rounded to int8 (an int8 kernel), at the int8
  // peak, rather than floats.
  bool multipliesInt8() const;
  // Whether products multiply activations rounded to bf16 on the CPU's bf16 dot products
  // (BF16 weights where bf16DotsChosen()), at the bf16 peak, rather than float FMAs, as
  // vLLM and llama.cpp multiply bf16 weights.
  bool multipliesBf16() const;

 private:
  WeightMatrix source_;
  WeightMatrix kernel_;                              // source_, or its rewrite (kernelSource()).
  std::shared_ptr<std::vector<uint8_t>> rewritten_;  // Holds kernel_.data when rewritten.
  Isa isa_ = Isa::kPortable;
  std::shared_ptr<uint8_t> packed_;  // On huge pages (huge_pages.h).
  // Float weights' copy on huge pages that kernel_.data points at (the SIMD paths).
  std::shared_ptr<uint8_t> resident_;
  int64_t packed_bytes_ = 0;
  std::shared_ptr<const void> owner_;  // Holds source_.data when it is not the caller's.
};

// Whether BF16 weights multiply on AVX-512 BF16 dot products (VDPBF16PS: 32 bf16 pairs an
// instruction, the activations rounded to bf16) rather than on float FMAs: where the CPU has
// them and their rate, measured once on one thread, is at least 1.25x the FMAs' (twice on
// Zen 4 and 5; half on some Xeons, where the FMAs stay). CLEAVE_CPU_BF16=1 or 0 decides
// instead (for tests and for comparing paths on one machine; other values are ignored).
bool bf16DotsChosen();

struct MatmulArgs {
  const CpuMatrix* weight = nullptr;
  const float* x = nullptr;
  int64_t ldx = 0;
  int64_t tokens = 0;
  float* y = nullptr;
  int64_t ldy = 0;
};

// Rows [row_begin, row_end) of `weight` as floats ([rows][cols] into `out`), block scales
// applied: what another backend uploads when it keeps its own copy of the weights.
absl::Status dequantizeRows(const WeightMatrix& weight, int64_t row_begin, int64_t row_end,
                            float* out);

// Which weight formats matmul() takes.
bool matmulSupports(model::TensorType type);

// Not thread-safe per pool (see ThreadPool).
absl::Status matmul(const MatmulArgs& args, ThreadPool& pool);
// Up to 8 products of the same activations (one x, ldx and tokens; weights of equal cols: a
// layer's Q, K and V, or its gate and up), the same bits as one matmul() each: the activations
// are quantized once, and every product's rows share one pool job. InvalidArgument if the
// products do not share their input.
absl::Status matmulsOfOneInput(std::span<const MatmulArgs> products, ThreadPool& pool);

}  // namespace cleave::cpu
