// Matrix products against stored weights: the linear layers of every model.
//
//   y[t][n] = sum_k W[n][k] * x[t][k]     for t < tokens, n < W.rows
//
// W has `rows` output features, each a row of `cols` input features stored one after
// another in its format (GGUF block formats Q4_0, Q4_1, Q8_0 — consumed directly, with x
// quantized per block to int8 — or F32, F16, BF16). x is [tokens, cols] with row stride
// ldx; y is [tokens, rows] with row stride ldy. Rows are spread over the pool's threads;
// each weight byte is read once per call whatever the number of tokens.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "common/model/tensor_type.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

namespace cleave::cpu {

struct WeightMatrix {
  model::TensorType type = model::TensorType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;  // rows * rowBytes() bytes.
  int64_t rowBytes() const;
};

struct MatmulArgs {
  const WeightMatrix* weight = nullptr;
  const float* x = nullptr;
  int64_t ldx = 0;
  int64_t tokens = 0;
  float* y = nullptr;
  int64_t ldy = 0;
  // The SIMD path to use; defaults to the best this CPU has.
  Isa isa = bestIsa();
};

// Which weight formats matmul() takes.
bool matmulSupports(model::TensorType type);

// Errors: an unsupported format, cols not a multiple of the format's block, or an ISA the
// CPU lacks. Not thread-safe per pool (see ThreadPool).
absl::Status matmul(const MatmulArgs& args, ThreadPool& pool);

}  // namespace cleave::cpu
