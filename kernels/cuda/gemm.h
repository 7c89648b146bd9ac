// Dense matrix products through cuBLASLt: the linear layers on the GPU.
//
//   y[t][n] = sum_k x[t][k] * w[n][k] (+ bias[n])     t < tokens, n < out, k < in
//
// x [tokens][in] and w [out][in] are bf16, row-major (w as checkpoints store it); y is
// bf16 or f32 [tokens][out]. Strides are in elements. Accumulation is f32.
//
// cuBLASLt picks an algorithm per shape; Gemm plans each (tokens, out, in, output type)
// once, on first use — run every shape a CUDA graph will capture once before capturing.
//
// Threading: one thread uses a Gemm (each rank thread has its own).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"

namespace cleave::cuda {

struct GemmArgs {
  const __nv_bfloat16* x = nullptr;
  int64_t x_stride = 0;
  const __nv_bfloat16* w = nullptr;     // [out][in], rows contiguous
  const __nv_bfloat16* bias = nullptr;  // [out] or null
  int64_t tokens = 0;
  int64_t out = 0;
  int64_t in = 0;
  void* y = nullptr;
  int64_t y_stride = 0;
  bool y_float = false;  // f32 output (logits) instead of bf16
  // `batch` independent products in one call (no bias): product b reads x + b * x_batch,
  // w + b * w_batch and writes y + b * y_batch (strides in elements) — e.g. one small
  // matrix per attention head.
  int batch = 1;
  int64_t x_batch = 0, w_batch = 0, y_batch = 0;
};

struct CublasLt;

class Gemm {
 public:
  // A cuBLASLt handle and `workspace_bytes` of device workspace for its algorithms.
  static absl::StatusOr<std::unique_ptr<Gemm>> create(size_t workspace_bytes = 32 << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // Enqueues the product on `stream`. Errors name the shape cuBLASLt refused.
  absl::Status run(const GemmArgs& args, cudaStream_t stream);

 private:
  struct Plan;
  Gemm() = default;
  absl::StatusOr<Plan*> plan(const GemmArgs& args);

  const CublasLt* lt_ = nullptr;  // cublaslt_library.h
  void* handle_ = nullptr;        // cublasLtHandle_t
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  // (tokens, out, in, strides, bias, output type, batch and its strides, operand
  // alignments) -> plan
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool, int, int64_t,
                      int64_t, int64_t, uint32_t>,
           std::unique_ptr<Plan>>
      plans_;
};

}  // namespace cleave::cuda
