// A matrix product whose shapes were fixed at load: a failure is a broken invariant, not
// bad input, so it stops the process.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "common/log.h"
#include "kernels/cpu/matmul.h"

namespace cleave::engine {

inline void checkedMatmul(const cpu::CpuMatrix& w, const float* x, int64_t ldx, int64_t tokens,
                          float* y, int64_t ldy, cpu::ThreadPool& pool) {
  CLEAVE_CHECK_OK(
      cpu::matmul({.weight = &w, .x = x, .ldx = ldx, .tokens = tokens, .y = y, .ldy = ldy}, pool));
}

// Products of one input (a layer's Q, K and V; its gate and up): the activations quantized
// once and one pool job for all (cpu::matmulsOfOneInput).
inline void checkedMatmulsOfOneInput(std::initializer_list<cpu::MatmulArgs> products,
                                     cpu::ThreadPool& pool) {
  CLEAVE_CHECK_OK(cpu::matmulsOfOneInput({products.begin(), products.size()}, pool));
}

}  // namespace cleave::engine
