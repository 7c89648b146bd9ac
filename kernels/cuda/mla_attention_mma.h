// The tensor-core kernel behind mlaAttention() (mla_attention.h) for DeepSeek's latent of
// kv_lora 512 + rope 64. Internal to cleave_kernels_cuda.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "kernels/cuda/mla_attention.h"

namespace cleave::cuda::mla {

inline constexpr int kMmaLora = 512;
inline constexpr int kMmaRope = 64;
inline constexpr int kMmaTile = 32;               // Positions per pipeline stage.
inline constexpr int kMmaMinPart = 4 * kMmaTile;  // The shortest part of a split context.
inline constexpr int kMmaHeads = 16;              // Query heads per block: the MMA's M.

// Lets the kernels use their shared memory (above the 48 KiB default).
absl::Status allowMmaSharedMemory();

// Runs the kernel with each token's context split into up to `partitions` parts (even
// parts of whole stages, at least 4 stages each; a short context uses fewer), then merges
// the parts when there can be more than one; the workspace then holds
// tokens x partitions x heads x (kv_lora + 1) floats.
absl::Status launchMma(const MlaAttentionArgs& args, int partitions, cudaStream_t stream);

}  // namespace cleave::cuda::mla
