// A matrix product whose shapes were fixed at load: a failure is a broken invariant, not
// bad input, so it stops the process.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "common/log.h"
#include "kernels/cpu/matmul.h"

namespace cleave::engine {

inline void checkedMatmul(const cpu::CpuMatrix& w, const float* x, int64_t ldx, int64_t tokens,
                          float* y, int64_t ldy, cpu::ThreadPool& pool) {
  CLEAVE_CHECK_OK(
      cpu::matmul({.weight = &w, .x = x, .ldx = ldx, .tokens = tokens, .y = y, .ldy = ldy}, pool));
}

// One product of checkedMatmulsOfOneInput: its weights and where its rows go.
struct ProductOutput {
  const cpu::CpuMatrix* weight;
  float* y;
  int64_t ldy;
};

// Products of one input x (a layer's Q, K and V; its gate and up): the activations quantized
// once and one pool job for all (cpu::matmulsOfOneInput).
inline void checkedMatmulsOfOneInput(const float* x, int64_t ldx, int64_t tokens,
                                     std::span<const ProductOutput> outputs,
                                     cpu::ThreadPool& pool) {
  std::array<cpu::MatmulArgs, 8> products;  // matmulsOfOneInput's most.
  CLEAVE_CHECK(outputs.size() <= products.size());
  size_t n = 0;
  for (const ProductOutput& o : outputs)
    products[n++] = {
        .weight = o.weight, .x = x, .ldx = ldx, .tokens = tokens, .y = o.y, .ldy = o.ldy};
  CLEAVE_CHECK_OK(cpu::matmulsOfOneInput(std::span(products.data(), n), pool));
}
inline void checkedMatmulsOfOneInput(const float* x, int64_t ldx, int64_t tokens,
                                     std::initializer_list<ProductOutput> outputs,
                                     cpu::ThreadPool& pool) {
  checkedMatmulsOfOneInput(x, ldx, tokens, std::span(outputs.begin(), outputs.size()), pool);
}

}  // namespace cleave::engine
