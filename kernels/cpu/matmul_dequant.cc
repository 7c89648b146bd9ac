// The fallback for weight formats without a dedicated kernel: dequantize one row into a
// per-thread buffer (exact, model/tensor_type.h; times its scales for FP8 and E2M1), then one
// dot product per token. Correct
// everywhere, and the formats' bytes are still read only once per call.
#include <algorithm>
#include <vector>

#include "common/log.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_kernels.h"
#include "kernels/cpu/vector_ops.h"

namespace cleave::cpu {

absl::Status dequantizeRows(const WeightMatrix& w, int64_t row_begin, int64_t row_end, float* out) {
  if (w.data == nullptr) {
    return absl::FailedPreconditionError(
        "the weights are kept only in the CPU kernels' packed layout (CpuMatrix::dropSource)");
  }
  const BlockScales& s = w.scales;
  for (int64_t n = row_begin; n < row_end; ++n) {
    float* row = out + (n - row_begin) * w.cols;
    if (absl::Status status = model::dequantize(w.type, w.data + n * w.rowBytes(), w.cols, row);
        !status.ok())
      return status;
    if (s.data != nullptr) {
      // Block by block: one division per block, not per element.
      const float* scale = s.data + ((s.row_offset + n) / s.block_rows) * s.cols;
      for (int64_t c = 0; c < w.cols;) {
        const int64_t block = (s.col_offset + c) / s.block_cols;
        const int64_t end = std::min(w.cols, (block + 1) * s.block_cols - s.col_offset);
        const float factor = scale[block];
        for (; c < end; ++c) row[c] = (row[c] * factor) * s.global;
      }
    }
  }
  return absl::OkStatus();
}

namespace kernels {

void dequantizedRows(const FloatRows& a) {
  const WeightMatrix& w = *a.weight;
  thread_local std::vector<float> row;
  row.resize(w.cols);
  for (int64_t n = a.row_begin; n < a.row_end; ++n) {
    CLEAVE_CHECK_OK(dequantizeRows(w, n, n + 1, row.data()));
    for (int64_t t = 0; t < a.tokens; ++t)
      a.y[t * a.ldy + n] = dot(row.data(), a.x + t * a.ldx, w.cols);
  }
}

}  // namespace kernels
}  // namespace cleave::cpu
