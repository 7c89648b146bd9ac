// The small per-token ops of the model graph on the GPU, bf16 storage and f32 arithmetic:
// the CUDA twins of kernels/cpu/elementwise.h, embedding lookup and greedy sampling.
// Shapes are [rows, cols] row-major with explicit row strides (in elements). Every
// function enqueues on `stream` (capturable) and returns the launch's error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

#include "absl/status/status.h"

namespace cleave::cuda {

struct RmsNormArgs {
  const __nv_bfloat16* x = nullptr;
  int64_t x_stride = 0;
  // When set: residual[r] = x[r] + residual[r] (stored, bf16) and the norm reads that sum
  // (the pre-norm residual stream of a transformer block).
  __nv_bfloat16* residual = nullptr;
  int64_t residual_stride = 0;
  // With residual: x times x_scale first (Granite's residual_multiplier).
  float x_scale = 1.0f;
  // [cols], f32: Gemma's 1 + w (and GGUF files' f32 norms) would lose bits as bf16. Null:
  // out = v unnormed (a layer without a norm before its attention or MLP: OLMo 2).
  const float* weight = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;  // even
  float eps = 1e-6f;
  __nv_bfloat16* out = nullptr;  // may alias x
  int64_t out_stride = 0;
  // Rows per stride: row r is at (r / group) * stride + (r % group) * cols — the heads of
  // one token's projection for per-head q/k norm.
  int64_t group = 1;
  // A row split over tensor-parallel ranks (Q's heads normed together: OLMo 2, MiniMax-M2)
  // takes two calls around an all-reduce of the sums. When `squares_out` is set, the call
  // only writes each row's sum of v^2 there ([rows] f32). When `squares` is set, the row's
  // mean square is squares[r] / norm_cols (the sum over the whole row, every rank's part)
  // rather than its own.
  float* squares_out = nullptr;
  const float* squares = nullptr;
  int64_t norm_cols = 0;
};
// out[r] = v / sqrt(mean(v^2) + eps) * weight, v = x[r] (or the new residual[r]). Per-head
// q/k norm is the same op over rows = tokens * heads, cols = head_dim, group = heads.
absl::Status rmsNorm(const RmsNormArgs& args, cudaStream_t stream);

// out[r][i] = silu(gate[r][i]) * up[r][i]; cols even, out may alias gate.
absl::Status siluMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                     int64_t rows, int64_t cols, __nv_bfloat16* out, int64_t out_stride,
                     cudaStream_t stream);

// out[r][i] = gelu(gate[r][i]) * up[r][i], GELU's tanh form (Gemma); cols even, out may
// alias gate.
absl::Status geluTanhMul(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t in_stride,
                         int64_t rows, int64_t cols, __nv_bfloat16* out, int64_t out_stride,
                         cudaStream_t stream);

// x[i] *= factor for `count` values (Gemma's embeddings times √hidden; Granite's logits).
absl::Status scale(__nv_bfloat16* x, int64_t count, float factor, cudaStream_t stream);
absl::Status scale(float* x, int64_t count, float factor, cudaStream_t stream);

// x[i] = cap · tanh(x[i] / cap) for `count` values (Gemma's logit soft cap); cap > 0.
absl::Status softCap(float* x, int64_t count, float cap, cudaStream_t stream);

// out[t] = table[ids[t]] (table [vocab][cols], cols a multiple of 8). Ids are checked
// before they reach the GPU; an id outside [0, vocab) gives a row of NaN.
absl::Status embed(const int32_t* ids, int64_t tokens, const __nv_bfloat16* table, int64_t vocab,
                   int64_t cols, __nv_bfloat16* out, int64_t out_stride, cudaStream_t stream);

// A vocab-parallel shard's lookup: table holds rows [row_begin, row_begin + rows); a token
// whose id is another shard's gets a row of zeros (the shards' rows then sum to the lookup).
absl::Status embedShard(const int32_t* ids, int64_t tokens, const __nv_bfloat16* table,
                        int64_t row_begin, int64_t rows, int64_t cols, __nv_bfloat16* out,
                        int64_t out_stride, cudaStream_t stream);

// ids[r] = the index of the largest logits[r][i], the lowest index among equals.
absl::Status argmax(const float* logits, int64_t stride, int64_t rows, int64_t vocab, int32_t* ids,
                    cudaStream_t stream);

// Slices of columns laid one after another, slice k holding `slice_rows` rows of widths[k]
// columns (what an all-gather of vocabulary-parallel logits leaves), put side by side:
// out[r][w_0 + ... + w_{k-1} + i] = slice k's [r][i] for the first `rows` rows (rows <=
// slice_rows); out's stride is the widths' sum. float data; out must not overlap slices.
absl::Status joinColumnSlices(const float* slices, std::span<const int64_t> widths,
                              int64_t slice_rows, int64_t rows, float* out, cudaStream_t stream);

// data[i] = uniform in [low, high) from a hash of (seed, i), rounded to bf16 (or f32):
// random weights for benchmarks without host traffic.
absl::Status fillUniform(__nv_bfloat16* data, int64_t count, float low, float high, uint64_t seed,
                         cudaStream_t stream);
absl::Status fillUniform(float* data, int64_t count, float low, float high, uint64_t seed,
                         cudaStream_t stream);

}  // namespace cleave::cuda
