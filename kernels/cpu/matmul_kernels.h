// Per-ISA row kernels behind matmul(). Each computes y[t][n] for rows [row_begin, row_end)
// and every token. Internal to cleave_kernels_cpu.
#pragma once

#include <cstdint>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantized_activations.h"

namespace cleave::cpu::kernels {

struct QuantRows {
  const WeightMatrix* weight;
  const QuantizedActivations* x;
  float* y;
  int64_t ldy;
  int64_t row_begin;
  int64_t row_end;
};

struct PackedRows {
  const CpuMatrix* weight;  // packed()
  const QuantizedActivations* x;
  float* y;
  int64_t ldy;
  int64_t group_begin;  // Groups of packed::kGroupRows rows.
  int64_t group_end;
};

struct FloatRows {
  const WeightMatrix* weight;
  const float* x;
  int64_t ldx;
  int64_t tokens;
  float* y;
  int64_t ldy;
  int64_t row_begin;
  int64_t row_end;
};

// Quantized weights (Q4_0, Q4_1, Q8_0) against quantized activations.
void quantRowsPortable(const QuantRows& args);
void quantRowsAvx2(const QuantRows& args);

// Quantized weights in the row-interleaved layout.
void packedGroupsAvx512(const PackedRows& args);

// Float weights (F32, F16, BF16) against float activations.
void floatRowsPortable(const FloatRows& args);
// Any dequantizable format: a row at a time to float, then dot products (matmul_dequant.cc).
void dequantizedRows(const FloatRows& args);
void floatRowsAvx2(const FloatRows& args);
void floatRowsAvx512(const FloatRows& args);

}  // namespace cleave::cpu::kernels
