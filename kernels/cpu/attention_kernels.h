// The SIMD attention kernels behind attention() (attention.h). Internal to
// cleave_kernels_cpu.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace cleave::cpu::kernels {

// Attention of token `t`'s query heads that read KV head `kvh`, all at once
// (attention_group.h), with `scores` room for (heads / kv_heads) x (positions[t] + 1) floats.
// Require head_dim a multiple of 16 (AVX-512) or 8 (AVX2), at most 256.
void attentionGroupAvx512(const AttentionArgs& args, int64_t t, int64_t kvh, float* scores);
void attentionGroupAvx2(const AttentionArgs& args, int64_t t, int64_t kvh, float* scores);

}  // namespace cleave::cpu::kernels
