// Small per-token ops of the model graph. Shapes use [rows, cols] row-major with explicit
// row strides; each function handles `rows` independent rows.
#pragma once

#include <cstdint>

namespace cleave::cpu {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight   (weight: [cols]); y may alias x.
void rmsNorm(const float* x, int64_t ldx, const float* weight, int64_t rows, int64_t cols,
             float eps, float* y, int64_t ldy);

// out[r][i] = silu(gate[r][i]) * up[r][i], silu(v) = v / (1 + e^-v); out may alias gate.
void siluMul(const float* gate, const float* up, int64_t ld_in, int64_t rows, int64_t cols,
             float* out, int64_t ld_out);

// out[r][i] = gelu(gate[r][i]) * up[r][i] with GELU's tanh form, gelu(v) =
// v/2 · (1 + tanh(√(2/π) (v + 0.044715 v³))) (Gemma's gelu_pytorch_tanh); out may alias gate.
void geluTanhMul(const float* gate, const float* up, int64_t ld_in, int64_t rows, int64_t cols,
                 float* out, int64_t ld_out);

// x[i] = cap · tanh(x[i] / cap) for `n` values (Gemma's soft cap of its logits).
void softCap(float* x, int64_t n, float cap);

// x[r] += y[r].
void addInPlace(float* x, int64_t ldx, const float* y, int64_t ldy, int64_t rows, int64_t cols);

// x[r][i] += bias[i] for each of `rows` contiguous rows of `cols`.
void addRowBias(float* x, const float* bias, int64_t rows, int64_t cols);

// In-place softmax over each row's first `cols` values.
void softmax(float* x, int64_t ld, int64_t rows, int64_t cols);

}  // namespace cleave::cpu
